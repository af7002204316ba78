//! Methods as parts (`norm.weight` x `norm.activation`): a preset and its two parts
//! spelled out are one run bit for bit; pairs no preset names train from the command
//! line, as a population and as axes of a comparison; pairs that cannot train, and a
//! preset contradicted by a part, are refused with exit 2 and nothing written.

mod common;

use std::path::Path;

use common::method_sets;
use normrl::config::TrainConfig;
use normrl::train::Trainer;
use normrl_agents::nn::{NormKind, COMBINATIONS};

fn short(config_file: &str, method: &[String]) -> TrainConfig {
    let mut sets: Vec<String> = method.to_vec();
    sets.extend(
        [
            "run.total_steps=1500",
            "replay.learning_starts=300",
            "replay.batch_size=8",
            "eval.interval=500",
            "eval.episodes=2",
            "checkpoint.interval=1500",
            "logging.progress=false",
            "logging.layer_stats_interval=500",
            "dqn.target_update={type=\"hard\",every=100}",
        ]
        .map(String::from),
    );
    TrainConfig::load(Path::new(config_file), &sets).unwrap()
}

/// Each preset read from `norm.kind` and from its two parts is the same config, and
/// writes the same `config.toml` (naming the preset); a run of three of them (one
/// with a weight rule and an activation both, BBN's and NaP's) trains to the same
/// curves and weights either way, on an MLP and the MinAtar CNN.
#[test]
fn a_preset_and_its_parts_spelled_out_train_the_same_run() {
    for kind in NormKind::ALL {
        let (w, a) = kind.parts();
        let parts = method_sets(&format!("{w}+{a}"));
        let by_kind = short("configs/cartpole.toml", &method_sets(kind.name()));
        let by_parts = short("configs/cartpole.toml", &parts);
        assert_eq!(by_kind, by_parts, "{kind}");
        assert_eq!(by_parts.norm.name(), kind.name());
        assert!(by_parts.to_toml().contains(&format!("kind = \"{kind}\"")));
    }
    let cases = [
        ("configs/cartpole.toml", NormKind::WnMeanOnlyBn),
        ("configs/cartpole.toml", NormKind::Bbn),
        ("configs/minatar/breakout.toml", NormKind::Nap),
    ];
    for (file, kind) in cases {
        let (w, a) = kind.parts();
        let dir = common::fresh_dir(&format!("preset-{kind}"));
        let mut summaries = vec![];
        for (name, sets) in [
            ("kind", method_sets(kind.name())),
            ("parts", method_sets(&format!("{w}+{a}"))),
        ] {
            let run = dir.join(name);
            let summary = Trainer::new(short(file, &sets), &run)
                .unwrap()
                .run(None)
                .unwrap()
                .unwrap();
            summaries.push((summary, common::checkpoint_weights(&run)));
        }
        let (by_kind, by_parts) = (&summaries[0], &summaries[1]);
        assert_eq!(by_kind.0.eval_curve, by_parts.0.eval_curve, "{kind}");
        assert_eq!(by_kind.0.train_curve, by_parts.0.train_curve, "{kind}");
        assert_eq!(by_kind.1, by_parts.1, "{kind}: the checkpoints' weights");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The pairs of 2025's methods (unit rows with batch norm, weight norm with layer norm)
/// train from the command line on CartPole and MinAtar Breakout, alone and as a
/// population, under their parts' name; their resolved configs name no preset and read
/// back as the same config.
#[test]
fn pairs_no_preset_names_train_from_the_command_line() {
    let dir = common::fresh_dir("pairs");
    for (weight, activation) in COMBINATIONS {
        let name = format!("{weight}+{activation}");
        for (file, population) in [
            ("configs/cartpole.toml", "1"),
            ("configs/minatar/breakout.toml", "1"),
            ("configs/minatar/breakout.toml", "2"),
        ] {
            let run = dir.join(format!("{weight}-{activation}-{population}-{}", file.len()));
            let mut args = vec!["train".to_string(), "--config".into(), file.into()];
            for set in method_sets(&name).into_iter().chain([
                format!("run.population={population}"),
                "run.total_steps=1200".into(),
                "replay.learning_starts=400".into(),
                "replay.batch_size=8".into(),
                "eval.interval=600".into(),
                "eval.episodes=1".into(),
            ]) {
                args.extend(["--set".into(), set]);
            }
            args.extend(["--run-dir".into(), run.to_str().unwrap().into()]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, out, err) = common::normrl(&args);
            assert_eq!(code, 0, "{name} on {file}: {err}");
            let seeds = population.parse::<usize>().unwrap();
            let lines = out
                .lines()
                .filter(|l| l.contains(&format!("{name} seed")))
                .count();
            assert_eq!(lines, seeds, "{name} on {file}: {out}");
            let config_file = match population {
                "1" => run.join("config.toml"),
                _ => run.join("seed-2/config.toml"),
            };
            let text = std::fs::read_to_string(&config_file).unwrap();
            assert!(text.contains(&format!("weight = \"{weight}\"")), "{text}");
            assert!(
                text.contains(&format!("activation = \"{activation}\"")),
                "{text}"
            );
            assert!(!text.contains("[norm]\nkind"), "{text}");
            let again = TrainConfig::from_toml_str(&text, &[]).unwrap();
            assert_eq!(again.to_toml(), text);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid with `norm.weight` (by its short name, `weight`) and `norm.activation` as
/// axes trains every pair of its values (its plan naming each method by its preset or
/// its parts), labels each run by both, and reports them.
#[test]
fn the_two_parts_are_axes_of_a_comparison() {
    let dir = common::fresh_dir("parts-grid");
    let body = format!(
        "seeds = [1]\n[set]\n{}\"run.total_steps\" = 1000\n[axes]\nweight = [\"plain\", \"unit_rows\"]\n\"norm.activation\" = [\"batch_norm\", \"layer_norm\"]\n",
        common::SHORT_RUNS
    );
    let config = common::cartpole_comparison(&dir, "parts", &body);
    let runs = dir.join("runs");
    let compare = |dry: bool| {
        let mut args = vec!["compare", "--config", config.to_str().unwrap()];
        args.extend(["--runs-dir", runs.to_str().unwrap()]);
        if dry {
            args.push("--dry-run");
        }
        common::normrl(&args)
    };
    let (code, plan, err) = compare(true);
    assert_eq!(code, 0, "{err}");
    let methods: Vec<&str> = plan.lines().filter_map(|l| l.split('\t').nth(1)).collect();
    let want = [
        "batch_norm",
        "layer_norm",
        "unit_rows+batch_norm",
        "unit_rows+layer_norm",
    ];
    assert_eq!(methods, want, "{plan}");
    let (code, _, err) = compare(false);
    assert_eq!(code, 0, "{err}");
    let mut labels: Vec<String> = std::fs::read_dir(runs.join("classic_cartpole"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    labels.sort();
    assert_eq!(
        labels,
        [
            "plain-batch_norm",
            "plain-layer_norm",
            "unit_rows-batch_norm",
            "unit_rows-layer_norm"
        ]
    );
    let report = dir.join("report");
    let (code, _, err) = common::normrl(&[
        "report",
        runs.to_str().unwrap(),
        "--out",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("| unit_rows-layer_norm | 1 |"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pair that cannot train, a preset contradicted by a part in one file, and a head
/// setting that its weights do not have: each refused with the key and the reason,
/// exit 2, nothing written. A `--set` of a part over a file's preset replaces that part
/// only, as a later setting of any key wins.
#[test]
fn pairs_that_cannot_train_and_contradictions_are_refused() {
    let dir = common::fresh_dir("refused-pairs");
    let run = dir.join("run");
    let file = dir.join("contradiction.toml");
    std::fs::write(
        &file,
        "[norm]\nkind = \"layer_norm\"\nactivation = \"batch_norm\"\n",
    )
    .unwrap();
    let cases: [(&str, &[&str], &str); 3] = [
        (
            file.to_str().unwrap(),
            &[],
            "norm.kind = \"layer_norm\" is norm.weight = \"plain\" with norm.activation = \"layer_norm\", but norm.activation = \"batch_norm\"",
        ),
        (
            "configs/cartpole.toml",
            &["norm.activation=bounded_batch_norm"],
            "norm.activation must be one other than \"bounded_batch_norm\" unless norm.weight = \"svb\"",
        ),
        (
            "configs/cartpole.toml",
            &["norm.kind=weight_norm", "norm.sphere_head=scaled"],
            "norm.sphere_head must be \"linear\" unless norm.weight = \"unit_rows\"",
        ),
    ];
    for (config, sets, message) in cases {
        let mut args = vec!["train", "--config", config];
        for set in sets {
            args.extend(["--set", set]);
        }
        args.extend(["--run-dir", run.to_str().unwrap()]);
        let (code, _, err) = common::normrl(&args);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(message), "{err}");
        assert!(!run.exists(), "something was written");
    }
    let method = |sets: [&str; 2]| {
        let sets: Vec<String> = sets.map(String::from).into();
        let config = TrainConfig::load(Path::new("configs/cartpole.toml"), &sets).unwrap();
        config.norm.name()
    };
    let over = method(["norm.kind=layer_norm", "norm.weight=weight_norm"]);
    assert_eq!(over, "weight_norm+layer_norm");
    assert_eq!(
        method(["norm.weight=unit_rows", "norm.kind=batch_norm"]),
        "batch_norm"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run of a pair of parts stopped midway and resumed from its checkpoint (its
/// `config.toml` names no preset) ends as the uninterrupted run: the unit rows'
/// projection and batch norm's running statistics travel in the checkpoint.
#[test]
fn a_pair_of_parts_resumes_exactly() {
    let dir = common::fresh_dir("pair-resume");
    let config = short(
        "configs/cartpole.toml",
        &method_sets("unit_rows+batch_norm"),
    );
    let cut = assert_resumes_exactly(config, &dir);
    let text = std::fs::read_to_string(cut.join("config.toml")).unwrap();
    assert!(text.contains("weight = \"unit_rows\"") && !text.contains("[norm]\nkind"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Trains `config` whole (in `dir/full`) and stopped at step 700 then resumed (in
/// `dir/cut`, returned), and checks both end alike: curves and weights.
fn assert_resumes_exactly(config: TrainConfig, dir: &Path) -> std::path::PathBuf {
    let (full, cut) = (dir.join("full"), dir.join("cut"));
    let whole = Trainer::new(config.clone(), &full)
        .unwrap()
        .run(None)
        .unwrap()
        .unwrap();
    let stopped = Trainer::new(config, &cut).unwrap().run(Some(700)).unwrap();
    assert!(stopped.is_none());
    let resumed = Trainer::resume(&cut).unwrap().run(None).unwrap().unwrap();
    assert_eq!(resumed.train_curve, whole.train_curve);
    assert_eq!(resumed.eval_curve, whole.eval_curve);
    assert_eq!(
        common::checkpoint_weights(&cut),
        common::checkpoint_weights(&full)
    );
    cut
}

/// XQC's update (unit rows with batch norm, a C51 head, the joint forward with a Polyak
/// target, rewards divided by the running return's spread) stopped midway and resumed
/// ends as the uninterrupted run: the running return travels in the checkpoint (a
/// resume that started it afresh would divide by another number). Without the scaling
/// the run is another one, so the scaling is applied.
#[test]
fn a_distributional_run_with_scaled_rewards_resumes_exactly() {
    let dir = common::fresh_dir("xqc-resume");
    let mut sets = method_sets("unit_rows+batch_norm");
    sets.extend(
        [
            "dqn.loss=\"c51\"",
            "dqn.joint_forward=true",
            "dqn.online_bn_mode=\"train\"",
            "dqn.target_bn_mode=\"train\"",
            "dqn.support={atoms=21,v_min=-5,v_max=5}",
        ]
        .map(String::from),
    );
    let unscaled = short("configs/cartpole.toml", &sets);
    sets.push("dqn.reward_scale=\"running_return\"".into());
    let mut config = short("configs/cartpole.toml", &sets);
    config.dqn.target_update = normrl_agents::dqn::TargetUpdate::Polyak { tau: 0.005 };
    let cut = assert_resumes_exactly(config, &dir);
    let weights = common::checkpoint_weights(&cut);
    let plain = dir.join("plain");
    let mut other = unscaled;
    other.dqn.target_update = normrl_agents::dqn::TargetUpdate::Polyak { tau: 0.005 };
    Trainer::new(other, &plain).unwrap().run(None).unwrap();
    assert_ne!(common::checkpoint_weights(&plain), weights);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A method preset (`preset = "xqc"`) is its keys: the same config as the keys
/// spelled out. In a file, the file's own keys win over its preset's; a later
/// `--set preset=...` wins over the file; an unknown preset is refused naming the
/// presets there are.
#[test]
fn a_method_preset_is_its_keys_and_later_settings_win() {
    for (name, keys) in normrl::config::presets::PRESETS {
        let sets: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let spelled = TrainConfig::from_toml_str("", &sets).unwrap();
        let from_file = TrainConfig::from_toml_str(&format!("preset = \"{name}\"\n"), &[]);
        assert_eq!(from_file.unwrap(), spelled, "{name}");
        let from_set = TrainConfig::from_toml_str("", &[format!("preset={name}")]);
        assert_eq!(from_set.unwrap(), spelled, "{name}");
    }
    let file = "preset = \"xqc\"\n[dqn]\nloss = \"hl_gauss\"\n[norm]\nkind = \"batch_norm\"\n";
    let config = TrainConfig::from_toml_str(file, &[]).unwrap();
    assert_eq!(config.dqn.loss, normrl_agents::dqn::ValueLoss::HlGauss);
    assert_eq!(config.norm.name(), "batch_norm");
    assert!(config.dqn.joint_forward);
    let file = "[dqn]\nloss = \"mse\"\n";
    let config = TrainConfig::from_toml_str(file, &["preset=xqc".into()]).unwrap();
    assert_eq!(config.dqn.loss, normrl_agents::dqn::ValueLoss::C51);
    assert_eq!(config.norm.name(), "unit_rows+batch_norm");
    let err = TrainConfig::from_toml_str("preset = \"xqx\"\n", &[]).unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("'preset'") && err.contains("crossq_wn, xqc, simbav2"),
        "{err}"
    );
}

/// Each method preset trains (a short CartPole run on every path it takes: the joint
/// forward with a Polyak target, C51 with scaled rewards, the scaled head).
#[test]
fn every_method_preset_trains() {
    let dir = common::fresh_dir("presets");
    for (name, _) in normrl::config::presets::PRESETS {
        let config = short("configs/cartpole.toml", &[format!("preset={name}")]);
        let run = dir.join(name);
        let summary = Trainer::new(config, &run)
            .unwrap()
            .run(None)
            .unwrap()
            .unwrap();
        assert_eq!(summary.steps, 1500, "{name}");
        assert!(
            summary.eval_curve.iter().all(|(_, r)| r.is_finite()),
            "{name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
