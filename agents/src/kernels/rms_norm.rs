//! RMSNorm's CPU loops and fused op: each sample's inverse root mean square, the scaled
//! output (and a ReLU), and the closed-form backward.
//!
//! Per sample of `n` features, with `r = 1 / sqrt(mean(t²) + eps)`, `x̂ = t r` and
//! `y = gamma x̂`: `dgamma = Σ_b dy·x̂`, and with `d = dy·gamma`,
//! `dt = r (d - x̂ Σ(d·x̂)/n)` (no mean to subtract: RMSNorm does not center).

use candle_core::{CustomOp2, Tensor};

use super::bias_relu::gradient_through_relu;
use super::dense::lane_sum;
use super::layer_norm::features_per_sample;
use super::per_agent::OpGradient;
#[cfg(feature = "cuda")]
use super::per_agent::{DeviceOutput, OpInputs};
use super::with_values;
use super::{cpu_forward, gradient_like, Grads2};

pub(crate) struct FusedRmsNorm {
    pub eps: f64,
    /// A ReLU follows in the same op.
    pub relu: bool,
}

impl CustomOp2 for FusedRmsNorm {
    cpu_forward!("rms-norm", |op, t @ l1, gamma @ l2| {
        features_per_sample(l1.shape(), l2.shape(), "RMSNorm")?;
        let inv = inverse_rms(t, gamma.len(), op.eps);
        Ok((scale_rows(t, &inv, gamma, op.relu), l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, gamma: &Tensor, out: &Tensor, dy: &Tensor) -> Grads2 {
        let dy = gradient_through_relu(self.relu, out, dy)?;
        let n = features_per_sample(t.shape(), gamma.shape(), "RMSNorm")?;
        let (dt, dgamma) = with_values(t, |t| {
            with_values(&gamma.contiguous()?, |gamma| {
                with_values(&dy, |dy| {
                    Ok(rms_gradients(t, &inverse_rms(t, n, self.eps), gamma, dy))
                })
            })
        })?;
        Ok((gradient_like(dt, t)?, gradient_like(dgamma, gamma)?))
    }
}

/// RMSNorm in a population: the same loops on each agent's values.
impl super::per_agent::AgentKernel<1> for FusedRmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm-per-agent"
    }

    fn forward(
        &self,
        _agent: usize,
        t: &[f32],
        [gamma]: [&[f32]; 1],
    ) -> candle_core::Result<Vec<f32>> {
        super::layer_norm::check_rows(t, gamma)?;
        let inv = inverse_rms(t, gamma.len(), self.eps);
        Ok(scale_rows(t, &inv, gamma, self.relu))
    }

    fn backward(
        &self,
        pass: OpGradient<'_, [f32], 1>,
    ) -> candle_core::Result<(Vec<f32>, [Vec<f32>; 1])> {
        let (t, [gamma], out, dy) = pass.parts();
        super::layer_norm::check_rows(t, gamma)?;
        let dy = &super::bias_relu::through_relu(self.relu, out, dy);
        let inv = inverse_rms(t, gamma.len(), self.eps);
        let (dt, dgamma) = rms_gradients(t, &inv, gamma, dy);
        Ok((dt, [dgamma]))
    }

    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 1>) -> DeviceOutput {
        let (agents, t, [gamma]) = (x.agent, x.t, x.params);
        let s = self.cuda_dims(agents, t, gamma)?;
        let (out, stats) = super::cuda::device::row_norm_forward(t, gamma, None, s)?;
        Ok(Some((out, Some(stats))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_gradients(
        &self,
        pass: OpGradient<'_, Tensor, 1>,
    ) -> candle_core::Result<(Tensor, [Tensor; 1])> {
        let (t, [gamma], out, dy) = pass.parts();
        let agents = pass.inputs.agent;
        let Some(stats) = pass.kept else {
            candle_core::bail!("RMSNorm: the CUDA forward kept no statistics");
        };
        let s = self.cuda_dims(agents, t, gamma)?;
        let kept = (t, gamma, stats);
        let (dt, dg, _) = super::cuda::device::row_norm_backward(kept, out, dy, s, false)?;
        Ok((dt, [dg]))
    }
}

impl FusedRmsNorm {
    /// The CUDA kernels' sizes for `t` and `gamma` over `agents` (one group, per feature
    /// gains).
    #[cfg(feature = "cuda")]
    fn cuda_dims(
        &self,
        agents: usize,
        t: &Tensor,
        gamma: &Tensor,
    ) -> candle_core::Result<super::cuda::args::RowNorm> {
        let sizes = (agents, t.elem_count(), gamma.elem_count());
        super::cuda::args::RowNorm::of(sizes, (1, 1), (self.relu, true, self.eps))
    }
}

crate::kernels::avx2::dispatch! {
    /// `1 / sqrt(mean(t²) + eps)` of each sample (row of `n` values); the sums first for
    /// all rows, then the roots.
    pub(crate) fn inverse_rms(t: &[f32], n: usize, eps: f64) -> Vec<f32> {
        let mut inv = vec![0f32; t.len() / n.max(1)];
        for (v, row) in inv.iter_mut().zip(t.chunks_exact(n.max(1))) {
            *v = lane_sum(row, row, |x, y| x * y);
        }
        for v in inv.iter_mut() {
            *v = (1.0 / (f64::from(*v) / n as f64 + eps).sqrt()) as f32;
        }
        inv
    }
}

crate::kernels::avx2::dispatch! {
    /// `gamma · t · r` per sample (row of `gamma.len()` values), then the ReLU if `relu`.
    pub(crate) fn scale_rows(t: &[f32], inv: &[f32], gamma: &[f32], relu: bool) -> Vec<f32> {
        let mut out = Vec::with_capacity(t.len());
        for (row, r) in t.chunks_exact(gamma.len()).zip(inv) {
            let values = row.iter().zip(gamma);
            if relu {
                out.extend(values.map(|(x, g)| (x * r * g).max(0.0)));
            } else {
                out.extend(values.map(|(x, g)| x * r * g));
            }
        }
        out
    }
}

crate::kernels::avx2::dispatch! {
    /// `(dL/dt, dL/dgamma)` from the input `t`, its inverse RMS per row, and `dy`, the
    /// gradient with respect to the output (below the ReLU).
    pub(crate) fn rms_gradients(t: &[f32], inv: &[f32], gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let n = gamma.len();
        let mut dgamma = vec![0f32; n];
        let mut dt = Vec::with_capacity(t.len());
        // One row's x̂ and dy·gamma, reused.
        let (mut xhat, mut d) = (vec![0f32; n], vec![0f32; n]);
        for ((row, drow), r) in t.chunks_exact(n).zip(dy.chunks_exact(n)).zip(inv) {
            let values = xhat.iter_mut().zip(d.iter_mut()).zip(row.iter().zip(drow));
            for (((xhat, d), (x, g)), (dg, w)) in values.zip(dgamma.iter_mut().zip(gamma)) {
                *xhat = x * r;
                *d = g * w;
                *dg += g * *xhat;
            }
            let mean_dx = lane_sum(&d, &xhat, |d, x| d * x) / n as f32;
            dt.extend(d.iter().zip(&xhat).map(|(d, x)| r * (d - x * mean_dx)));
        }
        (dt, dgamma)
    }
}
