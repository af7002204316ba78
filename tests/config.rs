//! Config parsing, overrides and the errors a user sees for bad configs.

mod common;

use std::path::{Path, PathBuf};

use normrl::compare::CompareConfig;
use normrl::study::estimate::{describe_plan, Timing};

use normrl::config::TrainConfig;

fn parse(text: &str, overrides: &[&str]) -> Result<TrainConfig, String> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_toml_str(text, &overrides).map_err(|e| format!("{e:#}"))
}

#[test]
fn defaults_and_overrides() {
    let c = parse("", &[]).unwrap();
    assert_eq!(c, TrainConfig::default());
    let c = parse(
        "[replay]\nbatch_size = 8\n",
        &[
            "replay.batch_size=4",
            "norm.kind=batch_norm",
            "replay.sampler={type=\"recent\",window=500}",
            "env.id=minatar/breakout?sticky=0",
            "network.architecture={type=\"minatar_cnn\"}",
        ],
    )
    .unwrap();
    assert_eq!(c.replay.batch_size, 4);
    assert_eq!(c.norm.name(), "batch_norm");
    assert_eq!(c.env.id, "minatar/breakout?sticky=0");
    assert_eq!(
        c.replay.sampler,
        normrl_agents::replay::Sampler::Recent { window: 500 }
    );
    // The resolved config round-trips.
    assert_eq!(parse(&c.to_toml(), &[]).unwrap(), c);
}

/// Every `.toml` under `dir`, recursively.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(toml_files(&path));
        } else if path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The shipped example that lists the methods lists every one of them.
#[test]
fn the_example_config_names_every_method() {
    let text = std::fs::read_to_string("configs/cartpole.toml").unwrap();
    for kind in normrl_agents::nn::NormKind::ALL {
        let named = format!(" {} ", kind.name());
        assert!(
            text.lines()
                .any(|l| l.starts_with('#') && format!("{l} ").contains(&named)),
            "configs/cartpole.toml's comment lacks {}",
            kind.name()
        );
    }
}

#[test]
fn every_shipped_config_parses_and_every_comparison_plans() {
    let files = toml_files(Path::new("configs"));
    let (compare, train): (Vec<_>, Vec<_>) = files
        .iter()
        .partition(|p| p.parent().is_some_and(|d| d.ends_with("compare")));
    assert!(train.len() >= 7 && compare.len() >= 4, "{files:?}");
    for path in train {
        TrainConfig::load(path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    }
    for path in compare {
        let fail = |e: anyhow::Error| -> ! { panic!("{}: {e:#}", path.display()) };
        // What `normrl compare --dry-run` does: expand the grid (each run validated as a
        // training config) and describe the plan.
        let config = CompareConfig::load(path).unwrap_or_else(|e| fail(e));
        let runs = config.expand().unwrap_or_else(|e| fail(e));
        assert!(!runs.is_empty(), "{}: no runs", path.display());
        describe_plan(&config, &runs, 1, Timing::Unmeasured).unwrap_or_else(|e| fail(e));
        for run in &runs {
            config.config_for(run).unwrap_or_else(|e| fail(e));
        }
        if let Some(baseline) = &config.report.baseline {
            assert!(
                runs.iter().any(|r| &r.variant == baseline),
                "{}: the baseline {baseline} is not a planned variant",
                path.display()
            );
        }
    }
}

#[test]
fn errors_name_the_key_and_what_is_allowed() {
    let cases: [(&str, &[&str], &[&str]); 13] = [
        ("[dqn]\ngama = 0.9\n", &[], &["dqn.gama", "gamma"]),
        (
            "[replay]\nbatch_size = \"big\"\n",
            &[],
            &["batch_size", "integer"],
        ),
        ("[replay]\nbatch_size = -3\n", &[], &["batch_size"]),
        (
            "[replay]\nbatch_size = 0\n",
            &[],
            &["replay.batch_size must be a positive integer"],
        ),
        (
            "[env]\nid = \"atari/pong\"\n",
            &[],
            &["env.id", "known environments", "minatar/breakout"],
        ),
        (
            "[norm]\nkind = \"instance_norm\"\n",
            &[],
            &["instance_norm", "weight_norm", "group_norm"],
        ),
        (
            "",
            &["optimizer.lr=-1"],
            &["optimizer.lr must be a positive number"],
        ),
        ("", &["run.device=tpu"], &["auto, cpu, cuda or cuda:N"]),
        (
            "verbose = true\n",
            &[],
            &["unknown config key 'verbose'", "replay"],
        ),
        (
            "[dqn]\nloss = \"quantile\"\n",
            &[],
            &["quantile", "huber", "mse", "c51", "hl_gauss"],
        ),
        (
            "[dqn]\nloss = \"c51\"\n[dqn.support]\natoms = 1\n",
            &[],
            &["dqn.support must be from 2 to 4096 atoms or bins"],
        ),
        (
            // 2^61 atoms overflowed the support's allocation.
            "[dqn]\nloss = \"c51\"\n[dqn.support]\natoms = 2305843009213693952\n",
            &[],
            &["dqn.support must be from 2 to 4096 atoms or bins"],
        ),
        (
            "[dqn]\nloss = \"hl_gauss\"\n",
            &["dqn.support.v_min=5", "dqn.support.v_max=5"],
            &["dqn.support must be finite bounds with v_min < v_max"],
        ),
    ];
    for (text, overrides, needles) in cases {
        let err = parse(text, overrides).unwrap_err();
        for needle in needles {
            assert!(
                err.contains(needle),
                "config {text:?} {overrides:?}: '{err}' lacks '{needle}'"
            );
        }
    }
}

/// The binary's exit status and standard error.
fn normrl(args: &[&str]) -> (i32, String) {
    let (code, _, err) = common::normrl(args);
    (code, err)
}

#[test]
fn cli_rejects_bad_configs_with_exit_code_2_and_writes_nothing() {
    let dir = std::env::temp_dir().join(format!("normrl-badcfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[replay]\nbatch_size = -1\n").unwrap();
    let run = dir.join("run");
    let run_s = run.to_str().unwrap();
    let (code, err) = normrl(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--run-dir",
        run_s,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("batch_size") && !err.contains("panicked"),
        "{err}"
    );
    assert!(!run.exists(), "nothing written for a bad config");

    let (code, err) = normrl(&["train", "--config", "/no/such/file.toml"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read config file /no/such/file.toml"),
        "{err}"
    );

    let (code, err) = normrl(&[
        "train",
        "--config",
        "configs/cartpole.toml",
        "--set",
        "norm.kind=nope",
        "--run-dir",
        run_s,
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("weight_norm"), "{err}");

    // An unwritable run directory (a path under a regular file).
    let blocker = dir.join("file");
    std::fs::write(&blocker, "").unwrap();
    let bad_run = blocker.join("run");
    let (code, err) = normrl(&[
        "train",
        "--config",
        "configs/cartpole.toml",
        "--run-dir",
        bad_run.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot create"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A random TOML value of any type, nested at most `depth` deep.
fn random_value(rng: &mut impl rand::Rng, depth: u32) -> toml::Value {
    use toml::Value;
    let strings = [
        "none", "uniform", "recent", "mlp", "train", "", "../x", "cuda:9", "é",
    ];
    match rng.random_range(0..if depth == 0 { 5 } else { 7 }) {
        0 => Value::Integer(match rng.random_range(0..4) {
            0 => rng.random_range(-3..5),
            1 => i64::MAX,
            2 => i64::MIN,
            _ => rng.random_range(0..100_000),
        }),
        1 => Value::Float(
            [f64::NAN, f64::INFINITY, -0.5, 0.0, 0.3, 1.5, 1e300][rng.random_range(0..7)],
        ),
        2 => Value::String(strings[rng.random_range(0..strings.len())].into()),
        3 => Value::Boolean(rng.random()),
        4 => Value::Array(vec![
            Value::Integer(rng.random_range(-1..100));
            rng.random_range(0..3)
        ]),
        5 => Value::Array(vec![random_value(rng, depth - 1); rng.random_range(0..3)]),
        _ => Value::Table(random_table(rng, depth - 1, &[])),
    }
}

/// A random table whose keys are mostly real config keys (from `known`), some not.
fn random_table(
    rng: &mut impl rand::Rng,
    depth: u32,
    known: &[(String, Vec<String>)],
) -> toml::Table {
    let mut table = toml::Table::new();
    for _ in 0..rng.random_range(0..4) {
        let (section, keys) = match known.len() {
            0 => (
                "type".to_string(),
                vec!["type".to_string(), "window".into()],
            ),
            n => known[rng.random_range(0..n)].clone(),
        };
        let key = keys[rng.random_range(0..keys.len())].clone();
        let value = random_value(rng, depth);
        let entry = table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(t) = entry.as_table_mut() {
            t.insert(key, value);
        }
    }
    table
}

#[test]
fn random_configs_and_overrides_never_panic_and_valid_ones_round_trip() {
    use rand::{Rng, SeedableRng};
    let defaults = toml::Table::try_from(TrainConfig::default()).unwrap();
    let known: Vec<(String, Vec<String>)> = defaults
        .iter()
        .filter_map(|(s, v)| {
            v.as_table()
                .map(|t| (s.clone(), t.keys().cloned().collect()))
        })
        .collect();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(22);
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..3000 {
        let text = toml::to_string(&random_table(&mut rng, 2, &known)).unwrap();
        let mut overrides = vec![];
        for _ in 0..rng.random_range(0..3) {
            let (section, keys) = &known[rng.random_range(0..known.len())];
            let key = &keys[rng.random_range(0..keys.len())];
            let raw = match rng.random_range(0..4) {
                0 => random_value(&mut rng, 1).to_string(),
                1 => "{type=\"recent\",window=-1}".to_string(),
                2 => "=".to_string(),
                _ => "[[".to_string(),
            };
            let sep = ["=", "", ".."][rng.random_range(0..3)];
            overrides.push(format!("{section}.{key}{sep}{raw}"));
        }
        let outcome = std::panic::catch_unwind(|| TrainConfig::from_toml_str(&text, &overrides));
        match outcome {
            Err(_) => panic!("panicked on {text:?} with {overrides:?}"),
            Ok(Ok(config)) => {
                valid += 1;
                let again = TrainConfig::from_toml_str(&config.to_toml(), &[]).unwrap();
                assert_eq!(again, config, "{text:?} {overrides:?}");
            }
            Ok(Err(e)) => {
                invalid += 1;
                assert!(
                    !format!("{e:#}").trim().is_empty(),
                    "{text:?}: an empty error"
                );
            }
        }
    }
    // The generator reaches both outcomes.
    assert!(
        valid > 100 && invalid > 100,
        "{valid} valid, {invalid} invalid"
    );
}

/// The plain-string form the docs show for a kind without settings is accepted (in a
/// file and in `--set`); a wrong kind names the allowed ones; every wrongly typed value
/// of a config is named at once, not only the first.
#[test]
fn plain_kinds_are_accepted_and_every_type_error_is_named() {
    use normrl_agents::replay::Sampler;
    let c = parse(
        "[network]\narchitecture = \"minatar_cnn\"\n",
        &["replay.sampler=sequential"],
    )
    .unwrap();
    assert_eq!(c.replay.sampler, Sampler::Sequential);
    assert_eq!(c, parse(&c.to_toml(), &[]).unwrap());
    let tagged = parse(
        "",
        &[
            "network.architecture={type=\"minatar_cnn\"}",
            "replay.sampler={type=\"sequential\"}",
        ],
    );
    assert_eq!(c, tagged.unwrap());

    let err = parse("", &["replay.sampler=sideways"]).unwrap_err();
    for needle in ["replay.sampler", "sideways", "uniform", "sequential"] {
        assert!(err.contains(needle), "lacks {needle:?}: {err}");
    }
    let text = "[replay]\nbatch_size = \"big\"\n[dqn]\ngamma = \"high\"\n[run]\nseed = -1\n";
    let err = parse(text, &[]).unwrap_err();
    for needle in [
        "'replay.batch_size'",
        "'dqn.gamma'",
        "'run.seed'",
        "non-negative integer",
        "a number",
    ] {
        assert!(err.contains(needle), "lacks {needle:?}: {err}");
    }
}

/// A run's resolved `config.toml` holds every key, those at their defaults included,
/// and a config written by an older normrl (which left some of them out) reads as the
/// same run: resume and the report compare configs in their canonical form.
#[test]
fn the_resolved_config_holds_every_key_and_older_forms_read_the_same() {
    let c = parse("", &["run.population=3", "run.tf32=true"]).unwrap();
    let resolved = c.to_toml();
    let table: toml::Table = toml::from_str(&resolved).unwrap();
    for key in ["allow_odd", "population", "cuda_graphs", "tf32"] {
        assert!(table["run"].get(key).is_some(), "run.{key}: {resolved}");
    }
    assert!(
        table["optimizer"].get("lr_schedule").is_some(),
        "{resolved}"
    );
    assert!(resolved.contains("population = 3") && resolved.contains("tf32 = true"));

    let default = TrainConfig::default().to_toml();
    let mut older: toml::Table = toml::from_str(&default).unwrap();
    for key in ["allow_odd", "population", "cuda_graphs", "tf32"] {
        older["run"].as_table_mut().unwrap().remove(key).unwrap();
    }
    older["optimizer"]
        .as_table_mut()
        .unwrap()
        .remove("lr_schedule")
        .unwrap();
    let older = toml::to_string_pretty(&older).unwrap();
    assert_ne!(older, default);
    assert_eq!(TrainConfig::canonical_toml(&older), Some(default.clone()));
    assert_eq!(TrainConfig::canonical_toml(&default), Some(default.clone()));
    // A config.toml written before methods had parts names the method by `kind` alone
    // (the pilot's and the study's results hold such texts): the same run.
    let mut kind_only: toml::Table = toml::from_str(&default).unwrap();
    let norm = kind_only["norm"].as_table_mut().unwrap();
    norm.remove("weight").unwrap();
    norm.remove("activation").unwrap();
    assert_eq!(norm["kind"].as_str(), Some("none"));
    let kind_only = toml::to_string_pretty(&kind_only).unwrap();
    assert_eq!(TrainConfig::canonical_toml(&kind_only), Some(default));
    assert_eq!(
        TrainConfig::canonical_toml("[replay]\nbatch_size = -1\n"),
        None
    );
}
