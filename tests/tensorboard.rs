//! The event files are read back by the real TensorBoard (its `EventAccumulator`), in a
//! Python virtual environment that this test creates under `target/` on first use.

use std::path::{Path, PathBuf};
use std::process::Command;

use normrl::config::TrainConfig;
use normrl::train::Trainer;

fn python_with_tensorboard() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tb-venv");
    let python = venv.join("bin/python");
    let ok = |p: &Path| {
        Command::new(p)
            .args(["-c", "import tensorboard"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !ok(&python) {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 is needed for this test");
        assert!(status.success(), "python3 -m venv failed");
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "tensorboard==2.21.*",
            ])
            .status()
            .unwrap();
        assert!(status.success(), "pip install tensorboard failed");
    }
    python
}

#[test]
fn tensorboard_reads_our_event_files() {
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
    .map(|s| s.to_string())
    .collect();
    let config = TrainConfig::load(Path::new("configs/cartpole.toml"), &overrides).unwrap();
    let dir = std::env::temp_dir().join(format!("normrl-tb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let summary = {
        let mut trainer = Trainer::new(config, &dir).unwrap();
        trainer.run(None).unwrap().unwrap()
    };
    let python = python_with_tensorboard();
    let out = Command::new(python)
        .arg("scripts/check_tensorboard.py")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
    ] {
        assert!(
            scalars.get(tag).is_some(),
            "missing tag {tag}: {:?}",
            scalars.as_object().unwrap().keys().collect::<Vec<_>>()
        );
    }
    // Values match what the run reported.
    let returns: Vec<(u64, f64)> = scalars["charts/episodic_return"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(returns, summary.train_curve);
    let evals: Vec<(u64, f64)> = scalars["eval/episodic_return"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(evals.len(), summary.eval_curve.len());
    for (a, b) in evals.iter().zip(&summary.eval_curve) {
        assert_eq!(a.0, b.0);
        assert!((a.1 - b.1).abs() < 1e-3);
    }
    let eps = scalars["charts/epsilon"].as_array().unwrap();
    assert_eq!(eps[0][0], 500);
    // Logged at step 500 with the epsilon used for that step (scheduled at 499).
    assert!((eps[0][1].as_f64().unwrap() - (1.0 - 0.98 * 499.0 / 10_000.0)).abs() < 1e-6);
    let config_text = v["tensors"]["config"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{:?}", v["tensors"]));
    assert!(config_text.contains("weight_norm"));
    let _ = std::fs::remove_dir_all(dir);
}
