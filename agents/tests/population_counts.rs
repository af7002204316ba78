//! The two numbers that decide a population's speed on a GPU, counted on the CPU: the
//! tensor operations of a step (acting and one update) and its reads from the device,
//! the same for P = 1 and P = 64, and at most 60. One test in its own binary: the tensor counter is
//! the process's, and no other test may create tensors while it counts.

use candle_core::Device;
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig, ValueLoss};
use normrl_agents::nn::init::InitRng;
use normrl_agents::nn::{NormConfig, NormKind, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::population::count::{device_reads, tensors_created};
use normrl_agents::population::PopulationDqn;
use normrl_agents::replay::Batch;

/// Agent `agent`'s batch of `size` random transitions on observations of `obs_len`.
fn batch(size: usize, obs_len: usize, agent: u64) -> Batch {
    let mut rng = InitRng::new(agent);
    let mut b = Batch::new(size, obs_len);
    let mut normal = |n: usize| rng.normal(n, 1.0, &Device::Cpu).unwrap().to_vec1().unwrap();
    b.obs = normal(size * obs_len);
    b.next_obs = normal(size * obs_len);
    b.rewards = normal(size);
    for i in 0..size {
        b.actions[i] = (i % 3) as u32;
    }
    b
}

/// What a counted population trains: its loss, and whether through the tensor forms a
/// device runs (on the CPU too) rather than the CPU's fused ops.
#[derive(Clone, Copy)]
struct Path {
    loss: ValueLoss,
    tensor_forms: bool,
}

const FUSED: Path = Path {
    loss: ValueLoss::Huber,
    tensor_forms: false,
};

/// Tensors created and device reads of one step (the P greedy actions, one update)
/// of a population of `p`, after a first step that did the one-time initialization.
fn step_counts(
    network: &QNetworkConfig,
    obs: &[usize],
    kind: NormKind,
    path: Path,
    p: usize,
) -> (u64, u64) {
    // Batch renormalization reads its count until its warm-up ends (a fixed number of
    // reads, whatever P); counted here after it.
    let norm = NormConfig {
        brn_warmup: 0,
        ..NormConfig::from(kind)
    };
    let (optimizer, dqn) = (
        OptimizerConfig::default(),
        DqnConfig {
            loss: path.loss,
            ..DqnConfig::default()
        },
    );
    let config = AgentConfig {
        network,
        norm: &norm,
        optimizer: &optimizer,
        dqn: &dqn,
    };
    let agents: Vec<Dqn> = (0..p as u64)
        .map(|s| Dqn::new(config, obs, 3, s, &Device::Cpu).unwrap())
        .collect();
    let mut population = PopulationDqn::from_agents(&agents.iter().collect::<Vec<_>>()).unwrap();
    if path.tensor_forms {
        population = population.with_tensor_forms().unwrap();
    }
    let obs_len: usize = obs.iter().product();
    let batches: Vec<Batch> = (0..p as u64).map(|i| batch(8, obs_len, i)).collect();
    let observations: Vec<f32> = batches
        .iter()
        .flat_map(|b| b.obs[..obs_len].to_vec())
        .collect();
    let mut step = || {
        population.greedy_actions(&observations).unwrap();
        population.update(&batches).unwrap();
    };
    step();
    let (t0, r0) = (tensors_created(), device_reads());
    step();
    (tensors_created() - t0, device_reads() - r0)
}

#[test]
fn operations_and_reads_per_step_do_not_grow_with_the_population() {
    let mlp = (QNetworkConfig::mlp(vec![24, 16]), vec![5]);
    let cnn = (QNetworkConfig::minatar_cnn(), vec![4, 10, 10]);
    for (network, obs) in [mlp, cnn] {
        for kind in NormKind::ALL {
            let (ops, reads) = step_counts(&network, &obs, kind, FUSED, 1);
            let (ops_64, reads_64) = step_counts(&network, &obs, kind, FUSED, 64);
            let what = format!("{:?} {kind:?}", network.architecture);
            eprintln!("{what}: {ops} tensors, {reads} reads per step at P = 1 and {ops_64}, {reads_64} at P = 64");
            assert!(
                ops > 20,
                "{what}: {ops} tensors: the counter counts nothing"
            );
            assert_eq!(ops_64, ops, "{what}: operations per step grow with P");
            // The fused ops' explicit backward: a step in at most 60 operations (each
            // a kernel launch on a device), every method.
            assert!(ops <= 60, "{what}: {ops} tensors per step, more than 60");
            // The greedy actions are the step's one read; the update reads nothing.
            assert_eq!((reads, reads_64), (1, 1), "{what}");
        }
        distributional_counts(&network, &obs);
    }
}

/// A distributional loss on a device's path (the tensor forms, here on the CPU): its
/// targets are tensor ops, so the step still reads only the greedy actions, and it
/// costs about the operations of the regression loss on the same path (candle's
/// backward and the reference optimizer make more of them than the fused ops; on a GPU
/// the update's graph replays them as one launch), with no growth in P of its own.
fn distributional_counts(network: &QNetworkConfig, obs: &[usize]) {
    let kind = NormKind::BatchNorm;
    let counts = |loss| {
        let path = Path {
            loss,
            tensor_forms: true,
        };
        let (ops, reads) = step_counts(network, obs, kind, path, 1);
        let (ops_64, reads_64) = step_counts(network, obs, kind, path, 64);
        let what = format!("{:?} {kind:?} {loss:?}, tensor forms", network.architecture);
        eprintln!("{what}: {ops} tensors, {reads} reads per step at P = 1 and {ops_64}, {reads_64} at P = 64");
        assert_eq!((reads, reads_64), (1, 1), "{what}");
        (ops, ops_64, what)
    };
    let (regression, regression_64, _) = counts(ValueLoss::Huber);
    for loss in [ValueLoss::C51, ValueLoss::HlGauss] {
        let (ops, ops_64, what) = counts(loss);
        assert!(
            ops > 20,
            "{what}: {ops} tensors: the counter counts nothing"
        );
        assert_eq!(
            ops_64 - ops,
            regression_64 - regression,
            "{what}: grows with P"
        );
        assert!(
            ops <= regression + 20,
            "{what}: {ops} tensors, regression {regression}"
        );
    }
}
