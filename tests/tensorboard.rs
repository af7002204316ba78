//! The event files are read back by the real TensorBoard (its `EventAccumulator`), in a
//! Python virtual environment that this test creates under `target/` on first use.

mod common;

use std::path::Path;
use std::process::Command;

use normrl::config::TrainConfig;
use normrl::logging::video::TENSORBOARD_VIDEO;
use normrl::run::evaluate::first_game_seed;
use normrl::train::Trainer;
use normrl_envs::{make, Env};

/// Every scalar and text tag of a run, as TensorBoard itself reads them.
fn read_with_tensorboard(dir: &Path) -> serde_json::Value {
    read_events(dir, false)
}

/// [`read_with_tensorboard`]; `raw` keeps orphaned events (no purge at restarts).
fn read_events(dir: &Path, raw: bool) -> serde_json::Value {
    let mut command = Command::new(common::python());
    command.arg("scripts/check_tensorboard.py").arg(dir);
    if raw {
        command.arg("--raw");
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn curve(scalars: &serde_json::Value, tag: &str) -> Vec<(u64, f64)> {
    scalars[tag]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect()
}

fn short_run_config(extra: &[&str]) -> TrainConfig {
    let overrides: Vec<String> = [
        "run.total_steps=2000",
        "replay.learning_starts=200",
        "eval.interval=1000",
        "eval.episodes=2",
        "logging.interval=500",
        "logging.layer_stats_interval=1000",
        "logging.progress=false",
        "norm.kind=weight_norm",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    TrainConfig::load(Path::new("configs/cartpole.toml"), &overrides).unwrap()
}

#[test]
fn tensorboard_reads_our_event_files() {
    let config = short_run_config(&[]);
    let dir = std::env::temp_dir().join(format!("normrl-tb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let summary = {
        let mut trainer = Trainer::new(config, &dir).unwrap();
        trainer.run(None).unwrap().unwrap()
    };
    let v = read_with_tensorboard(&dir);
    let scalars = &v["scalars"];
    for tag in [
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/epsilon",
        "losses/td_loss",
        "losses/q_values",
        "eval/episodic_return",
        "layers/fc0/g_mean",
        "layers/fc0/weight_norm_mean",
        "diagnostics/dormant_tau0/fc0",
        "diagnostics/dormant_tau0.1/all",
        "diagnostics/effective_rank",
        "diagnostics/param_norm/head",
        "diagnostics/effective_step/all",
        "diagnostics/q_overestimation",
    ] {
        assert!(
            scalars.get(tag).is_some(),
            "missing tag {tag}: {:?}",
            scalars.as_object().unwrap().keys().collect::<Vec<_>>()
        );
    }
    // Values match what the run reported.
    assert_eq!(
        curve(scalars, "charts/episodic_return"),
        summary.train_curve
    );
    let evals = curve(scalars, "eval/episodic_return");
    assert_eq!(evals.len(), summary.eval_curve.len());
    for (a, b) in evals.iter().zip(&summary.eval_curve) {
        assert_eq!(a.0, b.0);
        assert!((a.1 - b.1).abs() < 1e-3);
    }
    check_diagnostics(scalars, &summary);
    let eps = scalars["charts/epsilon"].as_array().unwrap();
    assert_eq!(eps[0][0], 500);
    // Logged at step 500 with the epsilon used for that step (scheduled at 499).
    assert!((eps[0][1].as_f64().unwrap() - (1.0 - 0.98 * 499.0 / 10_000.0)).abs() < 1e-6);
    let config_text = v["tensors"]["config"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{:?}", v["tensors"]));
    assert!(config_text.contains("weight_norm"));
    // The HParams dashboard's session, decoded with TensorBoard's own protos.
    let start = &v["hparams"]["_hparams_/session_start_info"]["sessionStartInfo"];
    // (protobuf's JSON form writes each `Value` as the plain value)
    assert_eq!(start["hparams"]["norm"], "weight_norm", "{start}");
    assert_eq!(start["hparams"]["batch_size"], 64.0, "{start}");
    // The choices that tell CrossQ from batch renormalization, and BN's modes.
    assert_eq!(
        start["hparams"]["target_update"], "hard(every=500)",
        "{start}"
    );
    assert_eq!(start["hparams"]["joint_forward"], "false", "{start}");
    assert_eq!(start["hparams"]["loss"], "huber", "{start}");
    assert_eq!(start["hparams"]["reward_scale"], "none", "{start}");
    assert_eq!(start["hparams"]["target_bn_mode"], "eval", "{start}");
    let group = start["groupName"].as_str().unwrap();
    assert!(
        group.contains("norm=weight_norm") && !group.contains("seed"),
        "{group}"
    );
    let end = &v["hparams"]["_hparams_/session_end_info"]["sessionEndInfo"];
    assert_eq!(end["status"], "STATUS_SUCCESS", "{end}");
    let _ = std::fs::remove_dir_all(dir);
}

/// With `eval.video = true` each evaluation's first episode is an image summary holding
/// a GIF, which TensorBoard reads back: one a evaluation, at its step, whose first frame
/// is the picture of that episode's first observation.
#[test]
fn evaluation_episodes_are_gifs_in_the_images_tab() {
    let overrides = [
        "run.total_steps=2000",
        "replay.learning_starts=200",
        "eval.interval=1000",
        "eval.episodes=2",
        "eval.video=true",
        "logging.progress=false",
        "checkpoint.replay=false",
    ];
    let config = common::train_config("configs/minatar/breakout.toml", &overrides);
    let dir = std::env::temp_dir().join(format!("normrl-tb-video-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let summary = {
        let mut trainer = Trainer::new(config.clone(), &dir).unwrap();
        trainer.run(None).unwrap().unwrap()
    };
    let v = read_with_tensorboard(&dir);
    let images = v["images"]["eval/episode"]
        .as_array()
        .unwrap_or_else(|| panic!("no eval/episode images: {:?}", v["images"]));
    let steps: Vec<u64> = images.iter().map(|i| i[0].as_u64().unwrap()).collect();
    let eval_steps: Vec<u64> = summary.eval_curve.iter().map(|e| e.0).collect();
    assert_eq!(steps, eval_steps);
    for (index, image) in images.iter().enumerate() {
        let hex = image[3].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert!(bytes.starts_with(b"GIF89a"));
        let frames = common::decode_gif(&bytes);
        let max = TENSORBOARD_VIDEO.max_frames.unwrap();
        assert!((2..=max).contains(&frames.len()), "{} frames", frames.len());
        let mut env = make(&config.env.id).unwrap();
        let mut obs = vec![0.0; env.observation_space().len()];
        let seed = first_game_seed(config.run.seed, index as u64);
        env.reset(Some(seed), &mut obs).unwrap();
        let want = env.render().unwrap().fit(TENSORBOARD_VIDEO.side);
        assert_eq!((want.width, want.height), (80, 80), "a cell 8 pixels");
        assert_eq!(image[1].as_u64(), Some(want.width as u64));
        assert_eq!(image[2].as_u64(), Some(want.height as u64));
        assert!(frames[0].rgb == want.rgb, "evaluation {index}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The diagnostics' curves as the summary keeps them (learning starts at 200: the
/// probe diagnostics at 1000 and 2000; Q overestimation at each evaluation).
fn check_diagnostics(scalars: &serde_json::Value, summary: &normrl::train::RunSummary) {
    for (name, steps) in [
        ("effective_rank", vec![1000, 2000]),
        ("q_overestimation", vec![1000, 2000]),
    ] {
        let logged = curve(scalars, &format!("diagnostics/{name}"));
        let kept = &summary.diagnostics[name];
        assert_eq!(logged.len(), kept.len(), "{name}");
        assert_eq!(
            kept.iter().map(|p| p.0).collect::<Vec<_>>(),
            steps,
            "{name}"
        );
        for (a, b) in logged.iter().zip(kept) {
            assert!(
                a.0 == b.0 && (a.1 - b.1).abs() < 1e-3,
                "{name}: {a:?} {b:?}"
            );
        }
    }
    let rank = summary.diagnostics["effective_rank"][0].1;
    assert!((1.0..=64.0).contains(&rank), "rank {rank} of 64 features");
}

/// A comparison's experiment: its axes with the values its runs take, and the
/// metrics, at the root of its runs; each run's session groups its seeds.
#[test]
fn a_comparison_writes_the_hparams_experiment() {
    let dir = common::fresh_dir("tb-hparams");
    let body = "seeds = 2\n[set]\n\"run.total_steps\" = 400\n\"replay.learning_starts\" = 100\n\"eval.interval\" = 0\n\"eval.episodes\" = 1\n[axes]\nnorm = [\"none\", \"layer_norm\"]\nbatch_size = [4, 8]\n";
    let config = common::cartpole_comparison(&dir, "grid", body);
    let runs = dir.join("runs");
    let status = Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args([
            "compare",
            "--config",
            config.to_str().unwrap(),
            "--jobs",
            "2",
        ])
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let root = read_with_tensorboard(&runs);
    let experiment = &root["hparams"]["_hparams_/experiment"]["experiment"];
    let infos = experiment["hparamInfos"].as_array().unwrap();
    let domain = |name: &str| -> Vec<serde_json::Value> {
        let info = infos.iter().find(|i| i["name"] == name).unwrap();
        info["domainDiscrete"].as_array().unwrap().clone()
    };
    let norms: Vec<String> = domain("norm")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(norms, ["layer_norm", "none"]);
    let sizes: Vec<f64> = domain("batch_size")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(sizes, [4.0, 8.0]);
    let metrics: Vec<&str> = experiment["metricInfos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"]["tag"].as_str().unwrap())
        .collect();
    assert!(metrics.contains(&"eval/episodic_return"), "{metrics:?}");
    // The two seeds of one variant share a group.
    let group_of = |seed: u64| {
        let run = runs.join(format!("classic_cartpole/none-b4/seed-{seed}"));
        let v = read_with_tensorboard(&run);
        v["hparams"]["_hparams_/session_start_info"]["sessionStartInfo"]["groupName"].clone()
    };
    assert_eq!(group_of(1), group_of(2));
    let _ = std::fs::remove_dir_all(dir);
}

/// A run that died after its last checkpoint had already logged further steps; after
/// resuming, TensorBoard shows each step once (the restart marker drops the orphans).
#[test]
fn resumed_run_has_no_duplicated_events() {
    let dir = std::env::temp_dir().join(format!("normrl-tb-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = short_run_config(&["checkpoint.interval=100000"]);
    Trainer::new(config, &dir).unwrap().run(Some(1000)).unwrap();
    let saved = dir.join("checkpoints-at-1000");
    copy_dir(&dir.join("checkpoints"), &saved);
    // Runs on to 1600 and checkpoints there; then "crashes": the 1600 checkpoint is
    // lost, as if the process had died before writing it.
    Trainer::resume(&dir).unwrap().run(Some(1600)).unwrap();
    std::fs::remove_dir_all(dir.join("checkpoints")).unwrap();
    std::fs::rename(&saved, dir.join("checkpoints")).unwrap();
    let summary = Trainer::resume(&dir).unwrap().run(None).unwrap().unwrap();
    // The files themselves are clean: a reader that ignores restart markers (as
    // TensorBoard's Rust data server may) sees each step once too.
    for raw in [false, true] {
        let v = read_events(&dir, raw);
        let returns = curve(&v["scalars"], "charts/episodic_return");
        assert_eq!(returns, summary.train_curve, "raw {raw}");
        let losses = curve(&v["scalars"], "losses/td_loss");
        let steps: Vec<u64> = losses.iter().map(|p| p.0).collect();
        let mut unique = steps.clone();
        unique.dedup();
        assert_eq!(steps, unique, "a step logged twice (raw {raw})");
        assert!(steps.contains(&1500) && steps.contains(&2000), "{steps:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A distributional head logs its value distribution's mean entropy beside the TD
/// loss, at the same steps, between 0 (all mass on one atom) and `ln K` (uniform); a
/// regression loss logs none.
#[test]
fn a_distributional_head_logs_its_value_entropy() {
    // A short run's scalars as TensorBoard reads them.
    let scalars = |config| {
        let dir = std::env::temp_dir().join(format!("normrl-tb-entropy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Trainer::new(config, &dir).unwrap().run(None).unwrap();
        let v = read_with_tensorboard(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        v["scalars"].clone()
    };
    let c51 = ["dqn.loss=c51", "dqn.support={atoms=11,v_min=0,v_max=100}"];
    let logs_entropy = |v: &serde_json::Value| {
        let entropy = curve(v, "losses/value_entropy");
        let losses = curve(v, "losses/td_loss");
        let steps = |c: &[(u64, f64)]| c.iter().map(|p| p.0).collect::<Vec<_>>();
        assert!(!entropy.is_empty());
        assert_eq!(steps(&entropy), steps(&losses));
        let most = (11f64).ln();
        assert!(
            entropy.iter().all(|&(_, h)| h > 0.0 && h <= most + 1e-6),
            "{entropy:?}"
        );
    };
    logs_entropy(&scalars(short_run_config(&c51)));
    // A population's members log theirs as a single run does.
    let population = short_run_config(&[c51[0], c51[1], "run.population=2"]);
    let root = std::env::temp_dir().join(format!("normrl-tb-entropy-p-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let members = normrl::population::population_members(&population, &root);
    normrl::population::train_members(&members, None).unwrap();
    for member in &members {
        logs_entropy(&read_with_tensorboard(&member.dir)["scalars"]);
    }
    let _ = std::fs::remove_dir_all(&root);
    let plain = scalars(short_run_config(&["run.total_steps=800"]));
    // The loss and its support are hyperparameters.
    let hparams = normrl::logging::hparams::of(&short_run_config(&[
        "dqn.loss=c51",
        "dqn.support={atoms=11,v_min=0,v_max=100}",
    ]));
    let loss = format!("{:?}", hparams["loss"]);
    assert!(loss.contains("c51(11 on [0, 100])"), "{loss}");
    assert!(plain.get("losses/value_entropy").is_none());
}
