//! A small agent actually learns: DQN on CartPole with `none` and with `weight_norm`
//! reaches a mean evaluation return of at least 400 within 50,000 environment steps
//! (seed 2 of `configs/cartpole.toml`).

use std::path::Path;

use normrl::config::TrainConfig;
use normrl::train::Trainer;

fn best_eval(norm: &str) -> (f64, Vec<(u64, f64)>) {
    let overrides = vec![
        format!("norm.kind={norm}"),
        "run.seed=2".to_string(),
        "logging.progress=false".to_string(),
        "checkpoint.interval=0".to_string(),
        "checkpoint.replay=false".to_string(),
    ];
    let config = TrainConfig::load(Path::new("configs/cartpole.toml"), &overrides).unwrap();
    assert_eq!(config.run.total_steps, 50_000);
    let dir = std::env::temp_dir().join(format!("normrl-learn-{norm}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let summary = Trainer::new(config, &dir)
        .unwrap()
        .run(None)
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let best = summary
        .eval_curve
        .iter()
        .map(|&(_, r)| r)
        .fold(f64::MIN, f64::max);
    (best, summary.eval_curve)
}

#[test]
fn cartpole_learns_with_no_normalization() {
    let (best, curve) = best_eval("none");
    assert!(
        best >= 400.0,
        "best mean evaluation return {best}: {curve:?}"
    );
}

#[test]
fn cartpole_learns_with_weight_norm() {
    let (best, curve) = best_eval("weight_norm");
    assert!(
        best >= 400.0,
        "best mean evaluation return {best}: {curve:?}"
    );
}
