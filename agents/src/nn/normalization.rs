//! The one trait every normalization method implements, [`Normalization`]: the part
//! of a hidden layer between its kernel (`t = W x`, or weight norm's `v x` scaled) and
//! its output `relu(norm(t) + b)`, for a single network and for a population alike.
//! Each activation normalization is one type in its own file under `methods/` (batch
//! norm, with batch renormalization's correction and BBN's bounded gains; mean-only BN,
//! layer norm, group norm, RMSNorm, hyperspherical features); [`Identity`], here, is the
//! layer without one (activation `none`, whatever its weights, and every output layer).
//!
//! One value of a method's type normalizes one network's layer: its variables shaped for
//! one agent (`lead` = 0 leading axes, built by the method's `new`), or stacked along a
//! leading population axis, `[P, 1, units]` (`[P, 1, channels, positions]` over feature
//! maps), each agent's statistics its own (`lead` = 1, built by its `stack` from the
//! agents' variables). The method's tensor-op form ([`Normalization::normalize`]) is
//! written once for any leading axes: the reference its fused ops are tested against,
//! and what other devices run. Besides it, three fused paths compute the same values:
//! a single network's fused CPU op on candle's graph, the host path of a single CPU MLP
//! on plain buffers (its tape, [`super::HostTape`]), and a population's per-agent op
//! ([`Normalization::fused_forward`], `kernels::per_agent`, with CUDA kernels where
//! the method has them).

use std::sync::Arc;

use candle_core::{DType, Result, Tensor, TensorId, Var};

use super::{BnStats, Role};
use crate::kernels::batch_norm::BatchNormOp;
use crate::kernels::bias_relu::{self, relu_mask};
use crate::kernels::feature_pass::{
    affine_features, affine_in_place, output_gradient, Affine, SavedOutput,
};
use crate::kernels::layer_norm::RowStatistics;
use crate::kernels::per_agent::Applied;
use crate::kernels::with_values;

/// Each trainable variable's gradient from the host path, by the variable's id.
pub type HostGradients = Vec<(TensorId, Vec<f32>)>;

/// One layer on candle's graph, as its normalization sees it: what follows the
/// normalization, and which batch-norm statistics to use.
pub(crate) struct GraphLayer<'a> {
    pub bias: Option<&'a Tensor>,
    pub relu: bool,
    pub stats: BnStats,
}

/// One hidden layer on the host path, as its normalization sees it.
pub(crate) struct HostLayer<'a> {
    /// Output units (features).
    pub units: usize,
    pub rows: usize,
    /// The layer's own bias (methods without a shift of their own).
    pub bias: Option<&'a Var>,
    /// Weight norm's `g_u/||v_u||`: the kernel ran with `v`, and its output `t` is to be
    /// scaled per unit.
    pub scale: Option<&'a [f32]>,
    pub relu: bool,
    pub stats: BnStats,
}

/// What a host backward reads: the layer, the normalization's tape, the kernel output
/// `t` the forward kept (empty where it kept none) and the layer's output `out`.
pub(crate) struct Saved<'a> {
    pub layer: HostLayer<'a>,
    pub tape: &'a NormTape,
    pub t: &'a [f32],
    pub out: &'a [f32],
}

/// What a normalization's host backward reads besides the kernel's output.
pub(crate) enum NormTape {
    None,
    Batch(Arc<BatchNormOp>),
    Layer(RowStatistics),
    /// RMSNorm: each row's `1 / rms`.
    Rms(Vec<f32>),
    /// Mean-only BN: whether it subtracted the batch's mean (else the running mean, a
    /// constant).
    MeanOnly {
        batch_statistics: bool,
    },
    /// Hyperspherical features: each row's `1 / max(||relu(s t)||, eps)`.
    Sphere(Vec<f32>),
}

/// A host forward's result: the layer's output, the kernel's output where the backward
/// reads it (else empty), and the normalization's own tape.
pub(crate) struct HostOutput {
    pub out: Vec<f32>,
    pub kernel_output: Vec<f32>,
    pub tape: NormTape,
}

impl HostOutput {
    /// `out`, with the kernel's output `t` kept for the backward where `keep`.
    #[inline]
    pub(crate) fn keeping(out: Vec<f32>, t: Vec<f32>, keep: bool, tape: NormTape) -> Self {
        Self {
            out,
            kernel_output: if keep { t } else { vec![] },
            tape,
        }
    }

    /// `out` where the forward wrote a new buffer and keeps the kernel's output `t`;
    /// else (`None`) `t` itself, transformed in place, is the output.
    #[inline]
    pub(crate) fn kept_or_in_place(out: Option<Vec<f32>>, t: Vec<f32>, tape: NormTape) -> Self {
        match out {
            Some(out) => Self {
                out,
                kernel_output: t,
                tape,
            },
            None => Self {
                out: t,
                kernel_output: vec![],
                tape,
            },
        }
    }
}

impl Saved<'_> {
    /// `dy` through the layer's ReLU (where it has one): 0 where the output was.
    pub(crate) fn below_relu(&self, dy: Vec<f32>) -> Vec<f32> {
        match self.layer.relu {
            true => relu_mask(self.out, &dy),
            false => dy,
        }
    }
}

/// A norm on the graph: its fused op on the CPU (given `t` contiguous), elsewhere its
/// tensor-op `reference` and then the ReLU where `relu`.
pub(crate) fn fused_or_reference(
    t: &Tensor,
    relu: bool,
    reference: impl FnOnce(&Tensor) -> Result<Tensor>,
    fused: impl FnOnce(Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if t.device().is_cpu() {
        return fused(t.contiguous()?);
    }
    let y = reference(t)?;
    if relu {
        y.relu()
    } else {
        Ok(y)
    }
}

/// A host backward's result: `dL/dt` (the kernel output's gradient) and, where the
/// kernel was weight-normed, the per-unit sums `Σ dL/d(s t) · t` that give `dL/dg`.
pub(crate) struct KernelGradient {
    pub dt: Vec<f32>,
    pub gain_sums: Vec<f32>,
}

/// What a host backward returns.
pub(crate) type Backward = Result<KernelGradient>;

/// What a population's fused forward returns: the op applied, or `None` where the
/// method has none for this device and layer.
pub(crate) type Fused = Result<Option<Applied>>;

impl KernelGradient {
    /// `dL/dt` of a kernel without weight norm.
    #[inline]
    pub(crate) fn plain(dt: Vec<f32>) -> Self {
        Self {
            dt,
            gain_sums: vec![],
        }
    }
}

/// What a layer asks of its normalization, a single network's and a population's
/// alike; each step has one name. A single network calls `graph_forward` (candle's graph)
/// or, on a CPU MLP, `host_forward` and `host_backward`; a population `fused_forward`
/// where the method has a per-agent op, else `normalize`, the tensor-op form, followed
/// by the layer's bias and ReLU.
pub(crate) trait Normalization: Send + Sync {
    /// Trainable variables, then buffers, in the order they were made or taken.
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>);

    /// The same normalization over copies of its variables (a population's target
    /// network).
    fn copied(&self) -> Result<Box<dyn Normalization>>;

    /// The normalized (and scaled) `h`, by tensor ops, for the value's leading axes;
    /// with batch statistics, a method that keeps running statistics updates them.
    fn normalize(&self, h: Tensor, stats: BnStats) -> Result<Tensor>;

    /// Whether [`Self::normalize`] leaves `h` as it is (no normalization; SVB without
    /// BBN): the layer's bias and ReLU are then its whole output.
    fn passes_through(&self) -> bool {
        false
    }

    /// `relu(norm(t) + bias)` (the ReLU only where the layer has one) through a single
    /// network's graph: the fused op on the CPU, the tensor form elsewhere. By default
    /// the tensor form, then the layer's bias and ReLU.
    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        Identity.graph_forward(&self.normalize(t.clone(), layer.stats)?, layer)
    }

    /// Whether a single network's host path runs this method, with a weight-normed
    /// kernel or not: by default not (its network takes candle's graph, by itself). A
    /// method with host loops says so and writes the two steps below.
    fn runs_on_host(&self, _weight_normed: bool) -> bool {
        false
    }

    /// [`Self::graph_forward`] on host values; `keep` asks for what
    /// [`Self::host_backward`] reads.
    fn host_forward(&self, _layer: &HostLayer, _t: Vec<f32>, _keep: bool) -> Result<HostOutput> {
        candle_core::bail!("this normalization has no host path (runs_on_host is false)")
    }

    /// Pushes the method's (and the bias's) gradients from `dy`, the gradient of the
    /// layer's output.
    fn host_backward(&self, _saved: &Saved, _dy: Vec<f32>, _grads: &mut HostGradients) -> Backward {
        candle_core::bail!("this normalization has no host path (runs_on_host is false)")
    }

    /// A population's `relu(normalize(h) + bias)` as one fused op, where the method has
    /// one for `h`'s device and this layer (its kernel's loops run per agent:
    /// `kernels::per_agent`); `None` otherwise, and the layer adds its bias and applies
    /// the ReLU itself. Only mean-only batch norm's layers have a bias besides their
    /// normalization. The op is kept with its inputs for an explicit backward.
    fn fused_forward(&self, _h: &Tensor, _stats: BnStats, _bias: Option<&Var>) -> Fused {
        Ok(None)
    }

    /// Whether [`Self::fused_forward`] has a form on a CUDA device (its kernels in
    /// `kernels/cuda`); a method without one takes the tensor forms there.
    fn has_cuda_kernel(&self) -> bool {
        false
    }

    /// Whether a training step's work on the device is the same at every step, so that
    /// a CUDA graph may replay it: not during batch renormalization's warm-up, which
    /// reads and counts its updates on the host.
    fn step_invariant(&self) -> bool {
        true
    }

    /// The layer's bias after weight norm's data-dependent init, from `mean_scaled`, each
    /// unit's mean of `t` times its new gain: `-mean_scaled` centers the output.
    fn initial_bias(&self, mean_scaled: &Tensor) -> Result<Tensor> {
        mean_scaled.neg()
    }

    /// The gain and offset that a weight held at a fixed norm (NaP's) projects jointly
    /// with it: a layer norm's; `None` elsewhere.
    fn affine(&self) -> Option<(&Var, &Var)> {
        None
    }

    /// BBN's bound of each agent's gains with bound `eps`, where the method has gains
    /// over running statistics (batch norm's); nothing elsewhere. SVB's step calls it
    /// (`after_step.rs`).
    fn bound_gains(&self, _eps: f64) -> Result<()> {
        Ok(())
    }

    /// Scalars for logging (running statistics, gains).
    fn log_stats(&self, _values: &mut Vec<(&'static str, f64)>) -> Result<()> {
        Ok(())
    }
}

/// The mean of `values` (0 for none), for logging.
pub(crate) fn mean_of(values: &[f32]) -> f64 {
    values.iter().map(|&x| f64::from(x)).sum::<f64>() / values.len().max(1) as f64
}

/// Pushes `var`'s gradient (keyed by id: the optimizer matches gradients to its state
/// that way).
#[inline]
pub(crate) fn push(grads: &mut HostGradients, var: &Var, grad: Vec<f32>) {
    grads.push((var.id(), grad));
}

/// Runs `f` with the bias's values, if the layer has one (the host path's loops take
/// the bias as an optional slice, not a tensor).
#[inline]
pub(crate) fn with_bias<R>(
    bias: Option<&Var>,
    f: impl FnOnce(Option<&[f32]>) -> Result<R>,
) -> Result<R> {
    match bias {
        Some(b) => with_values(b.as_tensor(), |b| f(Some(b))),
        None => f(None),
    }
}

/// No activation normalization: `relu(s t + b)`, with weight norm's scale `s` where the
/// kernel is weight-normed (`none`, `weight_norm`, `svb` and every output layer).
pub(crate) struct Identity;

impl Normalization for Identity {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![], vec![])
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        Ok(Box::new(Identity))
    }

    fn normalize(&self, h: Tensor, _stats: BnStats) -> Result<Tensor> {
        Ok(h)
    }

    fn passes_through(&self) -> bool {
        true
    }

    fn runs_on_host(&self, _weight_normed: bool) -> bool {
        true
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        match (layer.bias, layer.relu) {
            (Some(b), true) => bias_relu::bias_relu(t, b),
            (Some(b), false) => bias_relu::add_unit_bias(t, b),
            (None, true) => bias_relu::relu(t),
            (None, false) => Ok(t.clone()),
        }
    }

    #[inline]
    fn host_forward(&self, layer: &HostLayer, mut t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        // Weight norm's backward reads the kernel's output; else it is not kept and
        // becomes the layer's output in place.
        let kept = keep && layer.scale.is_some();
        let out = with_bias(layer.bias, |bias| {
            let affine = Affine {
                scale: layer.scale,
                bias,
                relu: layer.relu,
                ..Default::default()
            };
            if kept {
                Ok(Some(affine_features(&t, layer.units, affine)))
            } else {
                affine_in_place(&mut t, layer.units, affine);
                Ok(None)
            }
        })?;
        Ok(HostOutput::kept_or_in_place(out, t, NormTape::None))
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        let layer = &saved.layer;
        let output = SavedOutput {
            y: layer.relu.then_some(saved.out),
            scaled: layer.scale.map(|s| (saved.t, s)),
        };
        let mut dt = dy;
        let sums = output_gradient(&mut dt, layer.units, output);
        if let Some(b) = layer.bias {
            push(grads, b, sums.d);
        }
        Ok(KernelGradient {
            dt,
            gain_sums: sums.d_t,
        })
    }
}

/// Takes a stacked variable of the layer by its name's suffix (`ln.gamma`) and group.
pub(crate) type Take<'a> = dyn FnMut(&str, Role) -> Result<Var> + 'a;

/// A copy of `v`, as a variable of its own.
pub(crate) fn copy_var(v: &Var) -> Result<Var> {
    Var::from_tensor(&v.as_tensor().copy()?)
}

/// `running = (1 - momentum) running + momentum batch`: a running statistic's update.
pub(crate) fn blend(running: &Var, batch: &Tensor, momentum: f64) -> Result<()> {
    let kept = (running.as_tensor() * (1.0 - momentum))?;
    running.set(&(kept + (batch.detach() * momentum)?)?)
}

/// Per-unit moments over the batch (and a feature map's positions), for any leading
/// axes: `h` is `[lead.., B, units]` or `[lead.., B, units, positions..]`, each
/// leading index (a population's agent) with its own; shaped to broadcast against `h`.
///
/// Summed in f64, as a single network's fused batch norm sums. (The sums' precision
/// alone does not keep a CNN population on its agents' paths: with f32 sums the test's
/// CNN with weight norm met a kink at update 41, with f64 sums not.)
pub(crate) fn unit_moments(h: &Tensor, lead: usize) -> Result<(Tensor, Tensor)> {
    // The positions' axes first, last to first, then the batch's.
    let per_unit = |x: &Tensor| -> Result<Tensor> {
        let mut m = x.clone();
        for axis in (lead + 2..x.rank()).rev() {
            m = m.mean_keepdim(axis)?;
        }
        m.mean_keepdim(lead)
    };
    let wide = h.to_dtype(DType::F64)?;
    let mean = per_unit(&wide)?;
    let var = per_unit(&wide.broadcast_sub(&mean)?.sqr()?)?;
    Ok((mean.to_dtype(DType::F32)?, var.to_dtype(DType::F32)?))
}

/// `x_hat gamma + beta`, per unit.
pub(crate) fn affine(x_hat: Tensor, gamma: &Tensor, beta: &Tensor) -> Result<Tensor> {
    x_hat.broadcast_mul(gamma)?.broadcast_add(beta)
}

/// A per-unit variable `v` shaped to broadcast against `t` (`[lead.., B, units,
/// positions..]`): a single network's `[units]` as `[1, units, 1..]`; a population's is
/// stacked so already (`[P, 1, units(, 1)]`).
pub(crate) fn unit_view(v: &Tensor, t: &Tensor, lead: usize) -> Result<Tensor> {
    if lead > 0 {
        return Ok(v.clone());
    }
    let mut shape = vec![1; t.rank()];
    shape[1] = t.dim(1)?;
    v.reshape(shape)
}
