//! What every activation normalization provides to the layer around it: the part of a
//! hidden layer between its kernel (`t = W x`, or weight norm's `v x` scaled) and its
//! output `relu(norm(t) + b)`. Each method implements [`ActivationNorm`] in its own
//! file (batch norm with batch renormalization's correction, mean-only BN, layer norm,
//! group norm, RMSNorm); [`Identity`], here, is the layer without one (`none`, weight
//! norm, SVB, BBN).
//!
//! Two paths compute the same values: candle's graph (any device, CNNs) and the host
//! path of CPU MLPs, which runs on plain buffers and keeps what its backward needs on a
//! tape ([`super::HostTape`]).

use std::sync::Arc;

use candle_core::{Result, Tensor, TensorId, Var};

use super::BnStats;
use crate::kernels::batch_norm::BatchNormOp;
use crate::kernels::bias_relu::{self, relu_mask};
use crate::kernels::feature_pass::{
    affine_features, affine_in_place, output_gradient, Affine, SavedOutput,
};
use crate::kernels::layer_norm::RowStatistics;
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

pub(crate) trait ActivationNorm: Send + Sync {
    /// Whether the host path runs this method, with a weight-normed kernel or not (by
    /// default: without weight norm).
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        !weight_normed
    }

    /// `relu(norm(t) + bias)` (the ReLU only where the layer has one) through the
    /// graph; `t` is the kernel's output.
    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor>;

    /// The same on host values; `keep` asks for what [`Self::host_backward`] reads.
    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput>;

    /// Pushes the method's (and the bias's) gradients from `dy`, the gradient of the
    /// layer's output.
    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward;

    /// The layer's bias after weight norm's data-dependent init, from `mean_scaled`, each
    /// unit's mean of `t` times its new gain: `-mean_scaled` centers the output.
    fn initial_bias(&self, mean_scaled: &Tensor) -> Result<Tensor> {
        mean_scaled.neg()
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

impl ActivationNorm for Identity {
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
