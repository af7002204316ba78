//! A normalization's population form: its variables stacked along a leading population
//! axis, over a hidden layer's pre-activations `[P, B, units]` (`[P, B, channels,
//! positions]` over feature maps), each agent's statistics its own. Each method writes
//! its form in its own file (`Stacked*` beside its single-network layer), and registers
//! it in `nn/stack.rs`; `population::PopulationNet` calls them through [`StackedNorm`]
//! and names none.

use candle_core::{DType, Result, Tensor, Var};

use super::{BnStats, Role};
use crate::kernels::per_agent::Applied;

/// What a population layer asks of its normalization.
///
/// The steps a single network's [`super::activation_norm::ActivationNorm`] shares have
/// its names: `initial_bias` (weight norm's data-dependent init) and `after_step` (the
/// method's work after an optimizer step, `Layer::after_step` for a single network).
/// `normalize` is the tensor-op form of the normalization alone, and `fused_forward`
/// the fused op with the bias and ReLU after it.
pub(crate) trait StackedNorm: Send + Sync {
    /// Trainable variables, then buffers, in the order their layouts were taken.
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>);

    /// The same normalization over copies of its variables (a target network).
    fn copied(&self) -> Result<Box<dyn StackedNorm>>;

    /// The normalized (and scaled) `h`; with batch statistics, a method that keeps
    /// running statistics updates them as a single network's training forward does.
    fn normalize(&self, h: Tensor, stats: BnStats) -> Result<Tensor>;

    /// Whether [`Self::normalize`] leaves `h` as it is (SVB without BBN): the layer's bias
    /// and ReLU are then its whole output.
    fn passes_through(&self) -> bool {
        false
    }

    /// `relu(normalize(h) + bias)` as one fused op, where the method has one for `h`'s
    /// device and this layer (its kernel's loops run per agent: `kernels::per_agent`);
    /// `None` otherwise, and the layer adds its bias and applies the ReLU itself. Only
    /// mean-only batch norm's layers have a bias besides their normalization. The op is
    /// kept with its inputs for an explicit backward.
    fn fused_forward(
        &self,
        _h: &Tensor,
        _stats: BnStats,
        _bias: Option<&Var>,
    ) -> Result<Option<Applied>> {
        Ok(None)
    }

    /// Whether [`Self::fused_forward`] has a form on a CUDA device (its kernels in
    /// `kernels/cuda`); a method without one takes the tensor forms there.
    fn has_cuda_kernel(&self) -> bool {
        false
    }

    /// The layer's bias after weight norm's data-dependent init, from `mean_scaled`,
    /// each unit's mean of `t` times its new gain: `-mean_scaled` centers the output
    /// (mean-only batch norm starts its running mean there instead, and the bias at 0).
    /// The same step as a single network's `ActivationNorm::initial_bias`.
    fn initial_bias(&self, mean_scaled: &Tensor) -> Result<Tensor> {
        mean_scaled.neg()
    }

    /// Whether a training step's work on the device is the same at every step, so that
    /// a CUDA graph may replay it: not during batch renormalization's warm-up, which
    /// reads and counts its updates on the host.
    fn step_invariant(&self) -> bool {
        true
    }

    /// The method's work after optimizer step `updates` on the layer's weight `[P, out,
    /// in]` (SVB's projection, BBN's bound of the gains); whether it ran.
    fn after_step(&self, _updates: u64, _weight: &Var) -> Result<bool> {
        Ok(false)
    }

    /// BBN's bound of each agent's gains with bound `eps`, where the method has gains
    /// over running statistics (batch norm's); nothing elsewhere.
    fn bound_gains(&self, _eps: f64) -> Result<()> {
        Ok(())
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

/// Mean and population variance of `h` along `dim`, kept for broadcasting.
pub(crate) fn moments(h: &Tensor, dim: usize) -> Result<(Tensor, Tensor)> {
    let mean = h.mean_keepdim(dim)?;
    let var = h.broadcast_sub(&mean)?.sqr()?.mean_keepdim(dim)?;
    Ok((mean, var))
}

/// Each agent's per-unit moments over its batch (and a feature map's positions): `h`
/// is `[P, B, out]` or `[P, B, out, positions]`.
///
/// Summed in f64, as a single network's fused batch norm sums. (The sums' precision
/// alone does not keep a CNN population on its agents' paths: with f32 sums the test's
/// CNN with weight norm met a kink at update 41, with f64 sums not.)
pub(crate) fn unit_moments(h: &Tensor) -> Result<(Tensor, Tensor)> {
    let wide = h.to_dtype(DType::F64)?;
    let (mean, var) = match h.rank() {
        3 => moments(&wide, 1)?,
        _ => {
            let mean = wide.mean_keepdim(3)?.mean_keepdim(1)?;
            let centered = wide.broadcast_sub(&mean)?;
            let var = centered.sqr()?.mean_keepdim(3)?.mean_keepdim(1)?;
            (mean, var)
        }
    };
    Ok((mean.to_dtype(DType::F32)?, var.to_dtype(DType::F32)?))
}

/// `x_hat gamma + beta`, per unit.
pub(crate) fn affine(x_hat: Tensor, gamma: &Var, beta: &Var) -> Result<Tensor> {
    x_hat
        .broadcast_mul(gamma.as_tensor())?
        .broadcast_add(beta.as_tensor())
}
