//! A distributional value: the head's Q-values are its expectations, and C51's and
//! HL-Gauss's updates fit the value they are given.

use candle_core::{Device, Tensor};
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig, Engine, Support, TargetUpdate, ValueLoss};
use normrl_agents::nn::{NormConfig, NormKind, Pass, QNetwork, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::replay::Batch;

fn agent(kind: NormKind, dqn: &DqnConfig) -> candle_core::Result<Dqn> {
    let norm = NormConfig::from(kind);
    let config = AgentConfig {
        network: &QNetworkConfig::mlp(vec![32, 32]),
        norm: &norm,
        optimizer: &OptimizerConfig::default(),
        dqn,
    };
    Dqn::new(config, &[3], 2, 7, &Device::Cpu)
}

#[test]
fn a_distributional_head_gives_each_actions_expected_value() {
    let values = [-1.0f32, 0.0, 0.5, 2.0, 4.0];
    let config = QNetworkConfig::mlp(vec![8]);
    let norm = NormConfig::from(NormKind::LayerNorm);
    let shape = (&[3][..], 2);
    let net = QNetwork::distributional(&config, &norm, shape, &values, 3, &Device::Cpu).unwrap();
    let x = Tensor::new(&[[0.3f32, -1.0, 2.0], [1.5, 0.2, -0.7]], &Device::Cpu).unwrap();
    let logits = net.forward_logits(&x, Pass::EVAL).unwrap();
    assert_eq!(logits.dims(), &[2, 2, 5]);
    let q = net
        .forward(&x, Pass::EVAL)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let logits = logits.to_vec3::<f32>().unwrap();
    for (row, q_row) in logits.iter().zip(&q) {
        for (l, &q) in row.iter().zip(q_row) {
            let top = l.iter().cloned().fold(f32::MIN, f32::max);
            let w: Vec<f64> = l.iter().map(|&v| f64::from(v - top).exp()).collect();
            let total: f64 = w.iter().sum();
            let mean: f64 = w.iter().zip(values).map(|(w, z)| w * f64::from(z)).sum();
            assert!(
                (mean / total - f64::from(q)).abs() < 1e-5,
                "{q} vs {}",
                mean / total
            );
        }
    }
    // A scalar network has no logits to give.
    let scalar = QNetwork::new(&config, &norm, &[3], 2, 3, &Device::Cpu).unwrap();
    assert!(scalar.forward_logits(&x, Pass::EVAL).is_err());
}

/// The update's settings for the tests below: `loss`, Double DQN, the joint forward
/// and the target network as given, gamma 0.9.
fn update_config(
    loss: ValueLoss,
    (double_dqn, joint_forward): (bool, bool),
    target_update: TargetUpdate,
) -> DqnConfig {
    DqnConfig {
        loss,
        double_dqn,
        joint_forward,
        target_update,
        gamma: 0.9,
        ..Default::default()
    }
}

/// Six updates of `dqn` on `batch`: their losses and the head's weights after.
fn six_updates(mut dqn: Dqn, batch: &Batch) -> (Vec<f64>, Vec<f32>) {
    let losses = (0..6)
        .map(|_| dqn.update(batch).unwrap().td_loss.value().unwrap())
        .collect();
    let head = dqn.online().store().get("head.weight").unwrap();
    let head = head.var.as_tensor().flatten_all().unwrap();
    (losses, head.to_vec1::<f32>().unwrap())
}

/// 16 transitions, each ending its episode with reward `0.1 i`: with `gamma = 0` the
/// target is the reward itself, so a distribution fitted to it has the reward as its
/// expected value.
fn terminal_batch() -> Batch {
    let mut batch = Batch::new(16, 3);
    for i in 0..16 {
        let x = i as f32 / 8.0 - 1.0;
        batch.obs[i * 3..][..3].copy_from_slice(&[x, x * x, 1.0 - x]);
        batch.next_obs[i * 3..][..3].copy_from_slice(&[-x, 0.5, x]);
        batch.actions[i] = (i % 2) as u32;
        batch.rewards[i] = 0.1 * i as f32;
        batch.terminated[i] = 1.0;
    }
    batch
}

/// [`terminal_batch`] with every other transition bootstrapping.
fn half_terminal_batch() -> Batch {
    let mut batch = terminal_batch();
    batch
        .terminated
        .iter_mut()
        .step_by(2)
        .for_each(|t| *t = 0.0);
    batch
}

#[test]
fn c51_and_hl_gauss_fit_terminal_rewards() {
    for loss in [ValueLoss::C51, ValueLoss::HlGauss] {
        let config = DqnConfig {
            loss,
            support: Support {
                atoms: 41,
                v_min: -1.0,
                v_max: 3.0,
            },
            ..Default::default()
        };
        // An MLP's distributional head takes the host path.
        let mut dqn = agent(NormKind::None, &config).unwrap();
        assert_eq!(dqn.engine(), Engine::Host);
        let batch = terminal_batch();
        let first = dqn.update(&batch).unwrap().td_loss.value().unwrap();
        let mut last = first;
        for _ in 0..1500 {
            last = dqn.update(&batch).unwrap().td_loss.value().unwrap();
        }
        assert!(last < first, "{loss:?}: loss {first} -> {last}");
        for i in 0..16 {
            let q = dqn.q_values(&batch.obs[i * 3..][..3]).unwrap();
            let taken = q[batch.actions[i] as usize];
            let reward = batch.rewards[i];
            assert!(
                (taken - reward).abs() < 0.05,
                "{loss:?}: transition {i}: Q {taken} against reward {reward}"
            );
        }
    }
}

/// XQC's joint forward of a distributional head with a target network: with
/// row-independent layers it is the plain update (the same weights after 6 updates),
/// for both losses, with and without Double DQN; without a target network the targets
/// come from the online network's own second half, another update.
#[test]
fn a_joint_forward_of_a_distributional_head_bootstraps_from_the_target() {
    let batch = half_terminal_batch();
    let train = |loss, double_dqn, joint_forward, target_update| {
        let config = update_config(loss, (double_dqn, joint_forward), target_update);
        six_updates(agent(NormKind::LayerNorm, &config).unwrap(), &batch).1
    };
    let largest = |a: &[f32], b: &[f32]| {
        let d = a.iter().zip(b).map(|(x, y)| (x - y).abs());
        d.fold(0f32, f32::max)
    };
    let hard = TargetUpdate::Hard { every: 100 };
    for loss in [ValueLoss::C51, ValueLoss::HlGauss] {
        for double in [false, true] {
            let joint = train(loss, double, true, hard);
            let plain = train(loss, double, false, hard);
            let d = largest(&joint, &plain);
            assert!(d < 1e-5, "{loss:?} double={double}: {d}");
        }
        let own = train(loss, false, true, TargetUpdate::None);
        let d = largest(&own, &train(loss, false, true, hard));
        assert!(d > 1e-4, "{loss:?}: {d}");
    }
}

/// The host path's distributional update (its logits, softmax, targets and the loss's
/// gradient `(p - m) / B` written on host buffers) is the graph's: the same weights
/// after 6 updates to rounding, for both losses, with Double DQN, and with XQC's joint
/// forward beside a Polyak target, with layer norm and with batch norm in train mode.
#[test]
fn the_host_paths_distributional_update_is_the_graphs() {
    let batch = half_terminal_batch();
    let polyak = TargetUpdate::Polyak { tau: 0.05 };
    let hard = TargetUpdate::Hard { every: 3 };
    let cases = [
        (NormKind::LayerNorm, false, false, hard),
        (NormKind::LayerNorm, true, false, hard),
        (NormKind::BatchNorm, false, true, polyak),
        (NormKind::BatchNorm, true, true, TargetUpdate::None),
    ];
    for loss in [ValueLoss::C51, ValueLoss::HlGauss] {
        for (kind, double_dqn, joint_forward, target_update) in cases {
            let double_dqn = double_dqn && target_update != TargetUpdate::None;
            let config = update_config(loss, (double_dqn, joint_forward), target_update);
            let train = |engine| {
                let dqn = agent(kind, &config).unwrap().with_engine(engine).unwrap();
                six_updates(dqn, &batch)
            };
            let (host, graph) = (train(Engine::Host), train(Engine::CpuGraph));
            let case = format!("{loss:?} {kind:?} double={double_dqn} joint={joint_forward}");
            for (h, g) in host.0.iter().zip(&graph.0) {
                assert!(
                    (h - g).abs() < 1e-5 * g.abs().max(1.0),
                    "{case}: loss {h} vs {g}"
                );
            }
            let d = host.1.iter().zip(&graph.1).map(|(a, b)| (a - b).abs());
            let d = d.fold(0f32, f32::max);
            assert!(d < 1e-5, "{case}: weights apart by {d}");
        }
    }
}
