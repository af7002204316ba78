//! Populations in the trainer (`run.population`): each member's run is the run it
//! would have alone, a killed population resumes every member exactly, and the
//! command line trains and resumes one with the files single runs write.

mod common;

use std::path::{Path, PathBuf};

use normrl::config::TrainConfig;
use normrl::population::{train_members, Member, Population};
use normrl::train::{RunSummary, Trainer};

/// A short run of `config_file` with `norm`: learning from step 500, an update every
/// 4 steps, a checkpoint, layer statistics and diagnostics at 1000.
fn config(config_file: &str, norm: &str, total: u64) -> TrainConfig {
    let method = common::method_sets(norm);
    let overrides: Vec<String> = [
        format!("run.total_steps={total}"),
        "replay.learning_starts=500".into(),
        "replay.train_frequency=4".into(),
        "replay.batch_size=16".into(),
        "eval.interval=1000".into(),
        "eval.episodes=2".into(),
        "checkpoint.interval=1000".into(),
        "logging.progress=false".into(),
        "logging.interval=250".into(),
        "logging.layer_stats_interval=1000".into(),
        "dqn.target_update={type=\"hard\",every=100}".into(),
        "exploration.steps=1000".into(),
    ]
    .into_iter()
    .chain(method)
    .collect();
    TrainConfig::load(Path::new(config_file), &overrides).unwrap()
}

/// The methods whose members are checked against single runs: four presets and the two
/// pairs of parts no preset names (CrossQ with weight norm's layers, weight norm with
/// layer norm).
const METHODS: [&str; 6] = [
    "none",
    "weight_norm",
    "batch_norm",
    "layer_norm",
    "unit_rows+batch_norm",
    "weight_norm+layer_norm",
];

/// Asserts that `n` lines of `out` hold `needle`.
fn assert_lines(out: &str, needle: &str, n: usize) {
    let found = out.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(found, n, "{needle:?} in {out}");
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-pop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Members of seeds 1..=p of `config`, under `root/seed-<s>`.
fn members(config: &TrainConfig, root: &Path, p: u64) -> Vec<Member> {
    (1..=p)
        .map(|seed| {
            let mut c = config.clone();
            c.run.seed = seed;
            Member {
                dir: root.join(format!("seed-{seed}")),
                config: c,
                variant: None,
            }
        })
        .collect()
}

/// A member of a population of three equals a population of one with its seed, bit
/// for bit: episodes, evaluations, diagnostics, final weights. The batched network
/// computes each agent's arithmetic in the same order whatever P, so nothing of the
/// other members (their data, their statistics, their gradients) reaches it.
fn member_equals_population_of_one(config_file: &str, norm: &str) {
    let config = config(config_file, norm, 1500);
    let env = config.env.id.replace('/', "-");
    let (three, one) = (
        temp(&format!("p3-{env}-{norm}")),
        temp(&format!("p1-{env}-{norm}")),
    );
    let together = train_members(&members(&config, &three, 3), None).unwrap();
    let mut c = config.clone();
    c.run.seed = 2;
    let alone = Trainer::new(c, &one.join("seed-2")).unwrap();
    let alone = Population::new(vec![alone]).unwrap().run(None).unwrap();
    let (member, alone) = (together[1].as_ref().unwrap(), alone[0].as_ref().unwrap());
    let what = format!("{config_file} {norm}");
    assert!(member.episodes > 5, "{what}: too few episodes to tell");
    assert_eq!(member.train_curve, alone.train_curve, "{what}");
    assert_eq!(member.eval_curve, alone.eval_curve, "{what}");
    assert_eq!(member.diagnostics, alone.diagnostics, "{what}");
    assert_eq!(
        common::checkpoint_weights(&three.join("seed-2")),
        common::checkpoint_weights(&one.join("seed-2")),
        "{what}"
    );
    let _ = std::fs::remove_dir_all(&three);
    let _ = std::fs::remove_dir_all(&one);
}

/// Each member of a population of two against its seed trained alone, acting at
/// random (epsilon 1) so that both see the same data: the same episodes, evaluations'
/// steps and updates exactly; the same diagnostics bit for bit at step 250, before the
/// first update (the same weights, exported); and after 15 updates (with target syncs),
/// final weights whose distance is at most 1e-2 of how far the weights moved.
/// (Evaluations before the first update are equal too: the same greedy weights.)
///
/// Why 15 updates and that tolerance. Whether each update of a member is the update
/// its agent makes alone is tested from the same state, update by update, in
/// `agents/tests/population.rs`; here the trainer's part is tested: that each member
/// gets its own data, schedule, target syncs and files. The population and a single
/// agent do the same arithmetic in different orders, so their weights part by rounding,
/// about 1e-6 of an update's change, except for the few weights whose gradient is
/// within rounding of 0 (or behind a ReLU input within rounding of its kink), which the
/// optimizer's normalization moves by a different fraction of a step. Over a long
/// trajectory such weights start different trajectories, by amounts that depend on the
/// CPU's kernels (measured: final Q-values 1e-3 apart after 75 updates on an AMD EPYC
/// with AVX2, 1.8e-3 on an Intel Xeon with AVX-512), which no method-independent
/// tolerance bounds. After 15 updates they are a small part of the change's norm; a
/// wrong method (a statistic over the wrong rows, another member's batch, a missed
/// target sync) differs by the change itself.
fn member_equals_single(config_file: &str, norm: &str) {
    member_equals_single_with(config_file, norm, "", |_| {});
}

/// [`member_equals_single`] with `edit` applied to the config (`label` names it in the
/// run directories).
fn member_equals_single_with(
    config_file: &str,
    norm: &str,
    label: &str,
    edit: impl Fn(&mut TrainConfig),
) {
    let config = member_config(config_file, norm, edit);
    // The MLP's and the CNN's tests run at once: directories of their own.
    let env = config.env.id.replace('/', "-");
    let (pop, alone) = (
        temp(&format!("m-{env}-{norm}{label}")),
        temp(&format!("s-{env}-{norm}{label}")),
    );
    let together = train_members(&members(&config, &pop, 2), None).unwrap();
    for (i, seed) in [1u64, 2].into_iter().enumerate() {
        let mut c = config.clone();
        c.run.seed = seed;
        let dir = alone.join(format!("seed-{seed}"));
        let single = Trainer::new(c.clone(), &dir)
            .unwrap()
            .run(None)
            .unwrap()
            .unwrap();
        let member = together[i].as_ref().expect("a finished member");
        let what = format!("{config_file} {norm} seed {seed}");
        assert!(single.episodes > 3, "{what}: too few episodes to tell");
        assert_eq!(member.train_curve, single.train_curve, "{what}");
        assert_eq!(member.updates, single.updates, "{what}");
        assert_eq!(single.updates, 15, "{what}");
        let steps = |s: &RunSummary| s.eval_curve.iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(steps(member), steps(&single), "{what}");
        let early = |s: &RunSummary| {
            s.eval_curve
                .iter()
                .filter(|e| e.0 < 500)
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(early(member), early(&single), "{what}");
        assert_same_diagnostics_before_updates(member, &single, &what);
        let member_dir = pop.join(format!("seed-{seed}"));
        let start = initial_weights(&c, &alone.join(format!("start-{seed}")));
        let (w_member, w_single) = (
            common::checkpoint_weights(&member_dir),
            common::checkpoint_weights(&dir),
        );
        let (apart, moved) = (distance(&w_member, &w_single), distance(&w_single, &start));
        eprintln!("{what}: final weights {apart:e} apart, {moved:e} from the start");
        assert!(
            apart <= 1e-2 * moved,
            "{what}: {apart:e} apart, moved {moved:e}"
        );
        for file in ["summary.json", "result.json", "config.toml"] {
            assert!(member_dir.join(file).exists(), "{what}: no {file}");
        }
    }
    let _ = std::fs::remove_dir_all(&pop);
    let _ = std::fs::remove_dir_all(&alone);
}

/// The config of [`member_equals_single_with`]: 560 steps acting at random, 15 updates.
fn member_config(config_file: &str, norm: &str, edit: impl Fn(&mut TrainConfig)) -> TrainConfig {
    let mut config = config(config_file, norm, 560);
    config.exploration.start = 1.0;
    config.exploration.end = 1.0;
    config.run.allow_odd = true;
    config.eval.interval = 250;
    config.checkpoint.interval = 250;
    config.logging.layer_stats_interval = 250;
    config.dqn.target_update = normrl_agents::dqn::TargetUpdate::Hard { every: 24 };
    edit(&mut config);
    config
}

/// The members of seeds 1..=p of `config` under `root`, started as one population.
fn population_of(config: &TrainConfig, root: &Path, p: u64) -> Population {
    let trainers = members(config, root, p)
        .into_iter()
        .map(|m| Trainer::new(m.config, &m.dir).unwrap())
        .collect();
    Population::new(trainers).unwrap()
}

/// The online weights `config`'s agent starts with: a run of `config` that stops
/// before its first update, in `dir`.
fn initial_weights(config: &TrainConfig, dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut c = config.clone();
    c.run.total_steps = c.replay.learning_starts;
    c.checkpoint.interval = c.run.total_steps;
    let summary = Trainer::new(c, dir).unwrap().run(None).unwrap().unwrap();
    assert_eq!(summary.updates, 0);
    common::checkpoint_weights(dir)
}

/// `||a - b||_2` over every variable of two checkpoints' weights.
fn distance(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    let mut squares = 0f64;
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other);
        squares += x
            .iter()
            .zip(y)
            .map(|(p, q)| f64::from(p - q).powi(2))
            .sum::<f64>();
    }
    squares.sqrt()
}

/// The same diagnostics at the same steps, with the same values (bit for bit) at steps
/// before the first update, where member and single agent hold the same weights.
fn assert_same_diagnostics_before_updates(a: &RunSummary, b: &RunSummary, what: &str) {
    assert_eq!(
        a.diagnostics.keys().collect::<Vec<_>>(),
        b.diagnostics.keys().collect::<Vec<_>>(),
        "{what}"
    );
    assert!(!a.diagnostics.is_empty(), "{what}: no diagnostics ran");
    for (name, curve) in &a.diagnostics {
        let other = &b.diagnostics[name];
        assert_eq!(curve.len(), other.len(), "{what} {name}");
        for ((s, x), (t, y)) in curve.iter().zip(other) {
            assert_eq!(s, t, "{what} {name}");
            if *s < 500 {
                assert_eq!(x, y, "{what} {name} at step {s}");
            }
        }
    }
}

#[test]
fn members_train_as_they_would_alone_on_an_mlp() {
    for norm in METHODS {
        member_equals_single("configs/cartpole.toml", norm);
        member_equals_population_of_one("configs/cartpole.toml", norm);
    }
}

/// A population's members scale their batches' rewards each by its own running return,
/// as they would alone (`dqn.reward_scale`, SimbaV2's and XQC's): a member that did
/// not, or took another member's scale, moves by a different step.
#[test]
fn members_scale_rewards_as_they_would_alone() {
    use normrl_agents::dqn::{RewardScale, ValueLoss};
    for scale in [RewardScale::RunningReturn, RewardScale::ReturnStd] {
        // MSE, whose gradient scales with the TD error: Huber's is ±1 at the errors of
        // the first updates, whatever the scale.
        let edit = |c: &mut TrainConfig| {
            c.dqn.reward_scale = scale;
            c.dqn.loss = ValueLoss::Mse;
        };
        // The scale must move a run beyond the comparison's tolerance, or a member
        // that ignored it would pass.
        let scaled = member_config("configs/cartpole.toml", "none", edit);
        let mut plain = scaled.clone();
        plain.dqn.reward_scale = RewardScale::None;
        let root = temp(&format!("scale-{scale:?}"));
        let weights = |c: &TrainConfig, name: &str| {
            let dir = root.join(name);
            Trainer::new(c.clone(), &dir).unwrap().run(None).unwrap();
            common::checkpoint_weights(&dir)
        };
        let (a, b) = (weights(&scaled, "scaled"), weights(&plain, "plain"));
        let start = initial_weights(&scaled, &root.join("start"));
        let (apart, moved) = (distance(&a, &b), distance(&a, &start));
        eprintln!("{scale:?}: scaled and unscaled runs {apart:e} apart, moved {moved:e}");
        assert!(
            apart > 0.05 * moved,
            "{scale:?}: {apart:e} apart, moved {moved:e}"
        );
        let _ = std::fs::remove_dir_all(&root);
        member_equals_single_with(
            "configs/cartpole.toml",
            "none",
            &format!("-{scale:?}"),
            edit,
        );
    }
}

/// A population's distributional losses (C51, HL-Gauss; Double DQN's chooser with
/// C51): each member's targets and loss are its own, as alone, on the MLP and the CNN.
#[test]
fn distributional_members_train_as_they_would_alone() {
    use normrl_agents::dqn::ValueLoss;
    let cases = [
        ("configs/cartpole.toml", ValueLoss::C51, false, 100.0),
        ("configs/cartpole.toml", ValueLoss::HlGauss, false, 100.0),
        ("configs/cartpole.toml", ValueLoss::C51, true, 100.0),
        ("configs/minatar/breakout.toml", ValueLoss::C51, false, 10.0),
        (
            "configs/minatar/breakout.toml",
            ValueLoss::HlGauss,
            true,
            10.0,
        ),
    ];
    for (file, loss, double, v_max) in cases {
        let label = format!("-{loss:?}-{double}");
        member_equals_single_with(file, "batch_norm", &label, |c| {
            c.dqn.loss = loss;
            c.dqn.double_dqn = double;
            c.dqn.support.v_min = 0.0;
            c.dqn.support.v_max = v_max;
        });
    }
    // The joint forward of observations and next observations without a target
    // network, C51 on unit rows with batch norm.
    member_equals_single_with(
        "configs/cartpole.toml",
        "unit_rows+batch_norm",
        "-joint",
        |c| {
            c.dqn.loss = ValueLoss::C51;
            c.dqn.joint_forward = true;
            c.dqn.target_update = normrl_agents::dqn::TargetUpdate::None;
            c.dqn.support.v_min = 0.0;
            c.dqn.support.v_max = 100.0;
        },
    );
}

/// The 2025 presets in a population: CrossQ with weight norm (the joint forward with a
/// Polyak target, a regression loss), XQC (the same with the head's rows projected, C51
/// and rewards scaled by the return's spread) and SimbaV2 (hyperspherical layers, C51,
/// the running return's scale). Each member trains as it would alone.
#[test]
fn preset_members_train_as_they_would_alone() {
    for preset in ["crossq_wn", "xqc", "simbav2"] {
        let sets = [format!("preset=\"{preset}\"")];
        let with_preset = TrainConfig::load(Path::new("configs/cartpole.toml"), &sets).unwrap();
        let label = format!("-{preset}");
        member_equals_single_with("configs/cartpole.toml", "none", &label, |c| {
            c.norm = with_preset.norm.clone();
            c.dqn = with_preset.dqn.clone();
        });
    }
}

#[test]
fn members_train_as_they_would_alone_on_minatar_cnn() {
    for norm in METHODS {
        member_equals_single("configs/minatar/breakout.toml", norm);
        member_equals_population_of_one("configs/minatar/breakout.toml", norm);
    }
    // Batch 4, where the dense layer's forward takes the few-rows kernel (on AVX-512),
    // and weight norm at batch 1, whose data-dependent init measures the trainer's init
    // batch (`Batch::init_obs`), in the population as alone.
    for (norm, batch) in [("batch_norm", 4), ("weight_norm", 4), ("weight_norm", 1)] {
        let edit = |c: &mut TrainConfig| c.replay.batch_size = batch;
        let label = format!("-b{batch}");
        member_equals_single_with("configs/minatar/breakout.toml", norm, &label, edit);
    }
}

/// Copies a directory tree.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_tree(&entry.path(), &target),
            false => {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
}

/// A population stopped at 1700 steps and started again equals the uninterrupted one
/// bit for bit; so does one killed between its members' checkpoint writes (member 1
/// has written step 1000 only, member 0 steps 1000 and 1700): both resume at 1000.
#[test]
fn a_killed_population_resumes_all_its_members_exactly() {
    let config = config("configs/cartpole.toml", "weight_norm", 2500);
    let whole = temp("whole");
    let full = train_members(&members(&config, &whole, 2), None).unwrap();
    let full: Vec<RunSummary> = full.into_iter().map(Option::unwrap).collect();

    let (stopped, torn) = (temp("stopped"), temp("torn"));
    let runs = members(&config, &stopped, 2);
    let early = train_members(&runs, Some(1000)).unwrap();
    assert!(early.iter().all(Option::is_none), "stopped early");
    copy_tree(&stopped, &torn);
    assert!(train_members(&runs, Some(1700)).unwrap()[0].is_none());
    // The torn copy: member 0 wrote 1700 (keeping 1000, as the first phase does),
    // member 1 did not get to.
    copy_tree(
        &stopped.join("seed-1/checkpoints"),
        &torn.join("seed-1/checkpoints"),
    );
    // A member left alone: the other finished (here: the uninterrupted run's), it
    // stopped at 1700. It resumes as a population of one, on the arithmetic it started
    // on; as a single run (weight norm's host kernels) its weights parted by rounding.
    let lone = temp("lone");
    copy_tree(&stopped, &lone);
    std::fs::remove_dir_all(lone.join("seed-1")).unwrap();
    copy_tree(&whole.join("seed-1"), &lone.join("seed-1"));
    let resumed = train_members(&members(&config, &lone, 2), None).unwrap();
    let r = resumed[1].as_ref().unwrap();
    assert_eq!(
        (&r.train_curve, &r.eval_curve),
        (&full[1].train_curve, &full[1].eval_curve)
    );
    assert_eq!(
        common::checkpoint_weights(&lone.join("seed-2")),
        common::checkpoint_weights(&whole.join("seed-2"))
    );
    for root in [&stopped, &torn] {
        let resumed = train_members(&members(&config, root, 2), None).unwrap();
        for (r, f) in resumed.iter().zip(&full) {
            let r = r.as_ref().unwrap();
            assert_eq!(r.train_curve, f.train_curve, "{}", root.display());
            assert_eq!(r.eval_curve, f.eval_curve, "{}", root.display());
            assert_eq!(r.updates, f.updates);
            assert_eq!(r.diagnostics, f.diagnostics, "{}", root.display());
        }
        for seed in [1, 2] {
            let run = |r: &Path| r.join(format!("seed-{seed}"));
            assert_eq!(
                common::checkpoint_weights(&run(root)),
                common::checkpoint_weights(&run(&whole))
            );
            // Pruned to the two newest (`checkpoint.keep = "last_two"`) once every
            // member wrote the final one.
            let left = std::fs::read_dir(run(root).join("checkpoints")).unwrap();
            let steps = left
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("step-"));
            assert_eq!(steps.count(), 2, "{}", root.display());
        }
    }
    // A finished population is final: nothing trains or is rewritten.
    let before = std::fs::read(whole.join("seed-1/summary.json")).unwrap();
    let again = train_members(&members(&config, &whole, 2), None).unwrap();
    assert_eq!(again[0].as_ref().unwrap().train_curve, full[0].train_curve);
    assert_eq!(
        std::fs::read(whole.join("seed-1/summary.json")).unwrap(),
        before
    );
    for dir in [whole, stopped, torn, lone] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A population with XQC's preset (C51, the joint forward with a Polyak target,
/// rewards divided by each member's running return spread, which its checkpoint keeps)
/// stopped and resumed trains as it would uninterrupted, bit for bit.
#[test]
fn a_distributional_population_resumes_exactly() {
    let sets = ["preset=\"xqc\"".to_string()];
    let xqc = TrainConfig::load(Path::new("configs/cartpole.toml"), &sets).unwrap();
    let mut config = config("configs/cartpole.toml", "none", 2500);
    (config.norm, config.dqn) = (xqc.norm, xqc.dqn);
    let (whole, stopped) = (temp("xqc-whole"), temp("xqc-stopped"));
    let full = train_members(&members(&config, &whole, 2), None).unwrap();
    let runs = members(&config, &stopped, 2);
    assert!(train_members(&runs, Some(1000)).unwrap()[0].is_none());
    let resumed = train_members(&runs, None).unwrap();
    for (seed, (r, f)) in [1, 2].into_iter().zip(resumed.iter().zip(&full)) {
        let (r, f) = (r.as_ref().unwrap(), f.as_ref().unwrap());
        assert!(r.updates > 100, "{}", r.updates);
        assert_eq!(r.train_curve, f.train_curve);
        assert_eq!(r.eval_curve, f.eval_curve);
        let run = |root: &Path| root.join(format!("seed-{seed}"));
        assert_eq!(
            common::checkpoint_weights(&run(&stopped)),
            common::checkpoint_weights(&run(&whole))
        );
    }
    for dir in [whole, stopped] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `normrl train` with `run.population = 3` writes three single runs' directories,
/// and `--resume` on the population's directory finishes what is left.
#[test]
fn the_command_line_trains_and_resumes_a_population() {
    let dir = temp("cli");
    let dir_s = dir.to_str().unwrap();
    let (code, out, err) = common::normrl(&[
        "train",
        "--config",
        "configs/cartpole.toml",
        "--set",
        "run.population=3",
        "--set",
        "run.total_steps=1200",
        "--set",
        "replay.learning_starts=500",
        "--set",
        "logging.progress=false",
        "--run-dir",
        dir_s,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_lines(&out, "1200 steps", 3);
    for seed in [1, 2, 3] {
        let member = dir.join(format!("seed-{seed}"));
        for file in ["summary.json", "result.json", "config.toml"] {
            assert!(member.join(file).exists(), "seed {seed}: no {file}");
        }
        let config = std::fs::read_to_string(member.join("config.toml")).unwrap();
        assert!(config.contains(&format!("seed = {seed}")), "{config}");
        // The resolved config writes every key, so a member says it is a single run.
        assert!(
            config.lines().any(|l| l.trim() == "population = 1"),
            "a member is a single run: {config}"
        );
        assert!(!config.contains("population = 3"), "{config}");
    }
    // A second start into the same directory is refused; a resume has nothing to do.
    let (code, _, err) = common::normrl(&[
        "train",
        "--config",
        "configs/cartpole.toml",
        "--set",
        "run.population=3",
        "--run-dir",
        dir_s,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("already holds a population"), "{err}");
    // Neither kind starts in the other's directory: a single run at the population's
    // root would replace its config.toml (a resume would then train one agent), and a
    // population in a single run's directory would write its own over the run's.
    let root_config = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    let single = [
        "train",
        "--config",
        "configs/cartpole.toml",
        "--run-dir",
        dir_s,
    ];
    let (code, _, err) = common::normrl(&single);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("holds a population (run.population > 1)"),
        "{err}"
    );
    let member = dir.join("seed-1");
    let member_config = std::fs::read_to_string(member.join("config.toml")).unwrap();
    let (code, _, err) = common::normrl(&[
        "train",
        "--config",
        "configs/cartpole.toml",
        "--set",
        "run.population=2",
        "--run-dir",
        member.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds a single run"), "{err}");
    assert!(!member.join("seed-2").exists(), "nothing written");
    for (path, before) in [
        (dir.join("config.toml"), root_config),
        (member.join("config.toml"), member_config),
    ] {
        assert_eq!(std::fs::read_to_string(path).unwrap(), before);
    }
    let (code, out, err) = common::normrl(&["train", "--resume", dir_s]);
    assert_eq!(code, 0, "{err}");
    assert_lines(&out, "1200 steps", 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run.population = 0` is refused before anything is written, naming the key (exit
/// status 2); every method trains as a population (SVB and BBN too), so a population of
/// SVB agents trains.
#[test]
fn a_population_of_zero_is_refused_and_every_method_trains() {
    let dir = temp("refused");
    let run = |sets: &[&str]| {
        let mut args = vec!["train", "--config", "configs/cartpole.toml"];
        for set in sets {
            args.extend(["--set", set]);
        }
        args.extend(["--run-dir", dir.to_str().unwrap()]);
        common::normrl(&args)
    };
    // 10^17 members overflowed the list of members made before the memory check.
    for size in ["0", "100000000000000000"] {
        let (code, _, err) = run(&[&format!("run.population={size}")]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("run.population must be a positive integer up to 65536"),
            "{size}: {err}"
        );
        assert!(!dir.exists(), "{size}: something was written");
    }
    let svb = [
        "run.population=2",
        "norm.kind=bbn",
        "run.total_steps=800",
        "replay.learning_starts=500",
    ];
    let (code, out, err) = run(&svb);
    assert_eq!(code, 0, "{err}");
    assert_lines(&out, "bbn seed", 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM to a training population: every member checkpoints at the same step and
/// the program exits 75; `--resume` then finishes every member as the uninterrupted
/// population does, bit for bit.
#[test]
fn a_signalled_population_checkpoints_every_member_and_resumes() {
    let (dir, whole) = (temp("signal"), temp("signal-whole"));
    let args = |run_dir: &Path| -> Vec<String> {
        let sets = [
            "run.population=2",
            "run.total_steps=12000",
            "logging.progress=false",
            "logging.interval=100",
        ];
        let mut args = vec!["train", "--config", "configs/cartpole.toml"];
        args.extend(sets.iter().flat_map(|s| ["--set", s]));
        args.extend(["--run-dir", run_dir.to_str().unwrap()]);
        args.into_iter().map(String::from).collect()
    };
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args(args(&dir))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = common::Started(Some(child));
    let pid = started.id();
    let beating = |seed: u32| dir.join(format!("seed-{seed}/heartbeat")).exists();
    let t = std::time::Instant::now();
    while !(beating(1) && beating(2)) && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(beating(1) && beating(2), "the members never beat");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = started.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("SIGTERM at step"), "{err}");
    let latest = |seed: u32| {
        let pointer = dir.join(format!("seed-{seed}/checkpoints/latest"));
        std::fs::read_to_string(pointer).unwrap()
    };
    assert_eq!(
        latest(1),
        latest(2),
        "the members stopped at different steps"
    );
    assert!(
        !beating(1) && !beating(2),
        "an interrupted member still beats"
    );
    let counts = |what: &str| status_count(&dir, what);
    assert_eq!(counts("interrupted"), 2, "normrl status of the population");
    let (code, _, err) = common::normrl(&["train", "--resume", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(counts("done"), 2, "normrl status of the population");
    let whole_args = args(&whole);
    let whole_args: Vec<&str> = whole_args.iter().map(String::as_str).collect();
    let (code, _, err) = common::normrl(&whole_args);
    assert_eq!(code, 0, "{err}");
    for seed in [1, 2] {
        let summary = |root: &Path| {
            let dir = root.join(format!("seed-{seed}"));
            normrl::train::finished_summary(&dir).unwrap().unwrap()
        };
        let (resumed, uninterrupted) = (summary(&dir), summary(&whole));
        assert_eq!(
            resumed.train_curve, uninterrupted.train_curve,
            "seed {seed}"
        );
        assert_eq!(resumed.eval_curve, uninterrupted.eval_curve, "seed {seed}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&whole);
}

/// Runs that differ in seed, exploration, gamma or learning rate share a population's
/// key (those are per-agent values); a different batch size or method does not.
#[test]
fn the_population_key_leaves_out_exactly_the_per_agent_values() {
    let base = config("configs/cartpole.toml", "none", 1000);
    let key = normrl::population::population_key(&base);
    let mut same = base.clone();
    same.run.seed = 9;
    same.exploration.end = 0.3;
    same.dqn.gamma = 0.9;
    same.optimizer.lr = 1e-4;
    assert_eq!(normrl::population::population_key(&same), key);
    let mut batch = base.clone();
    batch.replay.batch_size = 4;
    let mut double = base.clone();
    double.dqn.double_dqn = !double.dqn.double_dqn;
    for other in [batch, double] {
        assert_ne!(normrl::population::population_key(&other), key);
    }
}

/// A member that diverges ends as a single run does (its summary says where), and the
/// others train on to the end, untouched: a learning-rate sweep whose largest rate
/// (1e30) cannot stay finite, beside a member that equals its population of one.
#[test]
fn a_diverging_member_ends_alone_and_the_others_train_on() {
    let config = config("configs/cartpole.toml", "none", 1500);
    let (sweep, one) = (temp("diverge"), temp("diverge-one"));
    let mut runs = members(&config, &sweep, 2);
    runs[1].config.optimizer.lr = 1e30;
    let summaries = train_members(&runs, None).unwrap();
    let healthy = summaries[0].as_ref().unwrap();
    let diverged = summaries[1].as_ref().unwrap();
    let what = diverged
        .diverged
        .as_ref()
        .expect("the 1e30 member diverged");
    assert!(what.step < 1500, "{what:?}");
    assert!(diverged.steps < 1500);
    assert!(healthy.diverged.is_none());
    assert_eq!(healthy.steps, 1500);
    let alone = Trainer::new(runs[0].config.clone(), &one.join("seed-1")).unwrap();
    let alone = Population::new(vec![alone]).unwrap().run(None).unwrap();
    let alone = alone[0].as_ref().unwrap();
    assert_eq!(healthy.train_curve, alone.train_curve);
    assert_eq!(healthy.eval_curve, alone.eval_curve);
    // The diverged member's files are a diverged single run's: a summary, no resume.
    let dir = sweep.join("seed-2");
    let saved = normrl::train::finished_summary(&dir).unwrap().unwrap();
    assert_eq!(saved.diverged.as_ref(), Some(what));
    let _ = std::fs::remove_dir_all(&sweep);
    let _ = std::fs::remove_dir_all(&one);
}

/// With `run.threads = 2` the members' environments step on two threads: every member's
/// run is the one it has on one thread (episodes and evaluations, bit for bit), five
/// members in chunks of three and two. Left to decide, a CartPole population does not
/// take threads: its members' work is too little to share.
#[test]
fn members_step_on_threads_without_changing_a_run() {
    let mut config = config("configs/cartpole.toml", "weight_norm", 1000);
    let (one, two) = (temp("threads-1"), temp("threads-2"));
    let single_thread = train_members(&members(&config, &one, 5), None).unwrap();
    config.run.threads = 2;
    let mut population = population_of(&config, &two, 5).always_threaded();
    assert!(population.steps_on_threads());
    let threaded = population.run(None).unwrap();
    for (a, b) in single_thread.iter().zip(&threaded) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert!(a.episodes > 5);
        assert_eq!(a.train_curve, b.train_curve, "seed {}", a.seed);
        assert_eq!(a.eval_curve, b.eval_curve, "seed {}", a.seed);
    }
    let _ = std::fs::remove_dir_all(&two);
    let mut population = population_of(&config, &two, 5);
    population.run(Some(100)).unwrap();
    assert!(
        !population.steps_on_threads(),
        "CartPole's members took threads"
    );
    let _ = std::fs::remove_dir_all(&one);
    let _ = std::fs::remove_dir_all(&two);
}

/// A MinAtar population's shards (one agent each on the CPU) update on the run's two
/// threads: every member's run and checkpoint equal the one-thread run's, bit for bit.
#[test]
fn shards_update_on_threads_without_changing_a_run() {
    let mut config = config("configs/minatar/breakout.toml", "weight_norm", 1000);
    let run = |name: &str, config: &TrainConfig| {
        let root = temp(name);
        let summaries = population_of(config, &root, 3).run(None).unwrap();
        (root, summaries)
    };
    let (one, on_one) = run("shards-1", &config);
    config.run.threads = 2;
    let (two, on_two) = run("shards-2", &config);
    for (a, b) in on_one.iter().zip(&on_two) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert!(a.updates > 100);
        assert_eq!(a.train_curve, b.train_curve);
        assert_eq!(a.eval_curve, b.eval_curve);
    }
    for seed in [1, 2, 3] {
        let run = |root: &Path| common::checkpoint_weights(&root.join(format!("seed-{seed}")));
        assert_eq!(run(&one), run(&two), "seed {seed}");
    }
    let _ = std::fs::remove_dir_all(&one);
    let _ = std::fs::remove_dir_all(&two);
}

/// MinAtar's frames mirrored on the device (forced on the CPU here; automatic on an
/// accelerator) give every member the run the host replay gives, bit for bit; its
/// batches are gathered there by the slots the host drew. CartPole's frames of floats
/// stay on the host.
#[test]
fn frames_on_the_device_change_nothing_in_a_run() {
    let config = config("configs/minatar/breakout.toml", "batch_norm", 1000);
    let run = |name: &str, on_device: bool| {
        let root = temp(name);
        let population = population_of(&config, &root, 2);
        let mut population = population.with_device_frames(on_device).unwrap();
        assert_eq!(population.frames_on_device(), on_device);
        let summaries = population.run(None).unwrap();
        (root, summaries)
    };
    let (host, on_host) = run("frames-host", false);
    let (device, on_device) = run("frames-device", true);
    for (a, b) in on_host.iter().zip(&on_device) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert!(a.updates > 100);
        assert_eq!(a.train_curve, b.train_curve);
        assert_eq!(a.eval_curve, b.eval_curve);
        assert_eq!(a.diagnostics, b.diagnostics);
    }
    for seed in [1, 2] {
        let run = |root: &Path| common::checkpoint_weights(&root.join(format!("seed-{seed}")));
        assert_eq!(run(&host), run(&device));
    }
    let cartpole = config_for_cartpole_frames();
    assert!(!cartpole, "CartPole's float frames were mirrored");
    let _ = std::fs::remove_dir_all(&host);
    let _ = std::fs::remove_dir_all(&device);
}

/// Whether a CartPole population mirrors its frames when asked (it must not).
fn config_for_cartpole_frames() -> bool {
    let config = config("configs/cartpole.toml", "none", 1000);
    let root = temp("frames-cartpole");
    let population = population_of(&config, &root, 2);
    let mirrored = population
        .with_device_frames(true)
        .unwrap()
        .frames_on_device();
    let _ = std::fs::remove_dir_all(&root);
    mirrored
}

/// `normrl status DIR --json`'s count of `what` (done, interrupted, ...) for the
/// variant `none`.
fn status_count(dir: &Path, what: &str) -> u64 {
    let (code, out, err) = common::normrl(&["status", dir.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    status["variants"]["none"][what].as_u64().unwrap()
}
