//! The host path of MLP Q-networks (no graph) against candle's graph: the same
//! Q-values, gradients and updates (to 1e-5 relative), and the networks it declines.

mod common;
use common::*;

use candle_core::Tensor;
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig, Engine, TargetUpdate, ValueLoss};
use normrl_agents::kernels::avx2::{on_path, paths};
use normrl_agents::nn::init::InitRng;
use normrl_agents::nn::{
    BnStats, HostTape, NormConfig, NormKind, Pass, QNetwork, QNetworkConfig, SphereHead,
};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::replay::Batch;

fn norm(kind: NormKind) -> NormConfig {
    NormConfig {
        // A gain learning rate of its own, so that a gradient sent to the wrong
        // variable would show.
        g_lr_scale: 3.0,
        svb_interval: 2,
        // Batch renormalization's clip opens within the tests' updates.
        brn_warmup: 2,
        // Hyperspherical layers with SimbaV2's head, whose host loops the plain head
        // (every other method's) does not run.
        sphere_head: SphereHead::Scaled,
        ..NormConfig::from(kind)
    }
}

fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = InitRng::new(seed);
    rng.normal(n, 1.0, &DEV).unwrap().to_vec1().unwrap()
}

/// `|a - b| / max(|b|, floor)`.
fn relative(a: f64, b: f64, floor: f64) -> f64 {
    (a - b).abs() / b.abs().max(floor)
}

/// Max relative error of two host vectors (as tensors).
fn vec_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let t = |v: &[f32]| Tensor::from_slice(v, v.len(), &DEV).unwrap();
    max_rel_err(&t(a), &t(b))
}

#[test]
fn host_forward_and_backward_equal_the_graph() {
    on_every_path(|| {
        let (obs, actions, rows) = (5usize, 3usize, 16usize);
        for kind in NormKind::ALL {
            let net = QNetwork::new(
                &QNetworkConfig::mlp(vec![24, 12]),
                &norm(kind),
                &[obs],
                actions,
                7,
                &DEV,
            )
            .unwrap();
            assert!(net.runs_on_host(), "{kind:?}");
            let x = random_values(rows * obs, 1);
            let upstream = random_values(rows * actions, 2);
            let xt = Tensor::from_slice(&x, (rows, obs), &DEV).unwrap();
            // Past batch renormalization's warm-up; each forward below then starts from
            // the same running statistics (batch renormalization's output depends on them).
            for _ in 0..2 {
                net.forward(&xt, Pass::TRAIN).unwrap();
            }
            let state = net.store().to_map().unwrap();
            let restore = || net.store().load_map(&state).unwrap();
            for stats in [BnStats::Batch, BnStats::Running] {
                restore();
                let graph = net.forward(&xt, Pass::differentiable(stats)).unwrap();
                restore();
                let q = net.host_forward(&x, rows, stats, None).unwrap();
                let graph_q: Vec<f32> = graph.flatten_all().unwrap().to_vec1().unwrap();
                let e = vec_err(&q, &graph_q);
                assert!(e <= 1e-5, "{kind:?} {stats:?} Q-values: relative error {e}");
            }
            let mut tape = HostTape::default();
            restore();
            let q = net
                .host_forward(&x, rows, BnStats::Batch, Some(&mut tape))
                .unwrap();
            let host_grads = net.host_backward(tape, &upstream).unwrap();
            let up = Tensor::from_slice(&upstream, (rows, actions), &DEV).unwrap();
            restore();
            let graph = net.forward(&xt, Pass::TRAIN).unwrap();
            let graph_q: Vec<f32> = graph.flatten_all().unwrap().to_vec1().unwrap();
            assert!(vec_err(&q, &graph_q) <= 1e-5, "{kind:?} taped Q-values");
            let grads = (graph * up).unwrap().sum_all().unwrap().backward().unwrap();
            assert_eq!(
                host_grads.len(),
                net.store().trainable().count(),
                "{kind:?}: one gradient per trainable variable"
            );
            for p in net.store().trainable() {
                let expected: Vec<f32> = grads
                    .get(p.var.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let (_, got) = host_grads
                    .iter()
                    .find(|(id, _)| *id == p.var.id())
                    .unwrap_or_else(|| panic!("{kind:?}: no host gradient for {}", p.name));
                let e = vec_err(got, &expected);
                assert!(e <= 1e-5, "{kind:?} d{}: relative error {e}", p.name);
            }
        }
    });
}

fn agent(kind: NormKind, config: &DqnConfig, host: bool) -> Dqn {
    Dqn::new(
        AgentConfig {
            network: &QNetworkConfig::mlp(vec![32, 16]),
            norm: &norm(kind),
            optimizer: &OptimizerConfig {
                max_grad_norm: 1.0,
                ..Default::default()
            },
            dqn: config,
        },
        &[4],
        3,
        11,
        &DEV,
    )
    .unwrap()
    .with_engine(if host { Engine::Host } else { Engine::CpuGraph })
    .unwrap()
}

fn batch(size: usize, seed: u64) -> Batch {
    let mut batch = Batch::new(size, 4);
    batch.obs = random_values(size * 4, seed);
    batch.next_obs = random_values(size * 4, seed + 1000);
    batch.rewards = random_values(size, seed + 2000);
    for i in 0..size {
        batch.actions[i] = ((i * 7 + seed as usize) % 3) as u32;
        batch.terminated[i] = if (i + seed as usize).is_multiple_of(5) {
            1.0
        } else {
            0.0
        };
    }
    batch
}

/// `to` where `from` stands: both networks (buffers included), the optimizer's state
/// and the update counters.
fn sync(from: &Dqn, to: &mut Dqn) {
    to.online().copy_from(from.online()).unwrap();
    to.target().copy_from(from.target()).unwrap();
    let state = from.optimizer().state_tensors().unwrap();
    to.optimizer_mut().load_state_tensors(&state).unwrap();
    to.restore_counters(from.updates(), from.is_initialized());
}

/// Every value of `agent`'s online and target networks, buffers included.
fn network_values(agent: &Dqn) -> Vec<f32> {
    let nets = [agent.online(), agent.target()];
    let params = nets.into_iter().flat_map(|n| n.store().params());
    params
        .flat_map(|p| {
            let t = p.var.as_tensor().flatten_all().unwrap();
            t.to_vec1::<f32>().unwrap()
        })
        .collect()
}

/// Every trainable variable's values.
fn trainables(agent: &Dqn) -> Vec<Vec<f32>> {
    let store = agent.online().store();
    let values = store.trainable().map(|p| p.var.as_tensor().flatten_all());
    values.map(|t| t.unwrap().to_vec1().unwrap()).collect()
}

/// One update of `host` and of `graph` (first set to where `host` stands) on `b`: the
/// same targets, loss, mean Q and gradient norm (1e-5 relative), projections and syncs,
/// and the networks' change to 1e-3 of its norm (the few weights whose normalized step
/// can differ by rounding are a small part of it; a wrong gradient is all of it).
fn one_update_from_the_same_state(host: &mut Dqn, graph: &mut Dqn, b: &Batch, what: &str) {
    sync(host, graph);
    let start = network_values(host);
    let targets = |dqn: &Dqn| -> Vec<f32> { dqn.td_targets(b).unwrap() };
    let e = vec_err(&targets(host), &targets(graph));
    assert!(e <= 1e-5, "{what} targets: relative error {e}");
    let (h, g) = (host.update(b).unwrap(), graph.update(b).unwrap());
    // The mean of Q-values of both signs can come near 0 (-2e-4 here), where the paths'
    // rounding (1e-8 absolute) reads as 1e-4 relative: it is judged against the
    // Q-values' own scale (0.01 and up). So is the loss near 0 (3.5e-5, of TD errors
    // near 1e-2, where hyperspherical layers' Q-values start): its floor is 1e-4.
    for (name, a, e, floor) in [
        ("loss", &h.td_loss, &g.td_loss, 1e-4),
        ("mean Q", &h.q_mean, &g.q_mean, 1e-2),
        ("gradient norm", &h.grad_norm, &g.grad_norm, 1e-6),
    ] {
        let r = relative(a.value().unwrap(), e.value().unwrap(), floor);
        assert!(
            r <= 1e-5,
            "{what} {name}: relative error {r} ({} vs {})",
            a.value().unwrap(),
            e.value().unwrap()
        );
    }
    assert_eq!((h.projected, h.synced), (g.projected, g.synced));
    let (a, b) = (network_values(host), network_values(graph));
    let (apart, moved) = (distance(&a, &b), distance(&a, &start));
    assert!(
        apart <= 1e-3 * moved,
        "{what}: the networks' change differs by {apart:e} of {moved:e}"
    );
}

#[test]
fn host_updates_equal_graph_updates() {
    on_every_path(|| {
        let configs = [
            DqnConfig {
                target_update: TargetUpdate::Hard { every: 3 },
                ..Default::default()
            },
            DqnConfig {
                double_dqn: true,
                loss: ValueLoss::Mse,
                target_update: TargetUpdate::Polyak { tau: 0.1 },
                target_bn_mode: BnStats::Batch,
                ..Default::default()
            },
            // Batch norm's running statistics in the update; weight norm still trains.
            DqnConfig {
                target_update: TargetUpdate::Hard { every: 3 },
                online_bn_mode: BnStats::Running,
                ..Default::default()
            },
        ];
        for (kind, config) in NormKind::ALL
            .into_iter()
            .flat_map(|k| configs.iter().map(move |c| (k, c)))
        {
            let mut host = agent(kind, config, true);
            let mut graph = agent(kind, config, false);
            let before: Vec<Tensor> = host
                .online()
                .store()
                .trainable()
                .map(|p| p.var.as_tensor().copy().unwrap())
                .collect();
            assert!(host.runs_on_host() && !graph.runs_on_host());
            let context = format!("{kind:?} {config:?}");
            // Each update from the same state (the graph agent set to where the host
            // agent stands), so that what is compared is one update's arithmetic in two
            // orders: values to rounding, 1e-5. Compared over a trajectory instead, a
            // gradient within rounding of 0 (Adam moves its weight by a sizeable part
            // of its learning rate either way) or a ReLU input at its kink starts two
            // trajectories that part by amounts that depend on the CPU.
            for (step, size) in [32usize, 32, 8, 32, 1, 32].into_iter().enumerate() {
                let what = format!("{context} step {step}");
                one_update_from_the_same_state(
                    &mut host,
                    &mut graph,
                    &batch(size, step as u64),
                    &what,
                );
            }
            // Every trainable variable moved (none was cut off from the loss).
            for (p, before) in host.online().store().trainable().zip(&before) {
                let moved = max_rel_err(p.var.as_tensor(), before);
                assert!(moved > 0.0, "{context}: {} did not change", p.name);
            }
            sync(&host, &mut graph);
            let obs = random_values(4, 99);
            let e = vec_err(
                &host.q_values(&obs).unwrap(),
                &graph.q_values(&obs).unwrap(),
            );
            assert!(e <= 1e-5, "{context} acting Q-values: relative error {e}");
        }
    });
}

#[test]
fn networks_outside_the_host_path_use_the_graph() {
    on_every_path(|| {
        let cnn = QNetwork::new(
            &QNetworkConfig::minatar_cnn(),
            &norm(NormKind::None),
            &[4, 10, 10],
            6,
            0,
            &DEV,
        )
        .unwrap();
        assert!(!cnn.runs_on_host());
        let err = cnn
            .host_forward(&[0.0; 400], 1, BnStats::Running, None)
            .unwrap_err();
        assert!(err.to_string().contains("host"), "{err}");
        // Such agents still update (through the graph), as do MLPs with the host path off.
        let mut dqn = Dqn::new(
            AgentConfig {
                network: &QNetworkConfig::mlp(vec![8]),
                norm: &norm(NormKind::WnMeanOnlyBn),
                optimizer: &OptimizerConfig::default(),
                dqn: &DqnConfig::default(),
            },
            &[4],
            3,
            0,
            &DEV,
        )
        .unwrap()
        .with_engine(Engine::CpuGraph)
        .unwrap();
        assert!(!dqn.runs_on_host());
        assert!(dqn
            .update(&batch(8, 1))
            .unwrap()
            .td_loss
            .value()
            .unwrap()
            .is_finite());
    });
}

/// The dispatch's copies promise the same result on every path (no fused multiply-adds,
/// a fixed order of additions): host updates of every method (Adam) on each path this
/// CPU can take, bit for bit, so that a run does not depend on whether the CPU has AVX2.
#[test]
fn every_kernel_path_gives_the_same_updates_bit_for_bit() {
    let config = DqnConfig {
        target_update: TargetUpdate::Hard { every: 3 },
        ..Default::default()
    };
    for kind in NormKind::ALL {
        let run = |path| {
            on_path(path, || {
                let mut host = agent(kind, &config, true);
                let losses: Vec<f64> = (0..6u64)
                    .map(|step| {
                        host.update(&batch(16, step))
                            .unwrap()
                            .td_loss
                            .value()
                            .unwrap()
                    })
                    .collect();
                let weights = trainables(&host);
                (
                    losses,
                    weights,
                    host.q_values(&random_values(4, 99)).unwrap(),
                )
            })
        };
        let baseline = run(paths()[0]);
        for path in paths() {
            assert_eq!(run(path), baseline, "{kind:?} on {path:?}");
        }
    }
}

/// MinAtar's CNN on the graph engine (the fused ops on 4-d feature maps) with centered
/// RMSprop: the same updates on every kernel path, bit for bit.
#[test]
fn every_kernel_path_gives_the_same_cnn_updates_bit_for_bit() {
    let config = DqnConfig {
        target_update: TargetUpdate::Hard { every: 3 },
        ..Default::default()
    };
    let optimizer = OptimizerConfig {
        kind: normrl_agents::optim::OptimizerKind::Rmsprop,
        centered: true,
        max_grad_norm: 1.0,
        ..Default::default()
    };
    for kind in [
        NormKind::BatchNorm,
        NormKind::LayerNorm,
        NormKind::WeightNorm,
        NormKind::GroupNorm,
    ] {
        let run = |path| {
            on_path(path, || {
                let (net, obs) = (QNetworkConfig::minatar_cnn(), [4, 10, 10]);
                let mut cnn = Dqn::new(
                    AgentConfig {
                        network: &net,
                        norm: &norm(kind),
                        optimizer: &optimizer,
                        dqn: &config,
                    },
                    &obs,
                    3,
                    5,
                    &DEV,
                )
                .unwrap();
                let frames = |seed| -> Vec<f32> {
                    let v = random_values(8 * 400, seed);
                    v.into_iter()
                        .map(|x| f32::from(u8::from(x > 1.0)))
                        .collect()
                };
                let losses: Vec<f64> = (0..4u64)
                    .map(|step| {
                        let mut b = batch(8, step);
                        b.obs = frames(step);
                        b.next_obs = frames(step + 100);
                        cnn.update(&b).unwrap().td_loss.value().unwrap()
                    })
                    .collect();
                let weights = trainables(&cnn);
                (losses, weights)
            })
        };
        let baseline = run(paths()[0]);
        for path in paths() {
            assert_eq!(run(path), baseline, "CNN {kind:?} on {path:?}");
        }
    }
}
