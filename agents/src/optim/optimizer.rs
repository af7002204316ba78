//! The optimizer over one network's trainable variables.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{Role, ParamStore};
//! use normrl_agents::optim::{Optimizer, OptimizerConfig};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let x = store.add("x", Tensor::new(&[3.0f32], &Device::Cpu).unwrap(), Role::Weight).unwrap();
//! let config = OptimizerConfig { lr: 0.1, max_grad_norm: 0.0, ..Default::default() };
//! let mut opt = Optimizer::new(&store, &config, 1.0);
//! for _ in 0..100 {
//!     let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
//!     opt.step(&loss.backward().unwrap()).unwrap();
//! }
//! assert!(x.as_tensor().to_vec1::<f32>().unwrap()[0].abs() < 0.5);
//! ```

use std::cell::RefCell;
use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, Layout, Result, Storage, Tensor, Var};

use super::staggered::Staggered;
use super::{OptimizerConfig, OptimizerKind};
#[cfg(any(test, feature = "cuda"))]
use crate::kernels::cuda::optimizer::StepCoefficients;
use crate::kernels::dense::{f32_slice_mut, lane_sum};
use crate::nn::{HostGradients, ParamStore, Role};
use crate::Metric;

/// Per-variable state: Adam's `(m, v)` or RMSprop's `(square_avg, grad_avg)`.
enum State {
    Host([Staggered; 2]),
    Device([Tensor; 2]),
}

/// Where the two state vectors start within a 4 KiB page: apart from each other and
/// from the page boundary, where large parameters and gradients start (see
/// [`Staggered`]).
const STATE_PAGE_OFFSETS: [usize; 2] = [1024, 2048];

struct Slot {
    name: String,
    var: Var,
    lr_scale: f64,
    state: State,
}

pub struct Optimizer {
    config: OptimizerConfig,
    slots: Vec<Slot>,
    steps: u64,
    store: ParamStore,
    /// Built as the tensor-op reference ([`Self::reference`]): never a fused step (read
    /// where a device has one).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    reference: bool,
    /// What the CUDA step reads that changes from step to step, `[3]` on the device:
    /// Adam's bias corrections and the schedule's factor on the learning rate, written
    /// before each step's launches (or their replay).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    device_bias: Option<Tensor>,
}

/// The hyperparameters of one update, for the fused loop.
#[derive(Clone, Copy)]
struct Coefficients {
    kind: OptimizerKind,
    lr: f32,
    grad_scale: f32,
    b1: f32,
    b2: f32,
    bias1: f32,
    bias2_sqrt: f32,
    eps: f32,
    alpha: f32,
    centered: bool,
}

crate::kernels::avx2::dispatch! {
    /// One optimizer step over a variable's values, elementwise (so AVX2 or not, the
    /// result is the same).
    fn update(
        c: &Coefficients,
        p: &mut [f32],
        g: &[f32],
        s0: &mut [f32],
        s1: &mut [f32],
    ) {
        match c.kind {
            OptimizerKind::Adam => {
                let values = p.iter_mut().zip(g).zip(s0.iter_mut().zip(s1.iter_mut()));
                values.for_each(|((p, &g), (m, v))| c.adam(p, g, m, v));
            }
            // Exact only with `eps > 0`: at `eps = 0` a zero state makes 0/0.
            OptimizerKind::Rmsprop if c.eps > 0.0 => {
                rmsprop_skipping_zeros(c, p, g, [s0, s1]);
            }
            OptimizerKind::Rmsprop => {
                let values = p.iter_mut().zip(g).zip(s0.iter_mut().zip(s1.iter_mut()));
                values.for_each(|((p, &g), (sq, ga))| c.rmsprop(p, g, sq, ga));
            }
        }
    }
}

/// Values per block of [`rmsprop_skipping_zeros`]: the zero check's granularity, and
/// fixed-size arrays that the compiler vectorizes whole.
const BLOCK: usize = 32;

/// RMSprop's step over every value, where a block's gradients are all zero by
/// [`Coefficients::rmsprop_at_zero`]: the same values, bit for bit, without the
/// division and the square root. At batch 1 much of a layer's gradient is zero (a unit
/// whose ReLU was off, an input that was 0): measured on MinAtar Breakout at batch 1,
/// 10% (batch norm) to 27% (none, weight norm) more frames per second, and no change at
/// batch 4 and 32 (`docs/performance.md`, "Zero gradients at batch 1"). Taking the
/// gradient norm in this pass too, rather than in a pass of its own, made batch 4 and
/// 32 slower: the loop is bound by its arithmetic, not by reading the gradient.
#[inline(always)]
fn rmsprop_skipping_zeros(c: &Coefficients, p: &mut [f32], g: &[f32], [s0, s1]: [&mut [f32]; 2]) {
    let blocks = g.len() / BLOCK * BLOCK;
    let (p, p_rest) = p.split_at_mut(blocks);
    let (s0, s0_rest) = s0.split_at_mut(blocks);
    let (s1, s1_rest) = s1.split_at_mut(blocks);
    let (g, g_rest) = g.split_at(blocks);
    let states = s0.chunks_exact_mut(BLOCK).zip(s1.chunks_exact_mut(BLOCK));
    for ((p, g), (s0, s1)) in p
        .chunks_exact_mut(BLOCK)
        .zip(g.chunks_exact(BLOCK))
        .zip(states)
    {
        let p: &mut [f32; BLOCK] = p.try_into().expect("a whole block");
        let g: &[f32; BLOCK] = g.try_into().expect("a whole block");
        let s0: &mut [f32; BLOCK] = s0.try_into().expect("a whole block");
        let s1: &mut [f32; BLOCK] = s1.try_into().expect("a whole block");
        match g.iter().fold(false, |any, &g| any | (g != 0.0)) {
            true => (0..BLOCK).for_each(|i| c.rmsprop(&mut p[i], g[i], &mut s0[i], &mut s1[i])),
            false => {
                (0..BLOCK).for_each(|i| c.rmsprop_at_zero(&mut p[i], g[i], &mut s0[i], &mut s1[i]))
            }
        }
    }
    let rest = p_rest
        .iter_mut()
        .zip(g_rest)
        .zip(s0_rest.iter_mut().zip(s1_rest));
    rest.for_each(|((p, &g), (sq, ga))| c.rmsprop(p, g, sq, ga));
}

/// Below this, a state value (a moment estimate, a running average of squares) is set
/// to 0. A weight whose gradient stops (an input that stays 0, a dead unit) has its
/// state decay geometrically through the subnormal range, where every operation costs
/// tens of times more: measured, a tenth of MinAtar Breakout's training time. Flushed
/// there, the state moves a weight by at most `lr * 1e-36 / eps` per step.
const STATE_FLUSH: f32 = 1e-36;

/// `x`, or 0 where `|x| <` [`STATE_FLUSH`].
#[inline(always)]
fn flushed(x: f32) -> f32 {
    if x.abs() < STATE_FLUSH {
        0.0
    } else {
        x
    }
}

impl Coefficients {
    /// Adam's step of one value. A product instead of a second division: division and
    /// sqrt are the loop's cost.
    #[inline(always)]
    fn adam(&self, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        let (b1, b2) = (self.b1, self.b2);
        let g = g * self.grad_scale;
        *m = flushed(b1 * *m + (1.0 - b1) * g);
        *v = flushed(b2 * *v + (1.0 - b2) * g * g);
        *p -= self.lr / self.bias1 * *m / (v.sqrt() * (1.0 / self.bias2_sqrt) + self.eps);
    }

    /// RMSprop's step of one value (centered: `ga`, the running mean of the gradient).
    #[inline(always)]
    fn rmsprop(&self, p: &mut f32, g: f32, sq: &mut f32, ga: &mut f32) {
        let alpha = self.alpha;
        let g = g * self.grad_scale;
        *sq = flushed(alpha * *sq + (1.0 - alpha) * g * g);
        let var = if self.centered {
            *ga = flushed(alpha * *ga + (1.0 - alpha) * g);
            *sq - *ga * *ga
        } else {
            *sq
        };
        *p -= self.lr * g / (var.max(0.0).sqrt() + self.eps);
    }

    /// [`Self::rmsprop`] where `g` is ±0, bit for bit (with `eps > 0`): the averages
    /// only decay (`x + 0 = x` for the non-negative square's average, and for the
    /// gradient's, which a flush never leaves at -0) and the weight moves by `lr g`,
    /// ±0 as the division's result is (its sign kept, for `-0 - -0`).
    #[inline(always)]
    fn rmsprop_at_zero(&self, p: &mut f32, g: f32, sq: &mut f32, ga: &mut f32) {
        let alpha = self.alpha;
        *sq = flushed(alpha * *sq);
        if self.centered {
            *ga = flushed(alpha * *ga);
        }
        *p -= self.lr * (g * self.grad_scale);
    }
}

crate::kernels::avx2::dispatch! {
    /// `sum(x^2)` in `f64`, over eight interleaved partial sums so that it vectorizes;
    /// the order of additions is fixed, so the result does not depend on the CPU.
    fn sum_of_squares(x: &[f32]) -> f64 {
        lane_sum(x, x, |v, _| f64::from(v) * f64::from(v))
    }
}

/// Runs `f` on a CPU tensor's `f32` values; `None` on other devices, where the
/// update falls back to tensor ops (unlike `kernels::with_values`, which refuses them).
fn with_cpu_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<Option<R>> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => Ok(Some(f(&v[a..b]))),
        _ => Ok(None),
    }
}

/// The in-place update of one variable from its gradient and host state: one set of
/// coefficients for a single network, or one per agent for a population's variable
/// (its values are the agents' in turn, each a contiguous run).
struct FusedUpdate<'a> {
    grad: &'a [f32],
    state: RefCell<&'a mut [Staggered; 2]>,
    coefficients: &'a [Coefficients],
}

impl candle_core::InplaceOp1 for FusedUpdate<'_> {
    fn name(&self) -> &'static str {
        "fused-optimizer-update"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let p = f32_slice_mut(storage, layout)?;
        let mut state = self.state.borrow_mut();
        let [s0, s1] = &mut **state;
        let n = p.len() / self.coefficients.len().max(1);
        if n * self.coefficients.len() != p.len() || self.grad.len() != p.len() {
            candle_core::bail!(
                "fused optimizer: {} values, {} gradients, {} agents",
                p.len(),
                self.grad.len(),
                self.coefficients.len()
            );
        }
        let runs = p.chunks_mut(n).zip(self.grad.chunks(n));
        let states = s0
            .as_mut_slice()
            .chunks_mut(n)
            .zip(s1.as_mut_slice().chunks_mut(n));
        for ((c, (p, g)), (s0, s1)) in self.coefficients.iter().zip(runs).zip(states) {
            update(c, p, g, s0, s1);
        }
        Ok(())
    }
}

/// Every trainable variable's gradient: from candle's backward, or from the host path's.
pub enum Gradients {
    Graph(GradStore),
    Host(HostGradients),
}

impl Optimizer {
    /// One step with `grads`, whichever path computed them; returns the gradient norm
    /// before clipping.
    pub fn apply(&mut self, grads: &Gradients) -> Result<Metric> {
        match grads {
            Gradients::Graph(grads) => self.step(grads),
            Gradients::Host(grads) => self.step_host(grads),
        }
    }

    /// An optimizer over `store`'s trainable variables; weight-norm gains get
    /// `lr * g_lr_scale`. Uses the fused loop when the variables live on the CPU.
    pub fn new(store: &ParamStore, config: &OptimizerConfig, g_lr_scale: f64) -> Self {
        Self::build(store, config, g_lr_scale, false)
    }

    /// The tensor-op implementation, whatever the device (the fused loop's reference).
    pub fn reference(
        store: &ParamStore,
        config: &OptimizerConfig,
        g_lr_scale: f64,
    ) -> Result<Self> {
        Ok(Self::build(store, config, g_lr_scale, true))
    }

    fn build(
        store: &ParamStore,
        config: &OptimizerConfig,
        g_lr_scale: f64,
        reference: bool,
    ) -> Self {
        let fused = !reference && store.device().is_cpu();
        let slots = store
            .trainable()
            .map(|p| {
                let n = p.var.elem_count();
                let state = if fused {
                    State::Host(STATE_PAGE_OFFSETS.map(|at| Staggered::zeros(n, at)))
                } else {
                    let z = p
                        .var
                        .as_tensor()
                        .zeros_like()
                        .expect("zeros on the variable's device");
                    State::Device([z.clone(), z])
                };
                Slot {
                    name: p.name.clone(),
                    var: p.var.clone(),
                    lr_scale: if p.role == Role::Gain {
                        g_lr_scale
                    } else {
                        1.0
                    },
                    state,
                }
            })
            .collect();
        Self {
            config: config.clone(),
            slots,
            steps: 0,
            store: store.clone(),
            reference,
            device_bias: None,
        }
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The state this optimizer keeps from one step to the next as tensors (the
    /// moments of the tensor path; none for the fused loop's host state), by name. None
    /// of them may hold a graph: see `agents/tests/no_graph_kept.rs`.
    pub fn held_tensors(&self) -> Vec<(String, Tensor)> {
        let mut held = Vec::new();
        for slot in &self.slots {
            if let State::Device(state) = &slot.state {
                for (i, t) in state.iter().enumerate() {
                    held.push((format!("{}.state{i}", slot.name), t.clone()));
                }
            }
        }
        held
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// The global L2 norm of the gradients of this optimizer's variables.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let mut sum = 0.0f64;
        for slot in &self.slots {
            if let Some(g) = grads.get(slot.var.as_tensor()) {
                let host = with_cpu_slice(g, sum_of_squares)?;
                sum += match host {
                    Some(s) => s,
                    None => f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?),
                };
            }
        }
        Ok(sum.sqrt())
    }

    /// The global gradient norm and clipping factor as device scalars (no wait for
    /// the device), for optimizers whose state lives off the CPU.
    fn device_norm_and_scale(&self, grads: &GradStore) -> Result<(Tensor, Option<Tensor>)> {
        let mut sum: Option<Tensor> = None;
        for slot in &self.slots {
            if let Some(g) = grads.get(slot.var.as_tensor()) {
                let s = g.detach().sqr()?.sum_all()?;
                sum = Some(match sum {
                    None => s,
                    Some(t) => (t + s)?,
                });
            }
        }
        let norm = match sum {
            Some(s) => s.sqrt()?,
            None => Tensor::new(0f32, self.store.device())?,
        };
        let scale = super::clip::scale_tensor(&norm, self.config.max_grad_norm)?;
        Ok((norm, scale))
    }

    /// One update from `grads`. Returns the gradient norm before clipping.
    pub fn step(&mut self, grads: &GradStore) -> Result<Metric> {
        let on_host = self.store.device().is_cpu();
        let (norm, device_scale) = if on_host {
            (Metric::Host(self.grad_norm(grads)?), None)
        } else {
            let (norm, scale) = self.device_norm_and_scale(grads)?;
            (Metric::Device(norm), scale)
        };
        let grad_scale = match norm {
            Metric::Host(norm) => self.clipping_scale(norm),
            Metric::Device(_) => 1.0,
        };
        let base = self.next_coefficients(grad_scale);
        let lr = self.scheduled_lr();
        for slot in &mut self.slots {
            let Some(grad) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            let coefficients = Coefficients {
                lr: (lr * slot.lr_scale) as f32,
                ..base
            };
            match &mut slot.state {
                State::Host(state) => {
                    let grad = grad.contiguous()?;
                    let done =
                        with_cpu_slice(&grad, |g| update_host(&slot.var, state, g, coefficients))?;
                    match done {
                        Some(r) => r?,
                        None => candle_core::bail!("fused optimizer: gradient is not on the CPU"),
                    }
                }
                State::Device(state) => {
                    // A variable's gradient from candle's backward is not detached (only
                    // the inner nodes' are): it holds the update's graph, activations and
                    // all. The moments made from it are kept as the next step's state, so
                    // undetached they would keep every step's graph alive, for ever.
                    let grad = grad.detach();
                    let grad = match &device_scale {
                        Some(scale) => grad.broadcast_mul(scale)?,
                        None => grad,
                    };
                    tensor_update(&slot.var, &grad, state, &coefficients)?;
                }
            }
        }
        self.store.bump_version();
        Ok(norm)
    }

    /// One update from gradients on the host (see [`crate::nn::QNetwork::host_backward`]),
    /// the same as [`Self::step`] with those gradients. CPU optimizers only. Returns the
    /// gradient norm before clipping.
    pub fn step_host(&mut self, grads: &HostGradients) -> Result<Metric> {
        let grad_of = |var: &Var| {
            grads
                .iter()
                .find(|(id, _)| *id == var.id())
                .map(|(_, g)| g.as_slice())
        };
        let mut sum = 0.0f64;
        for slot in &self.slots {
            if let Some(g) = grad_of(&slot.var) {
                if g.len() != slot.var.elem_count() {
                    candle_core::bail!(
                        "optimizer: {} gradient values for '{}' of {}",
                        g.len(),
                        slot.name,
                        slot.var.elem_count()
                    );
                }
                sum += sum_of_squares(g);
            }
        }
        let norm = sum.sqrt();
        let base = self.next_coefficients(self.clipping_scale(norm));
        let lr = self.scheduled_lr();
        for slot in &mut self.slots {
            let Some(g) = grad_of(&slot.var) else {
                continue;
            };
            let State::Host(state) = &mut slot.state else {
                candle_core::bail!("optimizer: host gradients for state on a device");
            };
            let coefficients = Coefficients {
                lr: (lr * slot.lr_scale) as f32,
                ..base
            };
            update_host(&slot.var, state, g, coefficients)?;
        }
        self.store.bump_version();
        Ok(Metric::Host(norm))
    }

    /// One step of P agents' optimizers at once, over variables stacked on a leading
    /// population axis (agent `i`'s values the `i`-th run of each): each agent's
    /// gradients clipped to `max_grad_norm` by its own global norm, and its learning
    /// rate `lr * lr_ratios[i]`, exactly as its optimizer alone would step. In place on
    /// the host state, creating no tensor; `None` (nothing done) when the state lives on
    /// a device. Returns each agent's gradient norm before clipping.
    pub fn step_agents(
        &mut self,
        grads: &GradStore,
        agents: usize,
        max_grad_norm: f64,
        lr_ratios: Option<&[f64]>,
    ) -> Result<Option<Vec<f64>>> {
        if !self.slots.iter().all(|s| matches!(s.state, State::Host(_))) {
            return Ok(None);
        }
        let grads: Vec<Option<Tensor>> = self
            .slots
            .iter()
            .map(|s| {
                grads
                    .get(s.var.as_tensor())
                    .map(Tensor::contiguous)
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let mut sums = vec![0f64; agents];
        for g in grads.iter().flatten() {
            let per_agent = |v: &[f32]| {
                for (sum, run) in sums.iter_mut().zip(v.chunks(v.len() / agents.max(1))) {
                    *sum += sum_of_squares(run);
                }
            };
            if with_cpu_slice(g, per_agent)?.is_none() {
                candle_core::bail!("fused optimizer: gradient is not on the CPU");
            }
        }
        let norms: Vec<f64> = sums.iter().map(|s| s.sqrt()).collect();
        let base = self.next_coefficients(1.0);
        let lr = self.scheduled_lr();
        for (slot, grad) in self.slots.iter_mut().zip(&grads) {
            let (Some(grad), State::Host(state)) = (grad, &mut slot.state) else {
                continue;
            };
            let coefficients: Vec<Coefficients> = (0..agents)
                .map(|i| Coefficients {
                    lr: (lr * slot.lr_scale * lr_ratios.map_or(1.0, |r| r[i])) as f32,
                    grad_scale: super::clip::scale(norms[i], max_grad_norm) as f32,
                    ..base
                })
                .collect();
            let update = |g: &[f32]| {
                slot.var.as_tensor().inplace_op1(&FusedUpdate {
                    grad: g,
                    state: RefCell::new(state),
                    coefficients: &coefficients,
                })
            };
            with_cpu_slice(grad, update)?.transpose()?;
        }
        self.store.bump_version();
        Ok(Some(norms))
    }

    /// Counts a step and returns its hyperparameters as the population's CUDA step
    /// reads them (`kernels/cuda/optimizer.cu`): the base learning rate, each agent's
    /// clipping to `max_grad_norm`, the same at every step; and what the kernel reads
    /// from the device: this step's Adam bias corrections `1 - b1^t`, `sqrt(1 - b2^t)`
    /// and the learning rate's factor from its schedule.
    #[cfg(any(test, feature = "cuda"))]
    pub(crate) fn next_kernel_coefficients(
        &mut self,
        max_grad_norm: f64,
    ) -> (StepCoefficients, [f32; 3]) {
        let c = self.next_coefficients(1.0);
        let fixed = StepCoefficients {
            lr: self.config.lr,
            max_grad_norm,
            b1: c.b1,
            b2: c.b2,
            eps: c.eps,
            alpha: c.alpha,
            adam: i32::from(c.kind == OptimizerKind::Adam),
            centered: i32::from(c.centered),
        };
        let factor = self.config.lr_schedule.factor(self.steps) as f32;
        (fixed, [c.bias1, c.bias2_sqrt, factor])
    }

    /// Counts a step of [`Self::device_step`] and writes what changes from step to step
    /// (Adam's bias corrections) to the device: its host half, run before the step's
    /// device work (which a CUDA graph may replay). The step's fixed coefficients, or
    /// `None` where the fused device step does not run (not CUDA, or the reference).
    #[cfg(feature = "cuda")]
    pub(crate) fn prepare_device_step(
        &mut self,
        max_grad_norm: f64,
    ) -> Result<Option<StepCoefficients>> {
        let candle_core::Device::Cuda(_) = self.store.device() else {
            return Ok(None);
        };
        if self.reference {
            return Ok(None);
        }
        let (fixed, bias) = self.next_kernel_coefficients(max_grad_norm);
        let device = self.store.device().clone();
        let buffer = match &self.device_bias {
            Some(b) => b.clone(),
            None => Tensor::zeros(3, candle_core::DType::F32, &device)?,
        };
        crate::kernels::cuda::device::write(&buffer, &bias)?;
        self.device_bias = Some(buffer);
        Ok(Some(fixed))
    }

    /// [`Self::step_agents`] where the variables and state live on a CUDA device, its
    /// device half: the fused step's kernels over every variable at once, in place,
    /// with the coefficients [`Self::prepare_device_step`] gave; `lr_ratios` each
    /// agent's learning rate over the base one (f64, on the device). Reads and changes
    /// nothing on the host, so a CUDA graph can replay it. Returns each agent's
    /// gradient norm before clipping, `[P]` on the device.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_step(
        &self,
        grads: &GradStore,
        agents: usize,
        lr_ratios: Option<&Tensor>,
        c: StepCoefficients,
    ) -> Result<Tensor> {
        let candle_core::Device::Cuda(dev) = self.store.device() else {
            candle_core::bail!("the fused device step runs on CUDA");
        };
        let Some(bias) = &self.device_bias else {
            candle_core::bail!("the device step's coefficients were not prepared");
        };
        let mut vars = Vec::new();
        for slot in &self.slots {
            let (Some(g), State::Device([s0, s1])) = (grads.get(slot.var.as_tensor()), &slot.state)
            else {
                continue;
            };
            let g = g.detach().contiguous()?;
            let (p, lr_scale) = (slot.var.as_tensor().clone(), slot.lr_scale);
            vars.push((p, g, s0.clone(), s1.clone(), lr_scale));
        }
        crate::kernels::cuda::optimizer::step(dev, &vars, agents, (lr_ratios, bias), c)
    }

    /// After a step's variables changed in place: a new version of them (caches of
    /// values formed from them are stale).
    pub fn changed(&self) {
        self.store.bump_version();
    }

    /// The factor clipping gradients of global norm `norm` to `max_grad_norm`.
    fn clipping_scale(&self, norm: f64) -> f64 {
        super::clip::scale(norm, self.config.max_grad_norm)
    }

    /// The learning rate of the step counted last: `lr` times the schedule's factor.
    fn scheduled_lr(&self) -> f64 {
        self.config.lr * self.config.lr_schedule.factor(self.steps)
    }

    /// Counts a step and returns its coefficients (its scheduled learning rate, before
    /// per-variable scales).
    fn next_coefficients(&mut self, grad_scale: f64) -> Coefficients {
        self.steps += 1;
        let lr = self.scheduled_lr();
        let c = &self.config;
        let t = self.steps as i32;
        Coefficients {
            kind: c.kind,
            lr: lr as f32,
            grad_scale: grad_scale as f32,
            b1: c.betas.0 as f32,
            b2: c.betas.1 as f32,
            bias1: (1.0 - c.betas.0.powi(t)) as f32,
            bias2_sqrt: (1.0 - c.betas.1.powi(t)).sqrt() as f32,
            eps: match c.kind {
                OptimizerKind::Adam => c.adam_eps as f32,
                OptimizerKind::Rmsprop => c.rms_eps as f32,
            },
            alpha: c.rms_alpha as f32,
            centered: c.centered,
        }
    }

    /// The optimizer's state as named tensors, for checkpoints.
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut map = HashMap::new();
        for slot in &self.slots {
            let [a, b] = match &slot.state {
                State::Host([a, b]) => [
                    Tensor::from_slice(a.as_slice(), slot.var.shape(), &candle_core::Device::Cpu)?,
                    Tensor::from_slice(b.as_slice(), slot.var.shape(), &candle_core::Device::Cpu)?,
                ],
                State::Device([a, b]) => [a.clone(), b.clone()],
            };
            map.insert(format!("{}.state0", slot.name), a);
            map.insert(format!("{}.state1", slot.name), b);
        }
        map.insert(
            "steps".to_string(),
            Tensor::new(&[self.steps as f64], &candle_core::Device::Cpu)?,
        );
        Ok(map)
    }

    /// Restores what [`Self::state_tensors`] saved.
    pub fn load_state_tensors(&mut self, map: &HashMap<String, Tensor>) -> Result<()> {
        let get = |k: &str| {
            map.get(k)
                .ok_or_else(|| candle_core::Error::Msg(format!("optimizer checkpoint lacks '{k}'")))
        };
        for slot in &mut self.slots {
            let a = get(&format!("{}.state0", slot.name))?;
            let b = get(&format!("{}.state1", slot.name))?;
            slot.state = match &slot.state {
                State::Host(_) => {
                    let [a, b] = [a, b].map(|t| t.flatten_all()?.to_vec1::<f32>());
                    let [at_a, at_b] = STATE_PAGE_OFFSETS;
                    State::Host([
                        Staggered::from_slice(&a?, at_a),
                        Staggered::from_slice(&b?, at_b),
                    ])
                }
                State::Device(_) => {
                    let dev = slot.var.device();
                    State::Device([a.to_device(dev)?, b.to_device(dev)?])
                }
            };
        }
        self.steps = get("steps")?.to_vec1::<f64>()?[0] as u64;
        Ok(())
    }
}

/// The fused loop's update of `var` in place from host gradient values.
fn update_host(
    var: &Var,
    state: &mut [Staggered; 2],
    grad: &[f32],
    coefficients: Coefficients,
) -> Result<()> {
    var.as_tensor().inplace_op1(&FusedUpdate {
        grad,
        state: RefCell::new(state),
        coefficients: std::slice::from_ref(&coefficients),
    })
}

/// The same update as [`Coefficients::update`], in tensor ops.
fn tensor_update(
    var: &Var,
    grad: &Tensor,
    state: &mut [Tensor; 2],
    c: &Coefficients,
) -> Result<()> {
    let g = (grad.detach() * f64::from(c.grad_scale))?;
    let p = &var.as_tensor().detach();
    let new_p = match c.kind {
        OptimizerKind::Adam => {
            let (b1, b2) = (f64::from(c.b1), f64::from(c.b2));
            let m = ((&state[0] * b1)? + (&g * (1.0 - b1))?)?;
            let v = ((&state[1] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let denom = ((v.sqrt()? / f64::from(c.bias2_sqrt))? + f64::from(c.eps))?;
            let new_p = (p - ((&m / &denom)? * f64::from(c.lr / c.bias1))?)?;
            *state = [m, v];
            new_p
        }
        OptimizerKind::Rmsprop => {
            let a = f64::from(c.alpha);
            let sq = ((&state[0] * a)? + (g.sqr()? * (1.0 - a))?)?;
            let var_est = if c.centered {
                let ga = ((&state[1] * a)? + (&g * (1.0 - a))?)?;
                let v = (&sq - ga.sqr()?)?;
                state[1] = ga;
                v
            } else {
                sq.clone()
            };
            state[0] = sq;
            let denom = (var_est.relu()?.sqrt()? + f64::from(c.eps))?;
            (p - ((&g / &denom)? * f64::from(c.lr))?)?
        }
    };
    var.set(&new_p)
}

#[cfg(test)]
mod schedule_tests {
    use candle_core::Device;

    use super::*;
    use crate::optim::LrSchedule;

    /// With a constant gradient, each Adam step moves a value by `lr * g / (|g| + eps)`
    /// (the bias-corrected moments are `g` and `g^2`): the steps follow the schedule,
    /// 1, 0.8, 0.6, 0.4, 0.2 then 0.2 of `lr`, on the fused loop and on the tensor ops.
    #[test]
    fn a_linear_schedule_scales_each_step() {
        let config = OptimizerConfig {
            lr: 0.01,
            max_grad_norm: 0.0,
            lr_schedule: LrSchedule::Linear {
                to: 0.2,
                updates: 4,
            },
            ..Default::default()
        };
        for reference in [false, true] {
            let mut store = ParamStore::new(Device::Cpu);
            let t = Tensor::new(&[1f32, -2.0], &Device::Cpu).unwrap();
            let var = store.add("w", t, Role::Weight).unwrap().clone();
            let mut opt = Optimizer::build(&store, &config, 1.0, reference);
            let mut before = var.as_tensor().to_vec1::<f32>().unwrap();
            for factor in [1.0, 0.8, 0.6, 0.4, 0.2, 0.2] {
                // d(0.5 * sum(w)) / dw = 0.5 everywhere.
                let loss = (var.as_tensor().sum_all().unwrap() * 0.5).unwrap();
                opt.step(&loss.backward().unwrap()).unwrap();
                let now = var.as_tensor().to_vec1::<f32>().unwrap();
                let expected = 0.01 * factor * 0.5 / (0.5 + 1e-8);
                for (b, a) in before.iter().zip(&now) {
                    let moved = f64::from(b - a);
                    assert!(
                        (moved - expected).abs() < 1e-6,
                        "{reference}: {moved} vs {expected}"
                    );
                }
                before = now;
            }
        }
        assert_eq!(LrSchedule::Constant.factor(1_000_000), 1.0);
    }
}

#[cfg(test)]
mod update_tests {
    use super::*;

    /// RMSprop's step with the zero blocks' shortcut equals its step of every value,
    /// bit for bit: centered or not, clipped or not, over blocks of zeros (of both
    /// signs, beside weights of both signs, -0 among them), blocks with one nonzero
    /// gradient, states that flush, and a tail shorter than a block.
    #[test]
    fn skipping_zero_blocks_changes_no_bit() {
        let mut rng = crate::nn::init::InitRng::new(3);
        let n = 7 * BLOCK + 5;
        let random = |rng: &mut crate::nn::init::InitRng| -> Vec<f32> {
            let t = rng.normal(n, 1.0, &candle_core::Device::Cpu).unwrap();
            t.to_vec1::<f32>().unwrap()
        };
        let mut g = random(&mut rng);
        for (i, g) in g.iter_mut().enumerate() {
            // Blocks 0, 2 and 5 all zero (-0 in block 2), block 3 zero but one value.
            match i / BLOCK {
                0 | 5 => *g = 0.0,
                2 => *g = -0.0,
                3 if i % BLOCK != 7 => *g = 0.0,
                _ => {}
            }
        }
        let mut p0 = random(&mut rng);
        p0[2 * BLOCK] = -0.0;
        p0[2 * BLOCK + 1] = 0.0;
        let mut states = [random(&mut rng), random(&mut rng)];
        states[0].iter_mut().for_each(|s| *s = s.abs());
        states[0][BLOCK..2 * BLOCK].fill(1e-37);
        for (centered, grad_scale) in [(false, 1.0), (true, 1.0), (false, 0.3), (true, 0.7)] {
            let c = Coefficients {
                kind: OptimizerKind::Rmsprop,
                lr: 0.01,
                grad_scale,
                b1: 0.9,
                b2: 0.999,
                bias1: 1.0,
                bias2_sqrt: 1.0,
                eps: 0.01,
                alpha: 0.95,
                centered,
            };
            let (mut p, [mut s0, mut s1]) = (p0.clone(), states.clone());
            update(&c, &mut p, &g, &mut s0, &mut s1);
            let (mut q, [mut r0, mut r1]) = (p0.clone(), states.clone());
            for (((p, &g), s0), s1) in q.iter_mut().zip(&g).zip(&mut r0).zip(&mut r1) {
                c.rmsprop(p, g, s0, s1);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&p), bits(&q), "weights, centered {centered}");
            assert_eq!(bits(&s0), bits(&r0), "squares, centered {centered}");
            assert_eq!(bits(&s1), bits(&r1), "means, centered {centered}");
            assert_ne!(bits(&p), bits(&p0), "the step moved nothing");
        }
    }
}
