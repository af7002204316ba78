//! The diagnostics against values worked out by hand: the effective rank of a matrix
//! with known singular values, the dormant fractions of a hand-built layer, and the
//! parameter norms and effective step of a known change.

mod common;
use common::*;

use candle_core::Tensor;
use normrl_agents::diagnostics::{effective_rank, LayerParameters, ProbeDiagnostics};
use normrl_agents::nn::{NormConfig, NormKind, QNetwork, QNetworkConfig};

/// `U diag(s) V^T` with orthogonal `U` (a scaled Hadamard matrix) and `V` (a
/// rotation in two planes): singular values exactly `s`.
fn with_singular_values(s: [f32; 4]) -> Tensor {
    let h = Tensor::new(
        &[
            [1f32, 1.0, 1.0, 1.0],
            [1.0, -1.0, 1.0, -1.0],
            [1.0, 1.0, -1.0, -1.0],
            [1.0, -1.0, -1.0, 1.0],
        ],
        &DEV,
    )
    .unwrap();
    let u = (h * 0.5).unwrap();
    let (c, z) = (0.6f32, 0.8f32);
    let v = Tensor::new(
        &[
            [c, -z, 0.0, 0.0],
            [z, c, 0.0, 0.0],
            [0.0, 0.0, c, z],
            [0.0, 0.0, -z, c],
        ],
        &DEV,
    )
    .unwrap();
    let diag = Tensor::new(
        &[
            [s[0], 0.0, 0.0, 0.0],
            [0.0, s[1], 0.0, 0.0],
            [0.0, 0.0, s[2], 0.0],
            [0.0, 0.0, 0.0, s[3]],
        ],
        &DEV,
    )
    .unwrap();
    u.matmul(&diag).unwrap().matmul(&v.t().unwrap()).unwrap()
}

#[test]
fn effective_rank_of_known_singular_values() {
    // Sums 10, 15, 16, 16.05 of 16.05: 0.62, 0.93, 0.997 >= 0.99 at k = 3.
    let phi = with_singular_values([10.0, 5.0, 1.0, 0.05]);
    assert_eq!(effective_rank(&phi, 0.01).unwrap(), 3);
    // Equal values need all four; one value holds everything.
    assert_eq!(
        effective_rank(&with_singular_values([2.0; 4]), 0.01).unwrap(),
        4
    );
    let one = with_singular_values([3.0, 0.0, 0.0, 0.0]);
    assert_eq!(effective_rank(&one, 0.01).unwrap(), 1);
    // A looser tolerance: 15/16.05 = 0.935 >= 0.9 at k = 2.
    let phi = with_singular_values([10.0, 5.0, 1.0, 0.05]);
    assert_eq!(effective_rank(&phi, 0.1).unwrap(), 2);
    let zero = Tensor::zeros((4, 4), candle_core::DType::F32, &DEV).unwrap();
    assert_eq!(effective_rank(&zero, 0.01).unwrap(), 0);
}

/// An MLP 2-4-2 without normalization whose hidden units are, on inputs `(x, 1)` with
/// `x >= 0`: 0 (dead), `0.01 x` (dormant), `x` and `2x + 1`.
fn hand_built() -> QNetwork {
    let norm = NormConfig::from(NormKind::None);
    let net = QNetwork::new(&QNetworkConfig::mlp(vec![4]), &norm, &[2], 2, 0, &DEV).unwrap();
    let set = |name: &str, v: Tensor| net.store().get(name).unwrap().var.set(&v).unwrap();
    set(
        "fc0.weight",
        Tensor::new(&[[-1f32, -1.0], [0.01, 0.0], [1.0, 0.0], [2.0, 1.0]], &DEV).unwrap(),
    );
    set(
        "fc0.bias",
        Tensor::zeros(4, candle_core::DType::F32, &DEV).unwrap(),
    );
    net
}

#[test]
fn dormant_fractions_of_a_hand_built_layer() {
    let net = hand_built();
    // x = 0, 1, 2, 3: mean |h| per unit 0, 0.015, 1.5, 4; layer mean 5.515 / 4.
    // Scores 0, 0.011, 1.09, 2.90: one dead unit, two at or below 0.1.
    let probe = Tensor::new(&[[0f32, 1.0], [1.0, 1.0], [2.0, 1.0], [3.0, 1.0]], &DEV).unwrap();
    let found = ProbeDiagnostics::of(&net, &probe).unwrap();
    assert_eq!(found.layers.len(), 1);
    assert_eq!(found.layers[0].layer, "fc0");
    assert_eq!(found.layers[0].dormant, vec![0.25, 0.5]);
    assert_eq!(found.network_dormant(), vec![0.25, 0.5]);
    // Features [0, 0.01x, x, 2x+1] over four inputs: rank 2 (the first column is 0,
    // the second 0.01 times the third), both values well over 1% of their sum.
    assert_eq!(found.effective_rank, 2);
}

#[test]
fn parameter_norms_and_the_effective_step_of_a_known_change() {
    let net = hand_built();
    let before = LayerParameters::of(&net).unwrap();
    let names: Vec<&str> = before.0.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        names,
        ["fc0.weight", "fc0.bias", "head.weight", "head.bias"]
    );
    // fc0: weights 1+1+0.0001+1+4+1 = 8.0001, bias 0.
    let norms = before.norms();
    assert!((norms[0].1 - 8.0001f64.sqrt()).abs() < 1e-6, "{norms:?}");
    let all = (norms[0].1.powi(2) + norms[1].1.powi(2)).sqrt();
    assert_eq!(norms[2].0, "all");
    assert!((norms[2].1 - all).abs() < 1e-9);
    // Move one fc0 bias by 0.5: fc0's step 0.5 / sqrt(8.0001), the head's 0.
    let bias = Tensor::new(&[0f32, 0.0, 0.5, 0.0], &DEV).unwrap();
    net.store().get("fc0.bias").unwrap().var.set(&bias).unwrap();
    let steps = before.effective_steps(&LayerParameters::of(&net).unwrap());
    assert!(
        (steps[0].1 - 0.5 / 8.0001f64.sqrt()).abs() < 1e-6,
        "{steps:?}"
    );
    assert_eq!(steps[1].1, 0.0);
    assert!((steps[2].1 - 0.5 / all).abs() < 1e-6);
    // A bias moved, no weight turned.
    let angles = before.turn_angles(&LayerParameters::of(&net).unwrap());
    assert!(angles.iter().all(|(_, a)| *a == 0.0), "{angles:?}");
}

/// The angle weights turn is the effective learning rate of a scale-invariant layer:
/// a rotation by 0.3 radians reads 0.3 whatever the weights' length before and after,
/// biases and gains do not count, weight norm's direction `v` does, and the network's
/// angle takes every layer's weights as one vector.
#[test]
fn the_angle_weights_turn_is_known_for_a_rotation() {
    let (c, s) = (0.3f32.cos(), 0.3f32.sin());
    let at = |weights: Vec<f32>, v: Vec<f32>| {
        LayerParameters(vec![
            ("fc0.weight".into(), weights),
            ("fc0.bias".into(), vec![1.0, -2.0]),
            ("fc1.v".into(), v),
            ("fc1.g".into(), vec![1.0]),
        ])
    };
    let before = at(vec![2.0, 0.0], vec![0.0, 1.0]);
    // fc0 rotated by 0.3 and scaled by 5 (a step that grows the norm turns no
    // further); fc1's direction unchanged but scaled; the bias and gain moved.
    let mut after = at(vec![10.0 * c, 10.0 * s], vec![0.0, 3.0]);
    after.0[1].1 = vec![7.0, 7.0];
    after.0[3].1 = vec![4.0];
    let angles = before.turn_angles(&after);
    let names: Vec<&str> = angles.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(names, ["fc0", "fc1", "all"]);
    assert!((angles[0].1 - 0.3).abs() < 1e-6, "{angles:?}");
    assert!(angles[1].1.abs() < 1e-6, "{angles:?}");
    // All weights as one vector: (2, 0, 0, 1) against (10c, 10s, 0, 3).
    let expected = (20.0 * f64::from(c) + 3.0) / (5f64.sqrt() * 109f64.sqrt());
    assert!((angles[2].1 - expected.acos()).abs() < 1e-6, "{angles:?}");
}
