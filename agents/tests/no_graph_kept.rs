//! No tensor that lives from one update to the next holds a graph: the population's
//! update with the optimizer's tensor path (the path an accelerator takes, forced on the
//! CPU here), over every kind of state a population keeps (moments of Adam and centered
//! RMSprop, running statistics, batch renormalization's count, Polyak and hard targets,
//! per-agent discounts and learning rates).
//!
//! Two checks, because either alone could miss a case. Every tensor the population
//! names as kept (`PopulationDqn::held_tensors`) is a variable or tracks no operation.
//! And the heap is flat: this binary counts live heap bytes (its global allocator),
//! and the bytes alive after 2N updates equal those after N to a few kilobytes. On the
//! CPU a tensor's storage is heap memory, so a graph kept anywhere (not only in a state
//! the population names: a cache, a metric, a closure) shows as growth, as it showed
//! on the GPU as device memory growing by the update's graph every step.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use candle_core::Device;
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig, TargetUpdate};
use normrl_agents::nn::{NormConfig, NormKind, QNetworkConfig};
use normrl_agents::optim::{OptimizerConfig, OptimizerKind};
use normrl_agents::population::PopulationDqn;
use normrl_agents::replay::Batch;

/// The system allocator, counting the bytes it holds.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ACTIONS: usize = 3;

/// One case: a network, a method, the DQN's and optimizer's settings, and whether the
/// agents' learning rates and discounts differ (per-agent tensors).
struct Case {
    network: QNetworkConfig,
    obs: Vec<usize>,
    norm: NormKind,
    dqn: DqnConfig,
    optimizer: OptimizerKind,
    per_agent: bool,
}

/// A population of two agents of `case` on the tensor optimizer.
fn population(case: &Case) -> PopulationDqn {
    let agents: Vec<Dqn> = [1u64, 2]
        .into_iter()
        .map(|seed| {
            let norm = NormConfig {
                brn_warmup: 3,
                ..NormConfig::from(case.norm)
            };
            let dqn = DqnConfig {
                gamma: if case.per_agent {
                    0.9 + 0.05 * seed as f64
                } else {
                    0.99
                },
                ..case.dqn.clone()
            };
            let optimizer = OptimizerConfig {
                kind: case.optimizer,
                lr: if case.per_agent {
                    1e-4 * seed as f64
                } else {
                    1e-4
                },
                max_grad_norm: 1.0,
                ..Default::default()
            };
            let (net, obs) = (&case.network, &case.obs);
            Dqn::new(
                AgentConfig {
                    network: net,
                    norm: &norm,
                    optimizer: &optimizer,
                    dqn: &dqn,
                },
                obs,
                ACTIONS,
                seed,
                &Device::Cpu,
            )
            .unwrap()
        })
        .collect();
    let population = PopulationDqn::from_agents(&agents.iter().collect::<Vec<_>>()).unwrap();
    population.with_tensor_optimizer().unwrap()
}

/// Live heap bytes after each of `updates` updates of `population`, checking after
/// every one that no kept tensor holds a graph.
fn live_bytes(population: &mut PopulationDqn, case: &Case, updates: u64) -> Vec<isize> {
    let (obs, binary) = (case.obs.iter().product(), case.obs.len() > 1);
    (0..updates)
        .map(|step| {
            let batches: Vec<Batch> = (0..2)
                .map(|i| common::batch(8, obs, binary, i, step, ACTIONS))
                .collect();
            let info = population.update(&batches).unwrap();
            info.td_losses().unwrap();
            drop((info, batches));
            for (name, t) in population.held_tensors() {
                assert!(
                    t.is_variable() || !t.track_op(),
                    "{:?}: {name} holds a graph after update {step}",
                    case.norm
                );
            }
            LIVE.load(Ordering::Relaxed)
        })
        .collect()
}

fn cases() -> Vec<Case> {
    let mlp = || (QNetworkConfig::mlp(vec![24, 16]), vec![5]);
    let cnn = || (QNetworkConfig::minatar_cnn(), vec![4, 10, 10]);
    let hard = DqnConfig {
        target_update: TargetUpdate::Hard { every: 4 },
        double_dqn: true,
        ..Default::default()
    };
    let polyak = DqnConfig {
        target_update: TargetUpdate::Polyak { tau: 0.05 },
        ..Default::default()
    };
    let case = |(network, obs), norm, dqn: &DqnConfig, optimizer, per_agent| Case {
        network,
        obs,
        norm,
        dqn: dqn.clone(),
        optimizer,
        per_agent,
    };
    vec![
        case(mlp(), NormKind::None, &hard, OptimizerKind::Adam, true),
        case(
            mlp(),
            NormKind::WeightNorm,
            &polyak,
            OptimizerKind::Adam,
            false,
        ),
        case(
            mlp(),
            NormKind::BatchRenorm,
            &hard,
            OptimizerKind::Rmsprop,
            true,
        ),
        case(
            cnn(),
            NormKind::BatchNorm,
            &hard,
            OptimizerKind::Rmsprop,
            false,
        ),
        case(
            cnn(),
            NormKind::LayerNorm,
            &polyak,
            OptimizerKind::Rmsprop,
            true,
        ),
    ]
}

/// One test, so that no other test's allocations run beside the count.
#[test]
fn no_state_kept_across_updates_holds_a_graph() {
    for case in cases() {
        let mut population = population(&case);
        // Warm up first: candle's and the allocator's first-use caches, batch
        // renormalization's warm-up, the first target syncs.
        let live = live_bytes(&mut population, &case, 60);
        let (at_20, at_40, at_60) = (live[19], live[39], live[59]);
        eprintln!(
            "{:?}: live heap bytes after 20, 40, 60 updates: {at_20}, {at_40}, {at_60}",
            case.norm
        );
        // An update's graph holds its activations: kilobytes for the MLP, hundreds of
        // kilobytes for the CNN, so 20 kept graphs are far beyond this.
        for (from, to) in [(at_20, at_40), (at_40, at_60)] {
            assert!(
                to - from < 8 * 1024,
                "{:?}: the heap grew by {} bytes over 20 updates",
                case.norm,
                to - from
            );
        }
    }
}
