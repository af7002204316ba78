//! Helpers shared by the agents' integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use candle_core::{Device, Tensor};
use normrl_agents::kernels::avx2::{on_path, paths};
use normrl_agents::nn::init::InitRng;
use normrl_agents::nn::{LinearMap, NormConfig, NormKind, ParamStore, WeightNorm};
use normrl_agents::optim::Optimizer;
use normrl_agents::replay::Batch;

pub const DEV: Device = Device::Cpu;

pub trait MaxAbs {
    fn max_abs(&self) -> f32;
}

impl MaxAbs for Tensor {
    /// The largest absolute value.
    fn max_abs(&self) -> f32 {
        self.abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }
}

pub fn linear() -> (LinearMap, Vec<usize>) {
    (LinearMap::Linear { n_in: 7, n_out: 5 }, vec![16, 7])
}

pub fn conv() -> (LinearMap, Vec<usize>) {
    let k = LinearMap::Conv2d {
        c_in: 3,
        c_out: 4,
        k: 3,
        stride: 1,
        padding: 0,
    };
    (k, vec![6, 3, 6, 6])
}

/// `||a - b|| / ||b||` (L2 over all values).
pub fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let sum_of_squares = |t: &Tensor| -> f64 {
        f64::from(
            t.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
        )
    };
    (sum_of_squares(&(a - b).unwrap()) / sum_of_squares(b).max(1e-30)).sqrt()
}

/// Max |a - b| over max |b| (0 when both are 0).
pub fn max_rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let diff = (a - b).unwrap().max_abs();
    if diff == 0.0 {
        0.0
    } else {
        diff / b.max_abs().max(1e-6)
    }
}

pub fn config(kind: NormKind) -> NormConfig {
    NormConfig::from(kind)
}

/// A loss with a fixed random upstream gradient: `L = sum(y * r)`.
pub fn loss_of(y: &Tensor, rng: &mut InitRng) -> Tensor {
    let r = rng.normal(y.shape().clone(), 1.0, &DEV).unwrap();
    (y * r).unwrap().sum_all().unwrap()
}

/// A weight-normed layer and what its gradient checks need.
pub struct WeightNormCase {
    /// The store that holds the layer's variables.
    pub store: ParamStore,
    pub wn: WeightNorm,
    /// An input of the layer.
    pub x: Tensor,
    /// The layer's variables `v` and `g`, to look their gradients up by.
    pub v: Tensor,
    pub g: Tensor,
}

/// A weight-normed `kernel` with `v ~ N(0, v_std)` and `g ~ N(0, 1)`, and an input of
/// `x_shape`, drawn in that order from `seed`.
pub fn weight_norm_case(
    kernel: LinearMap,
    x_shape: Vec<usize>,
    seed: u64,
    v_std: f64,
) -> WeightNormCase {
    let mut rng = InitRng::new(seed);
    let mut store = ParamStore::new(DEV);
    let v = rng.normal(kernel.weight_shape(), v_std, &DEV).unwrap();
    let g = rng.normal(kernel.units(), 1.0, &DEV).unwrap();
    let wn = WeightNorm::from_values(&mut store, "l", kernel, v, g).unwrap();
    let x = rng.normal(x_shape, 1.0, &DEV).unwrap();
    let var = |name: &str| store.get(name).unwrap().var.as_tensor().clone();
    let (v, g) = (var("l.v"), var("l.g"));
    WeightNormCase { store, wn, x, v, g }
}

/// One step of `opt` on the gradients of `loss`; the gradient norm it reports.
pub fn step_on(opt: &mut Optimizer, loss: &Tensor) -> f64 {
    let norm = opt.step(&loss.backward().unwrap()).unwrap();
    norm.value().unwrap()
}

/// Runs `check` on every path of the kernels' AVX2 dispatch this CPU can take, saying
/// which one failed.
pub fn on_every_path(check: impl Fn()) {
    for path in paths() {
        eprintln!("kernel path {path:?}");
        on_path(path, &check);
    }
}

/// What a batch-norm op gives, by name: its output, the gradients of its input and
/// parameters, its running statistics.
pub const BATCH_NORM_OUTPUTS: [&str; 6] = [
    "output",
    "dx",
    "dgamma",
    "dbeta",
    "running mean",
    "running var",
];

/// `||a - b||_2`: how far apart two lists of values are.
pub fn distance(a: &[f32], b: &[f32]) -> f64 {
    let squares = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2));
    squares.sum::<f64>().sqrt()
}

/// Agent `agent`'s batch of `size` for update `step`, observations of `obs` values
/// (binary frames where `binary`) and actions below `actions`: random, yet the same for
/// the same arguments, so a population's member and its agent alone see one batch.
pub fn batch(
    size: usize,
    obs: usize,
    binary: bool,
    agent: u64,
    step: u64,
    actions: usize,
) -> Batch {
    let mut rng = InitRng::new(1_000 * agent + step);
    let mut b = Batch::new(size, obs);
    let mut normal =
        |n: usize| -> Vec<f32> { rng.normal(n, 1.0, &Device::Cpu).unwrap().to_vec1().unwrap() };
    // Frames of a binary observation (MinAtar's) are 0 or 1; rewards stay normal.
    let frames = |v: Vec<f32>| match binary {
        true => v
            .into_iter()
            .map(|x| f32::from(u8::from(x > 1.0)))
            .collect(),
        false => v,
    };
    b.obs = frames(normal(size * obs));
    b.next_obs = frames(normal(size * obs));
    b.rewards = normal(size);
    for i in 0..size {
        let k = i as u64 + step;
        b.actions[i] = ((k + agent) % actions as u64) as u32;
        b.terminated[i] = if k.is_multiple_of(5) { 1.0 } else { 0.0 };
    }
    b
}
