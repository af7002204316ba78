//! Batch norm's and mean-only batch norm's training-mode forward and backward as fused
//! CPU ops (candle's broadcasting reductions made them several passes and allocations
//! each way).
//!
//! Forward, per unit `u` over its `n` values: `y = gamma_u * (t - mean_u) * inv_std_u +
//! beta_u` with `inv_std_u = 1 / sqrt(var_u + eps)` (population variance). Backward:
//! `dbeta = Σ dy`, `dgamma = Σ dy·x̂`, `dt = gamma · inv_std · (dy - Σdy/n - x̂ Σdy·x̂/n)`.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor, Var};

use super::dense::f32_slice;
use super::fused::{around_dim1, with_values};

/// Per-unit batch mean and population variance of a contiguous CPU tensor `[B, C, ...]`.
pub(crate) fn moments(t: &Tensor) -> Result<(Vec<f32>, Vec<f32>)> {
    let (outer, units, inner) = around_dim1(t.shape())?;
    with_values(t, |v| {
        let mut sum = vec![0f64; units];
        let mut sq = vec![0f64; units];
        for o in 0..outer {
            for u in 0..units {
                let start = (o * units + u) * inner;
                for &x in &v[start..start + inner] {
                    sum[u] += f64::from(x);
                    sq[u] += f64::from(x) * f64::from(x);
                }
            }
        }
        let n = (outer * inner) as f64;
        let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
        let var = sq
            .iter()
            .zip(&mean)
            .map(|(s, m)| ((s / n) - m * m).max(0.0) as f32)
            .collect();
        Ok((mean.into_iter().map(|m| m as f32).collect(), var))
    })
}

/// `running = (1 - momentum) * running + momentum * factor * batch`, on the host (the
/// fused training paths' update of running statistics; `factor` corrects a population
/// variance to the unbiased one).
pub(crate) fn update_running(
    running: &Var,
    batch: &[f32],
    momentum: f64,
    factor: f32,
) -> Result<()> {
    let m = momentum as f32;
    let old = running.as_tensor().to_vec1::<f32>()?;
    let new: Vec<f32> = old
        .iter()
        .zip(batch)
        .map(|(r, b)| (1.0 - m) * r + m * b * factor)
        .collect();
    running.set(&Tensor::from_vec(new, old.len(), running.device())?)
}

/// The normalization with given batch statistics (from [`moments`]).
pub(crate) struct BatchNormTrain {
    pub mean: Vec<f32>,
    /// `1 / sqrt(var + eps)`, or 0 where that is infinite (one value, eps 0): the
    /// output is then `beta` and no gradient passes below.
    pub inv_std: Vec<f32>,
}

impl BatchNormTrain {
    pub fn new(mean: Vec<f32>, var: &[f32], eps: f64) -> Self {
        let inv_std = var
            .iter()
            .map(|&v| {
                let s = (f64::from(v) + eps).sqrt();
                if s > 0.0 {
                    (1.0 / s) as f32
                } else {
                    0.0
                }
            })
            .collect();
        Self { mean, inv_std }
    }
}

impl CustomOp3 for BatchNormTrain {
    fn name(&self) -> &'static str {
        "batch-norm-train"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, gamma, beta) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let (outer, units, inner) = around_dim1(l1.shape())?;
        let mut out = Vec::with_capacity(t.len());
        for o in 0..outer {
            for u in 0..units {
                let start = (o * units + u) * inner;
                let scale = gamma[u] * self.inv_std[u];
                let shift = beta[u] - self.mean[u] * scale;
                out.extend(t[start..start + inner].iter().map(|x| x * scale + shift));
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (outer, units, inner) = around_dim1(t.shape())?;
        let n = (outer * inner) as f32;
        let gamma_values = gamma.to_vec1::<f32>()?;
        let (dt, dgamma, dbeta) = with_values(t, |x| {
            with_values(&grad, |dy| {
                let mut sum_dy = vec![0f32; units];
                let mut sum_dy_xhat = vec![0f32; units];
                for o in 0..outer {
                    for u in 0..units {
                        let start = (o * units + u) * inner;
                        let (m, s) = (self.mean[u], self.inv_std[u]);
                        for (x, g) in x[start..start + inner]
                            .iter()
                            .zip(&dy[start..start + inner])
                        {
                            sum_dy[u] += g;
                            sum_dy_xhat[u] += g * (x - m) * s;
                        }
                    }
                }
                let mut dt = Vec::with_capacity(x.len());
                for o in 0..outer {
                    for u in 0..units {
                        let start = (o * units + u) * inner;
                        let (m, s) = (self.mean[u], self.inv_std[u]);
                        let k = gamma_values[u] * s;
                        let (mean_dy, mean_dy_xhat) = (sum_dy[u] / n, sum_dy_xhat[u] / n);
                        dt.extend(
                            x[start..start + inner]
                                .iter()
                                .zip(&dy[start..start + inner])
                                .map(|(x, g)| k * (g - mean_dy - (x - m) * s * mean_dy_xhat)),
                        );
                    }
                }
                Ok((dt, sum_dy_xhat, sum_dy))
            })
        })?;
        Ok((
            Some(Tensor::from_vec(dt, t.shape(), t.device())?),
            Some(Tensor::from_vec(dgamma, gamma.shape(), gamma.device())?),
            Some(Tensor::from_vec(dbeta, beta.shape(), beta.device())?),
        ))
    }
}

/// Mean-only batch norm's training forward, `y = t - mean_u`, with the backward of a
/// batch mean: `dt = dy - mean_u(dy)`.
pub(crate) struct SubtractUnitMean {
    pub mean: Vec<f32>,
}

impl CustomOp1 for SubtractUnitMean {
    fn name(&self) -> &'static str {
        "subtract-unit-mean"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let t = f32_slice(s, l)?;
        let (outer, units, inner) = around_dim1(l.shape())?;
        let mut out = Vec::with_capacity(t.len());
        for o in 0..outer {
            for (u, m) in self.mean.iter().enumerate().take(units) {
                let start = (o * units + u) * inner;
                out.extend(t[start..start + inner].iter().map(|x| x - m));
            }
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, t: &Tensor, _out: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let (outer, units, inner) = around_dim1(t.shape())?;
        let n = (outer * inner) as f32;
        let dt = with_values(&grad, |dy| {
            let mut mean_dy = vec![0f32; units];
            for o in 0..outer {
                for (u, m) in mean_dy.iter_mut().enumerate() {
                    let start = (o * units + u) * inner;
                    *m += dy[start..start + inner].iter().sum::<f32>();
                }
            }
            mean_dy.iter_mut().for_each(|m| *m /= n);
            let mut dt = Vec::with_capacity(dy.len());
            for o in 0..outer {
                for (u, m) in mean_dy.iter().enumerate() {
                    let start = (o * units + u) * inner;
                    dt.extend(dy[start..start + inner].iter().map(|g| g - m));
                }
            }
            Ok(dt)
        })?;
        Ok(Some(Tensor::from_vec(dt, t.shape(), t.device())?))
    }
}
