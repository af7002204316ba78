//! The DQN update: TD targets, target syncs, data-dependent init.

use candle_core::{Device, Tensor};
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig, Engine, TargetUpdate, ValueLoss};
use normrl_agents::nn::init::InitRng;
use normrl_agents::nn::{unit_moments, NormConfig, NormKind, Pass, QNetwork, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::replay::Batch;

mod common;
use common::MaxAbs;

fn agent(kind: NormKind, dqn: DqnConfig) -> Dqn {
    let norm = NormConfig::from(kind);
    Dqn::new(
        AgentConfig {
            network: &QNetworkConfig::mlp(vec![16, 16]),
            norm: &norm,
            optimizer: &OptimizerConfig::default(),
            dqn: &dqn,
        },
        &[3],
        2,
        0,
        &Device::Cpu,
    )
    .unwrap()
}

/// [`agent`] with the default DQN settings but for how its target follows.
fn agent_with_target(kind: NormKind, target_update: TargetUpdate) -> Dqn {
    let config = DqnConfig {
        target_update,
        ..Default::default()
    };
    agent(kind, config)
}

/// Parameter `name` of `net`, flattened.
fn param(net: &QNetwork, name: &str) -> Vec<f32> {
    let p = net.store().get(name).unwrap();
    p.var.as_tensor().flatten_all().unwrap().to_vec1().unwrap()
}

fn random_batch(size: usize, seed: u64) -> Batch {
    let mut rng = InitRng::new(seed);
    let mut batch = Batch::new(size, 3);
    let mut normal = || -> Vec<f32> {
        let values = rng.normal(size * 3, 1.0, &Device::Cpu).unwrap();
        values.to_vec1().unwrap()
    };
    batch.obs = normal();
    batch.next_obs = normal();
    for i in 0..size {
        batch.actions[i] = (i % 2) as u32;
        batch.rewards[i] = i as f32 * 0.1;
        batch.terminated[i] = if i % 3 == 0 { 1.0 } else { 0.0 };
    }
    batch
}

#[test]
fn td_targets_bootstrap_only_when_not_terminated() {
    // A target network, with and without Double DQN, and none (the online network's
    // own Q-values, detached).
    let configs = [
        (false, TargetUpdate::Hard { every: 1000 }),
        (true, TargetUpdate::Hard { every: 1000 }),
        (false, TargetUpdate::None),
    ];
    for (double, target_update) in configs {
        let config = DqnConfig {
            gamma: 0.9,
            double_dqn: double,
            target_update,
            ..Default::default()
        };
        let batch = random_batch(12, 1);
        // Every engine: the host path, the graph on the CPU, and an accelerator's tensor
        // ops (run here on the CPU).
        for engine in [Engine::Host, Engine::CpuGraph, Engine::Device] {
            let mut dqn = agent(NormKind::None, config.clone())
                .with_engine(engine)
                .unwrap();
            // Moves the online net away from the target; nothing syncs.
            for _ in 0..2 {
                assert!(!dqn.update(&batch).unwrap().synced);
            }
            let y = dqn.td_targets(&batch).unwrap();
            let target_free = target_update == TargetUpdate::None;
            let path = format!("{engine:?} {target_update:?}");
            check_engine_targets(&dqn, &batch, &y, double, target_free, &path);
        }
    }
}

/// `y` against the definition, from the networks' Q-values.
fn check_engine_targets(
    dqn: &Dqn,
    batch: &Batch,
    y: &[f32],
    double: bool,
    target_free: bool,
    path: &str,
) {
    let next = Tensor::from_slice(&batch.next_obs, (12, 3), &Device::Cpu).unwrap();
    let q_of = |net: &QNetwork| -> Vec<Vec<f32>> {
        net.forward(&next, Pass::EVAL).unwrap().to_vec2().unwrap()
    };
    let targets_from = if target_free {
        dqn.online()
    } else {
        dqn.target()
    };
    let (q_target, q_online) = (q_of(targets_from), q_of(dqn.online()));
    check_targets(batch, y, &q_target, &q_online, double, path);
}

/// Each target against its definition, from the networks' Q-values.
fn check_targets(
    batch: &Batch,
    y: &[f32],
    q_target: &[Vec<f32>],
    q_online: &[Vec<f32>],
    double: bool,
    path: &str,
) {
    for i in 0..y.len() {
        let a = if double {
            (q_online[i][1] > q_online[i][0]) as usize
        } else {
            (q_target[i][1] > q_target[i][0]) as usize
        };
        let bootstrap = if batch.terminated[i] == 1.0 {
            0.0
        } else {
            0.9 * q_target[i][a]
        };
        let expected = batch.rewards[i] + bootstrap;
        assert!(
            (y[i] - expected).abs() < 1e-5,
            "{path}: double={double} row {i}: {} vs {expected}",
            y[i]
        );
    }
}

#[test]
fn updates_fit_rewards_with_gamma_zero() {
    let config = DqnConfig {
        gamma: 0.0,
        loss: ValueLoss::Mse,
        ..Default::default()
    };
    let mut dqn = agent(NormKind::WeightNorm, config);
    let batch = random_batch(16, 2);
    let first = dqn.update(&batch).unwrap().td_loss.value().unwrap();
    let mut last = first;
    for _ in 0..400 {
        last = dqn.update(&batch).unwrap().td_loss.value().unwrap();
    }
    assert!(last < first * 0.01 && last < 1e-3, "loss {first} -> {last}");
}

#[test]
fn hard_sync_copies_weights_and_batch_norm_statistics() {
    let mut dqn = agent_with_target(NormKind::BatchNorm, TargetUpdate::Hard { every: 3 });
    let batch = random_batch(16, 3);
    let running = |net: &QNetwork| param(net, "fc0.bn.running_var");
    assert!(!dqn.update(&batch).unwrap().synced);
    assert_ne!(running(dqn.online()), running(dqn.target()));
    dqn.update(&batch).unwrap();
    assert!(dqn.update(&batch).unwrap().synced);
    assert_eq!(running(dqn.online()), running(dqn.target()));
    for (a, b) in dqn
        .online()
        .store()
        .params()
        .iter()
        .zip(dqn.target().store().params())
    {
        let differ = (a.var.as_tensor() - b.var.as_tensor()).unwrap();
        assert_eq!(differ.max_abs(), 0.0, "{}", a.name);
    }
}

#[test]
fn polyak_moves_target_by_tau() {
    let mut dqn = agent_with_target(NormKind::None, TargetUpdate::Polyak { tau: 0.25 });
    let before = dqn.target().store().to_map().unwrap();
    dqn.update(&random_batch(8, 4)).unwrap();
    let online = dqn.online().store().to_map().unwrap();
    let w = "fc0.weight";
    let expected = ((&before[w] * 0.75).unwrap() + (&online[w] * 0.25).unwrap()).unwrap();
    let got = dqn.target().store().get(w).unwrap().var.as_tensor().clone();
    let err = (got - expected).unwrap().max_abs();
    assert!(err < 1e-6);
}

#[test]
fn data_dependent_init_runs_on_first_batch_and_target_follows() {
    let mut dqn = agent_with_target(NormKind::WeightNorm, TargetUpdate::Hard { every: 1_000 });
    let batch = random_batch(32, 5);
    assert!(!dqn.is_initialized());
    dqn.update(&batch).unwrap();
    assert!(dqn.is_initialized());
    // The target holds the initialized (not yet updated) network: on this batch its
    // first layer's pre-activations are standardized.
    let obs = Tensor::from_slice(&batch.obs, (32, 3), &Device::Cpu).unwrap();
    let first = dqn.target().layers().next().unwrap();
    let (mean, var) = unit_moments(&first.pre_activation(&obs, Pass::EVAL).unwrap()).unwrap();
    let m = mean.max_abs();
    let s = (var.sqrt().unwrap() - 1.0).unwrap().max_abs();
    assert!(m < 1e-4 && s < 1e-4, "{m} {s}");
}

#[test]
fn epsilon_greedy_explores_at_rate_epsilon() {
    use rand::SeedableRng;
    let dqn = agent(NormKind::None, DqnConfig::default());
    let obs = [0.3f32, -0.2, 0.1];
    let greedy = dqn.greedy_action(&obs).unwrap();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(0);
    let n = 20_000;
    let other = (0..n)
        .filter(|_| dqn.act(&obs, 0.4, &mut rng).unwrap() != greedy)
        .count();
    // Random actions pick the other action half the time: 0.4 * 0.5.
    let rate = other as f64 / n as f64;
    assert!((rate - 0.2).abs() < 0.015, "{rate}");
    assert!((0..100).all(|_| dqn.act(&obs, 0.0, &mut rng).unwrap() == greedy));
}

/// CrossQ's joint forward: batch norm's statistics in the update are those of the
/// observations and next observations together (2B rows).
#[test]
fn a_joint_forward_normalizes_over_both_halves() {
    let batch = random_batch(8, 5);
    let rows = |data: &[f32]| -> Vec<Vec<f64>> {
        data.chunks(3)
            .map(|r| r.iter().map(|&v| f64::from(v)).collect())
            .collect()
    };
    // Running mean after one update from 0 with momentum 0.1: 0.1 * W mean(x) over the
    // rows the update normalized.
    let expected = |w: &[f32], x: &[Vec<f64>]| -> Vec<f64> {
        let mean: Vec<f64> = (0..3)
            .map(|j| x.iter().map(|r| r[j]).sum::<f64>() / x.len() as f64)
            .collect();
        w.chunks(3)
            .map(|row| {
                0.1 * row
                    .iter()
                    .zip(&mean)
                    .map(|(a, b)| f64::from(*a) * b)
                    .sum::<f64>()
            })
            .collect()
    };
    for (joint, engine) in [
        (true, Engine::Host),
        (true, Engine::CpuGraph),
        (false, Engine::Host),
    ] {
        let config = DqnConfig {
            target_update: TargetUpdate::None,
            joint_forward: joint,
            ..Default::default()
        };
        let mut dqn = agent(NormKind::BatchNorm, config)
            .with_engine(engine)
            .unwrap();
        let w = param(dqn.online(), "fc0.weight");
        dqn.update(&batch).unwrap();
        let running = param(dqn.online(), "fc0.bn.running_mean");
        let mut normalized = rows(&batch.obs);
        if joint {
            normalized.extend(rows(&batch.next_obs));
        }
        for (got, want) in running.iter().zip(expected(&w, &normalized)) {
            assert!(
                (f64::from(*got) - want).abs() < 1e-5,
                "{joint} {engine:?}: {got} vs {want}"
            );
        }
    }
}

/// CrossQ with weight norm's and XQC's joint forward with a target network: the
/// online network's forward runs over both halves, and the targets come from the
/// target network's forward over the same rows. With row-independent layers (no batch
/// statistics) that is the plain update's: the same weights after 6 updates, on the
/// host path and the graph, with and without Double DQN. The target lags the online
/// network after the first update, so targets taken from the online network's second
/// half would drift apart.
#[test]
fn a_joint_forward_with_a_target_network_bootstraps_from_the_target() {
    let batch = random_batch(8, 9);
    for (engine, double_dqn) in [
        (Engine::Host, false),
        (Engine::CpuGraph, false),
        (Engine::CpuGraph, true),
    ] {
        let config = |joint_forward| DqnConfig {
            joint_forward,
            double_dqn,
            target_update: TargetUpdate::Hard { every: 100 },
            ..Default::default()
        };
        let train = |joint| {
            let mut dqn = agent(NormKind::LayerNorm, config(joint))
                .with_engine(engine)
                .unwrap();
            for _ in 0..6 {
                dqn.update(&batch).unwrap();
            }
            param(dqn.online(), "head.weight")
        };
        let (joint, plain) = (train(true), train(false));
        let moved = joint.iter().zip(&plain).map(|(a, b)| (a - b).abs());
        let largest = moved.fold(0f32, f32::max);
        assert!(largest < 1e-5, "{engine:?} double={double_dqn}: {largest}");
    }
    // Bootstrapping from the online network's own second half instead is another
    // update: the test above can tell them apart.
    let own = DqnConfig {
        joint_forward: true,
        target_update: TargetUpdate::None,
        ..Default::default()
    };
    let mut dqn = agent(NormKind::LayerNorm, own);
    let mut with_target = agent(
        NormKind::LayerNorm,
        DqnConfig {
            joint_forward: true,
            target_update: TargetUpdate::Hard { every: 100 },
            ..Default::default()
        },
    );
    for _ in 0..6 {
        dqn.update(&batch).unwrap();
        with_target.update(&batch).unwrap();
    }
    let a = param(dqn.online(), "head.weight");
    let b = param(with_target.online(), "head.weight");
    let apart = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(apart > 1e-4, "{apart}");
}

#[test]
fn target_free_choices_that_make_no_sense_are_refused() {
    let double_without_target = DqnConfig {
        double_dqn: true,
        target_update: TargetUpdate::None,
        ..Default::default()
    };
    assert_eq!(double_without_target.problems()[0].0, "double_dqn");
}
