//! Training runs end to end: determinism, resume, run-directory contents.

use std::path::{Path, PathBuf};

mod common;

use normrl::config::TrainConfig;
use normrl::logging::video::{Video, TENSORBOARD_VIDEO};
use normrl::train::Trainer;

fn small_config(norm: &str) -> TrainConfig {
    let overrides: Vec<String> = [
        format!("norm.kind={norm}"),
        "run.total_steps=3000".into(),
        "replay.learning_starts=500".into(),
        "replay.batch_size=16".into(),
        "replay.sampler={type=\"sequential\"}".into(),
        "eval.interval=1000".into(),
        "eval.episodes=3".into(),
        "checkpoint.interval=1000".into(),
        "logging.progress=false".into(),
        "logging.layer_stats_interval=1000".into(),
        "dqn.target_update={type=\"hard\",every=200}".into(),
    ]
    .to_vec();
    TrainConfig::load(Path::new("configs/cartpole.toml"), &overrides).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn same_seed_same_run_and_resume_equals_uninterrupted() {
    let config = small_config("wn_mean_only_bn");
    let a = temp("run-a");
    let b = temp("run-b");
    let c = temp("run-c");
    let full = Trainer::new(config.clone(), &a)
        .unwrap()
        .run(None)
        .unwrap()
        .unwrap();
    let again = Trainer::new(config.clone(), &b)
        .unwrap()
        .run(None)
        .unwrap()
        .unwrap();
    assert_eq!(full.train_curve, again.train_curve);
    assert_eq!(full.eval_curve, again.eval_curve);
    assert_eq!(
        common::checkpoint_weights(&a),
        common::checkpoint_weights(&b)
    );

    // Stop mid-episode at 1700 steps, resume in a fresh trainer.
    assert!(Trainer::new(config.clone(), &c)
        .unwrap()
        .run(Some(1700))
        .unwrap()
        .is_none());
    // Its config.toml as a version that left keys at their defaults out wrote it: the
    // same run, so it resumes.
    let path = c.join("config.toml");
    let mut older: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for key in ["allow_odd", "population", "cuda_graphs", "tf32"] {
        older["run"].as_table_mut().unwrap().remove(key).unwrap();
    }
    std::fs::write(&path, toml::to_string_pretty(&older).unwrap()).unwrap();
    let resumed = Trainer::resume(&c).unwrap().run(None).unwrap().unwrap();
    assert_eq!(resumed.train_curve, full.train_curve);
    assert_eq!(resumed.eval_curve, full.eval_curve);
    assert_eq!(resumed.updates, full.updates);
    // The diagnostics too: the probe and the parameters awaiting the effective step
    // (measured the update after the checkpoint at 1000) travel in the checkpoint.
    assert_eq!(resumed.diagnostics, full.diagnostics);
    assert_eq!(full.diagnostics["effective_step/all"].len(), 2);
    assert_eq!(full.diagnostics["effective_step/all"][0].0, 1001);
    assert_eq!(
        common::checkpoint_weights(&c),
        common::checkpoint_weights(&a)
    );
    assert!(full.episodes > 10 && full.updates == 2500);

    // The run directory: config, summary, the two newest checkpoints, TensorBoard
    // events, the lock.
    let names: Vec<String> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"config.toml".to_string()));
    assert!(names.contains(&"summary.json".to_string()));
    assert!(names.iter().any(|n| n.starts_with("events.out.tfevents.")));
    assert!(names.contains(&"lock".to_string()));
    let ckpts: Vec<_> = std::fs::read_dir(a.join("checkpoints")).unwrap().collect();
    assert_eq!(ckpts.len(), 3, "two checkpoints and the latest pointer");
    // A finished run refuses to be overwritten.
    let err = Trainer::new(config, &a).err().unwrap().to_string();
    assert!(
        err.contains("holds a finished run") && err.contains("is final"),
        "{err}"
    );
    for d in [a, b, c] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Evaluation `i` is a function of the weights, the run's seed and `i` alone: the same
/// whether the run was resumed since the evaluation before it, evaluated again, or
/// evaluated by `normrl eval` on an environment of its own. MinAtar's sticky action
/// outlives a reset, so an evaluation on the environment the last one left depended on
/// that one; a resumed run, whose environment is new, evaluated otherwise (found in
/// the study's archive: a batch-renorm run resumed between two evaluations trained
/// the same but scored 1.6 at 100k frames where the uninterrupted run scored 1.2).
#[test]
fn an_evaluation_depends_on_its_index_alone() {
    let overrides: Vec<String> = [
        // Sticky half the time, so that the action before an evaluation shows.
        "env.id=\"minatar/breakout?sticky=0.5&minimal_actions=true\"",
        "run.total_steps=3000",
        "replay.learning_starts=300",
        "replay.batch_size=4",
        "eval.interval=500",
        "eval.episodes=2",
        // Actions that change, so that the action an evaluation ends on varies.
        "eval.epsilon=1.0",
        "checkpoint.interval=3000",
        "logging.progress=false",
        "logging.layer_stats_interval=0",
    ]
    .map(String::from)
    .to_vec();
    let config = TrainConfig::load(Path::new("configs/minatar/breakout.toml"), &overrides).unwrap();
    let (a, b) = (temp("eval-index-a"), temp("eval-index-b"));
    let mut trainer = Trainer::new(config.clone(), &a).unwrap();
    let whole = trainer.run(None).unwrap().unwrap();
    // Stopped after the evaluation at 1000 steps, resumed in a fresh trainer.
    let stopped = Trainer::new(config.clone(), &b).unwrap().run(Some(1200));
    assert!(stopped.unwrap().is_none());
    let resumed = Trainer::resume(&b).unwrap().run(None).unwrap().unwrap();
    assert_eq!(resumed.train_curve, whole.train_curve);
    assert_eq!(resumed.eval_curve, whole.eval_curve);
    // The final weights' evaluations, each filmed: again, and on an environment of
    // their own. A film shows any step that went otherwise.
    let film = |eval: &mut dyn FnMut(&mut Video) -> f64| {
        let mut video = Video::new(TENSORBOARD_VIDEO);
        let ret = eval(&mut video);
        (ret, video.finish().unwrap().unwrap().0)
    };
    for index in [3, 1, 3, 0, 5, 2] {
        let own = film(&mut |v| {
            let e = normrl::train::evaluate(trainer.agent(), &config, index, Some(v));
            e.unwrap().mean_return
        });
        let again = film(&mut |v| trainer.evaluate(index, Some(v)).unwrap().mean_return);
        assert!(
            again == own,
            "evaluation {index}: {} against {}",
            again.0,
            own.0
        );
    }
    for d in [a, b] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn every_normalization_trains_without_error() {
    for norm in [
        "none",
        "weight_norm",
        "wn_mean_only_bn",
        "batch_norm",
        "layer_norm",
        "svb",
        "bbn",
    ] {
        let mut config = small_config(norm);
        config.run.total_steps = 1200;
        config.norm.svb_interval = 50;
        config.replay.batch_size = 4;
        let summary = trained(config, &format!("norm-{norm}"));
        assert!(
            summary.final_eval_return.is_finite() && summary.final_eval_return >= 8.0,
            "{norm}"
        );
    }
}

/// A run of `config` to its end in a temporary directory, removed after.
fn trained(config: TrainConfig, name: &str) -> normrl::train::RunSummary {
    let dir = temp(name);
    let summary = Trainer::new(config, &dir).unwrap().run(None).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    summary.expect("a finished run")
}

/// Weight norm's data-dependent init measures an init batch of the replay's
/// observations (`Batch::init_obs`), not the first training batch: over one row every
/// unit's standard deviation is 0 and the gains `1 / (std + eps)` were 1e6 (a MinAtar
/// network's parameter norm 1.4e7 at batch 1, 55 at batch 32). At batch 1 the network
/// now starts as it does at batch 32.
#[test]
fn data_dependent_init_measures_more_than_the_first_batch() {
    let norms = [1, 32].map(|batch| {
        let mut config = small_config("weight_norm");
        config.replay.batch_size = batch;
        config.run.total_steps = 1000;
        let summary = trained(config, &format!("ddi-b{batch}"));
        summary.diagnostics["param_norm/all"][0].1
    });
    eprintln!("parameter norm at step 1000, batch 1 and 32: {norms:?}");
    assert!(
        norms.iter().all(|n| n.is_finite() && *n < 100.0),
        "{norms:?}"
    );
    assert!(
        norms[0] < 2.0 * norms[1],
        "batch 1 {} against batch 32 {}",
        norms[0],
        norms[1]
    );
}
