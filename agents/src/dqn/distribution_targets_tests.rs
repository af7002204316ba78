//! The tensor forms of the target distributions against the host functions they
//! replace on a device, with a population's leading axis and each agent's discount.

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use super::*;
use crate::dqn::distribution::{target_distributions, Bootstrap};

const P: usize = 2;
const B: usize = 6;
const A: usize = 3;

/// Random logits `[P, B, A K]`, chooser Q-values `[P, B, A]`, rewards partly beyond
/// the support's bounds, every third row terminal.
struct Case {
    logits: Vec<f32>,
    chooser: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<f32>,
    gammas: [f32; P],
}

fn case(k: usize, seed: u64) -> Case {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut draw = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    };
    let (logits, chooser) = (draw(P * B * A * k, 3.0), draw(P * B * A, 1.0));
    // Rewards up to 4x the support's reach: some shifted atoms fall beyond both bounds.
    let rewards = draw(P * B, 40.0);
    let terminated = (0..P * B).map(|i| f32::from(i % 3 == 0)).collect();
    Case {
        logits,
        chooser,
        rewards,
        terminated,
        gammas: [0.99, 0.9],
    }
}

/// Each agent's host targets, row-major `[P, B, K]`.
fn host(loss: ValueLoss, support: &Support, values: &[f32], c: &Case, double: bool) -> Vec<f32> {
    let k = values.len();
    let mut out = Vec::new();
    for i in 0..P {
        let rows = i * B..(i + 1) * B;
        let bootstrap = Bootstrap {
            rewards: &c.rewards[rows.clone()],
            terminated: &c.terminated[rows],
            gamma: c.gammas[i],
        };
        let next = &c.logits[i * B * A * k..(i + 1) * B * A * k];
        let chooser = double.then(|| &c.chooser[i * B * A..(i + 1) * B * A]);
        out.extend(target_distributions(
            loss, support, values, next, chooser, &bootstrap,
        ));
    }
    out
}

/// The same targets in tensor ops, on the CPU device.
fn tensor(loss: ValueLoss, support: &Support, values: &[f32], c: &Case, double: bool) -> Tensor {
    let (d, k) = (Device::Cpu, values.len());
    let forms = SupportTensors::new(loss, support, values, &d).unwrap();
    let logits = Tensor::from_slice(&c.logits, (P, B, A * k), &d).unwrap();
    let chooser = Tensor::from_slice(&c.chooser, (P, B, A), &d).unwrap();
    let rewards = Tensor::from_slice(&c.rewards, (P, B), &d).unwrap();
    let terminated = Tensor::from_slice(&c.terminated, (P, B), &d).unwrap();
    let gammas = Tensor::from_slice(&c.gammas, (P, 1), &d).unwrap();
    let rows = TensorBootstrap {
        rewards: &rewards,
        terminated: &terminated,
        gamma: Discount::PerAgent(&gammas),
    };
    let chooser = double.then_some(&chooser);
    forms.targets(&logits, chooser, &rows).unwrap()
}

fn values_of(loss: ValueLoss, s: &Support) -> Vec<f32> {
    let k = s.atoms;
    let (lo, hi) = (s.v_min as f32, s.v_max as f32);
    match loss {
        ValueLoss::HlGauss => {
            let w = (hi - lo) / k as f32;
            (0..k).map(|i| lo + (i as f32 + 0.5) * w).collect()
        }
        _ => (0..k)
            .map(|j| lo + j as f32 * (hi - lo) / (k - 1) as f32)
            .collect(),
    }
}

fn worst_gap(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// C51's and HL-Gauss's tensor targets equal the host ones on every row (terminal
/// rows, targets beyond both bounds, Double DQN's chooser or the greedy expectation),
/// each a distribution that sums to 1.
#[test]
fn tensor_targets_equal_the_host_functions() {
    let support = Support {
        atoms: 11,
        v_min: -10.0,
        v_max: 10.0,
    };
    for (loss, seed) in [(ValueLoss::C51, 1), (ValueLoss::HlGauss, 2)] {
        let values = values_of(loss, &support);
        for double in [false, true] {
            let c = case(support.atoms, seed);
            let want = host(loss, &support, &values, &c, double);
            let got = tensor(loss, &support, &values, &c, double);
            assert_eq!(got.dims(), &[P, B, support.atoms]);
            let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
            let gap = worst_gap(&got, &want);
            assert!(gap <= 2e-6, "{loss:?} double {double}: apart by {gap:e}");
            for row in got.chunks_exact(support.atoms) {
                let sum: f32 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{loss:?}: a row sums to {sum}");
                assert!(row.iter().all(|&m| m >= 0.0), "{loss:?}: {row:?}");
            }
        }
    }
}

/// Hand-worked C51 cases on three atoms on [-1, 1], all the next mass on atom 0's
/// middle: moved by 0.5 it lands halfway between 0 and 1; a terminal row's target is
/// the reward's alone, split around it; a reward beyond the support puts every atom on
/// the last.
#[test]
fn c51_tensor_projection_by_hand() {
    let support = Support {
        atoms: 3,
        v_min: -1.0,
        v_max: 1.0,
    };
    let d = Device::Cpu;
    let forms = SupportTensors::new(ValueLoss::C51, &support, &[-1.0, 0.0, 1.0], &d).unwrap();
    // One action, logits that put all but e^-200 of the mass on the middle atom.
    let logits = Tensor::new(&[[-100f32, 100.0, -100.0]; 3], &d).unwrap();
    let rewards = Tensor::new(&[0.5f32, -0.25, 5.0], &d).unwrap();
    let terminated = Tensor::new(&[0f32, 1.0, 0.0], &d).unwrap();
    let rows = TensorBootstrap {
        rewards: &rewards,
        terminated: &terminated,
        gamma: Discount::All(0.99),
    };
    let got: Vec<Vec<f32>> = forms
        .targets(&logits, None, &rows)
        .unwrap()
        .to_vec2()
        .unwrap();
    let want = [[0.0, 0.5, 0.5], [0.25, 0.75, 0.0], [0.0, 0.0, 1.0]];
    for (g, w) in got.iter().zip(want) {
        assert!(worst_gap(g, &w) < 1e-6, "{got:?} against {want:?}");
    }
}

/// Q read out of a distributional head's logits `[.., A K]` is the expectation over
/// the support, per action.
#[test]
fn q_values_are_the_expectations() {
    let d = Device::Cpu;
    let support = Support {
        atoms: 2,
        v_min: 0.0,
        v_max: 4.0,
    };
    let forms = SupportTensors::new(ValueLoss::C51, &support, &[0.0, 4.0], &d).unwrap();
    // Two actions: equal logits (mean 2), and 3 : 1 odds for the upper atom (mean 3).
    let logits = Tensor::new(&[[[0f32, 0.0, 0.0, 3f32.ln()]]], &d).unwrap();
    let q: Vec<f32> = forms
        .q_values(&logits)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(worst_gap(&q, &[2.0, 3.0]) < 1e-6, "{q:?}");
}
