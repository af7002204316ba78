//! A small agent actually learns: DQN on CartPole with `none`, `weight_norm` and
//! projected weight norm reaches a mean evaluation return of at least 400 within 50,000
//! environment steps (`configs/cartpole.toml`) with two of seeds 1, 2 and 3; with BBN
//! (whose gain bound once flipped negative gains and collapsed), 120 with three of seeds
//! 1-5; with NaP
//! and hyperspherical layers, which learn CartPole more slowly, at least 200; with two
//! pairs of parts no preset names, unit rows with batch norm at least 400 and weight
//! norm with layer norm at least 300; with a distributional value (C51, HL-Gauss) and
//! the method presets (CrossQ with weight norm, XQC, SimbaV2), at least 400 (a random
//! policy scores about 22).
//!
//! Two of three, because DQN on CartPole varies from seed to seed (about one seed in
//! four stays below 400 within 50,000 steps, measured): with one seed, a change of
//! rounding anywhere (the order of a sum) can flip the test, while a learner that is
//! broken misses on every seed.

mod common;

use std::path::Path;

use normrl::config::TrainConfig;
use normrl::train::Trainer;

const SEEDS: [u64; 3] = [1, 2, 3];

/// The best evaluation of `configs/cartpole.toml` with `sets` (`--set`s) applied, and
/// the evaluations so far. The run stops at the first evaluation that reaches `target`:
/// what comes after cannot change the verdict, and a run that learns early costs a
/// fraction of its 50,000 steps (this file is most of the test suite's time).
fn best_eval_with(mut overrides: Vec<String>, seed: u64, target: f64) -> (f64, Vec<(u64, f64)>) {
    let norm = overrides.join(",").replace(['=', '.', ',', '+', '"'], "-");
    overrides.extend([
        format!("run.seed={seed}"),
        "logging.progress=false".to_string(),
        "checkpoint.interval=0".to_string(),
        "checkpoint.replay=false".to_string(),
    ]);
    let config = TrainConfig::load(Path::new("configs/cartpole.toml"), &overrides).unwrap();
    let (total, every) = (config.run.total_steps, config.eval.interval);
    assert_eq!(total, 50_000);
    let dir =
        std::env::temp_dir().join(format!("normrl-learn-{norm}-{seed}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let best = |curve: &[(u64, f64)]| curve.iter().map(|&(_, r)| r).fold(f64::MIN, f64::max);
    let mut trainer = Trainer::new(config, &dir).unwrap();
    // An evaluation at a time: each stretch ends on an evaluation step.
    let curve = loop {
        let next = (trainer.step() + every).min(total);
        match trainer.run(Some(next)).unwrap() {
            Some(summary) => break summary.eval_curve,
            None if best(trainer.eval_curve()) >= target => break trainer.eval_curve().to_vec(),
            None => {}
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    (best(&curve), curve)
}

/// Runs the seeds until two reach `target` (or two cannot), and says which did.
fn assert_learns(norm: &str, target: f64) {
    assert_learns_on(norm, target, &SEEDS, 2);
}

/// Runs `seeds` until `need` of them reach `target` (or that many cannot).
fn assert_learns_on(norm: &str, target: f64, seeds: &[u64], need: usize) {
    assert_sets_learn(common::method_sets(norm), target, seeds, need);
}

/// [`assert_learns_on`] with `sets` applied to the CartPole config.
fn assert_sets_learn(sets: Vec<String>, target: f64, seeds: &[u64], need: usize) {
    let norm = sets.join(" ");
    let mut runs = vec![];
    for &seed in seeds {
        let (best, curve) = best_eval_with(sets.clone(), seed, target);
        runs.push((seed, best, curve));
        let reached = runs.iter().filter(|r| r.1 >= target).count();
        if reached >= need {
            return;
        }
        if runs.len() - reached > seeds.len() - need {
            break;
        }
    }
    panic!("{norm}: fewer than {need} of seeds {seeds:?} reached a mean evaluation return of {target}: (seed, best, curve) {runs:?}");
}

#[test]
fn cartpole_learns_with_no_normalization() {
    assert_learns("none", 400.0);
}

#[test]
fn cartpole_learns_with_weight_norm() {
    assert_learns("weight_norm", 400.0);
}

/// BBN learns CartPole weakly, and which seeds do well depends on the products'
/// rounding: best evaluations of seeds 1-10, 94, 356, 500, 373, 346, 128, 112, 120, 64,
/// 86 with AVX2's kernels and 43, 157, 150, 65, 291, 100, 89, 116, 71, 155 with
/// AVX-512's (a median of about 110-125 either way). So three of seeds 1-5 must reach
/// 120, five times a random policy's 22, which a collapsed learner (its gains flipped
/// negative, as BBN's once did) does not: two lucky seeds of three would be a test of
/// the rounding, not of BBN.
#[test]
fn cartpole_learns_with_bbn() {
    assert_learns_on("bbn", 120.0, &[1, 2, 3, 4, 5], 3);
}

/// Measured: 500, 500 and 500.
#[test]
fn cartpole_learns_with_projected_weight_norm() {
    assert_learns("wn_projected", 400.0);
}

/// Measured: 200, 305 and 500 (and 230, 500, 490 before the projection ran in place:
/// its rounding alone moves a seed by that much, so the bar is 200, under the second
/// best by a margin).
#[test]
fn cartpole_learns_with_normalize_and_project() {
    assert_learns("nap", 200.0);
}

/// Measured: 291, 298 and 328 (with SimbaV2's scaled head, whose Q-values grow by
/// about a learning rate a step: 37, 48 and 315).
#[test]
fn cartpole_learns_with_hyperspherical_layers() {
    assert_learns("hyperspherical", 200.0);
}

/// CrossQ with weight norm's and XQC's layers (unit rows, batch norm, a free head).
/// Measured: 372, 500 and 500.
#[test]
fn cartpole_learns_with_unit_rows_and_batch_norm() {
    assert_learns("unit_rows+batch_norm", 400.0);
}

/// Measured, seeds 1-5: 149, 275, 210, 392 and 500 with weight norm's init on 256
/// observations spread over the replay (338, 387, 294, 466 and 489 when it measured
/// the first batch of 32: a seed moves by that much with the init's numbers), so three
/// of five must reach 250, under the third best by a margin.
#[test]
fn cartpole_learns_with_weight_norm_and_layer_norm() {
    assert_learns_on("weight_norm+layer_norm", 250.0, &[1, 2, 3, 4, 5], 3);
}

/// A distributional value: a head of 2 actions x 51 atoms on [0, 100] (CartPole's
/// discounted returns lie in [0, 100]; the default [-10, 10] would clip them), trained
/// with C51's projected target. Measured: 500, 500 and 500.
#[test]
fn cartpole_learns_with_c51() {
    assert_sets_learn(distributional("c51"), 400.0, &SEEDS, 2);
}

/// HL-Gauss's histogram targets on 51 bins over [0, 100]. Measured: 500, 500 and 500.
#[test]
fn cartpole_learns_with_hl_gauss() {
    assert_sets_learn(distributional("hl_gauss"), 400.0, &SEEDS, 2);
}

fn distributional(loss: &str) -> Vec<String> {
    ["dqn.support.v_min=0", "dqn.support.v_max=100"]
        .map(String::from)
        .into_iter()
        .chain([format!("dqn.loss={loss}")])
        .collect()
}

/// CrossQ with weight norm's preset (unit rows with batch norm, a Polyak target, the
/// joint forward in train mode). Measured: 500, 500 and 500.
#[test]
fn cartpole_learns_with_the_crossq_wn_preset() {
    assert_sets_learn(vec!["preset=crossq_wn".into()], 400.0, &SEEDS, 2);
}

/// XQC's preset (CrossQ with weight norm's layers with the head's rows projected, a C51
/// head on 101 atoms over [-5, 5], rewards divided by the return's spread). Measured:
/// 500, 500 and 500 (the same through candle's graph).
#[test]
fn cartpole_learns_with_the_xqc_preset() {
    assert_sets_learn(vec!["preset=xqc".into()], 400.0, &SEEDS, 2);
}

/// SimbaV2's preset (hyperspherical layers, the scaled head feeding C51's logits over
/// 101 atoms on [-5, 5], SimbaV2's reward scale). Measured: 500, 500 and 500.
#[test]
fn cartpole_learns_with_the_simbav2_preset() {
    assert_sets_learn(vec!["preset=simbav2".into()], 400.0, &SEEDS, 2);
}
