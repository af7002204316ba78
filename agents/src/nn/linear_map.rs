//! The linear part of a layer, Linear or Conv2d, without bias: `t = W x`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::LinearMap;
//!
//! let conv = LinearMap::Conv2d { c_in: 4, c_out: 16, k: 3, stride: 1, padding: 0 };
//! assert_eq!(conv.weight_shape(), vec![16, 4, 3, 3]);
//! assert_eq!(conv.output_shape(&[4, 10, 10]), vec![16, 8, 8]);
//! ```

use candle_core::{Result, Tensor};

use crate::kernels::conv::DataConv2d;
use crate::kernels::linear::LinearOp;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearMap {
    /// `x: [B, n_in] -> [B, n_out]`.
    Linear { n_in: usize, n_out: usize },
    /// `x: [B, c_in, H, W] -> [B, c_out, H', W']`, square kernel.
    Conv2d {
        c_in: usize,
        c_out: usize,
        k: usize,
        stride: usize,
        padding: usize,
    },
}

impl LinearMap {
    pub fn weight_shape(&self) -> Vec<usize> {
        match *self {
            LinearMap::Linear { n_in, n_out } => vec![n_out, n_in],
            LinearMap::Conv2d { c_in, c_out, k, .. } => vec![c_out, c_in, k, k],
        }
    }

    /// Output units (features or channels).
    pub fn units(&self) -> usize {
        match *self {
            LinearMap::Linear { n_out, .. } => n_out,
            LinearMap::Conv2d { c_out, .. } => c_out,
        }
    }

    pub fn fan_in(&self) -> usize {
        match *self {
            LinearMap::Linear { n_in, .. } => n_in,
            LinearMap::Conv2d { c_in, k, .. } => c_in * k * k,
        }
    }

    /// Shape of one sample's output given one sample's input shape.
    pub fn output_shape(&self, input: &[usize]) -> Vec<usize> {
        match *self {
            LinearMap::Linear { n_out, .. } => vec![n_out],
            LinearMap::Conv2d {
                c_out,
                k,
                stride,
                padding,
                ..
            } => {
                let side = |n: usize| (n + 2 * padding - k) / stride + 1;
                vec![c_out, side(input[1]), side(input[2])]
            }
        }
    }

    /// `W x` for a weight of [`Self::weight_shape`].
    pub fn apply(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        match *self {
            LinearMap::Linear { .. } => {
                if x.device().is_cpu() {
                    x.contiguous()?.apply_op2(&w.contiguous()?, LinearOp)
                } else {
                    x.matmul(&w.t()?)
                }
            }
            LinearMap::Conv2d {
                k, stride, padding, ..
            } => {
                if x.device().is_cpu() && !x.track_op() && padding == 0 {
                    DataConv2d { k, stride }.apply(x, w)
                } else {
                    x.conv2d(w, padding, stride, 1, 1)
                }
            }
        }
    }

    /// `W x` through candle's own matmul and convolution (the reference the fused
    /// linear op and the data convolution are tested against).
    #[cfg(any(test, feature = "test-support"))]
    pub fn apply_reference(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        match *self {
            LinearMap::Conv2d {
                stride, padding, ..
            } => x.conv2d(w, padding, stride, 1, 1),
            LinearMap::Linear { .. } => x.matmul(&w.t()?),
        }
    }

    /// Shape that broadcasts a per-unit vector against this kernel's output.
    #[cfg(any(test, feature = "test-support"))]
    pub fn unit_shape(&self) -> Vec<usize> {
        match *self {
            LinearMap::Linear { n_out, .. } => vec![1, n_out],
            LinearMap::Conv2d { c_out, .. } => vec![1, c_out, 1, 1],
        }
    }
}

/// Per-unit mean and population variance of `t` over the batch (and, for conv
/// outputs, over all spatial positions), each shaped to broadcast against `t`.
pub fn unit_moments(t: &Tensor) -> Result<(Tensor, Tensor)> {
    unit_moments_after(t, 0)
}

/// [`unit_moments`] after `lead` leading axes (a population's agent axis: each agent's
/// its own), `t` `[lead.., B, units, positions..]`. In f32, batch first, so that weight
/// norm's data-dependent init keeps the rounding of the runs already archived (the
/// normalizations' statistics are `normalization::unit_moments`, summed in f64).
pub(crate) fn unit_moments_after(t: &Tensor, lead: usize) -> Result<(Tensor, Tensor)> {
    let mean = unit_mean(t, lead)?;
    let var = unit_mean(&t.broadcast_sub(&mean)?.sqr()?, lead)?;
    Ok((mean, var))
}

/// Per-unit mean over the batch and spatial positions, broadcastable against `t`.
fn unit_mean(t: &Tensor, lead: usize) -> Result<Tensor> {
    let rank = t.rank();
    if rank < lead + 2 {
        candle_core::bail!(
            "per-unit statistics need a batch and units after the leading axes, got rank {rank}"
        );
    }
    let mut m = t.mean_keepdim(lead)?;
    for axis in lead + 2..rank {
        m = m.mean_keepdim(axis)?;
    }
    Ok(m)
}
