//! Batch norm's forward and backward (training and evaluation mode) and mean-only batch
//! norm's training forward and backward as fused CPU ops (candle's broadcasting
//! reductions made them several passes and allocations each way).
//!
//! Forward, per unit `u` over its `n` values: `y = gamma_u * (t - mean_u) * inv_std_u +
//! beta_u` with `inv_std_u = 1 / sqrt(var_u + eps)` (population variance). Backward:
//! `dbeta = Σ dy`, `dgamma = Σ dy·x̂`, `dt = gamma · inv_std · (dy - Σdy/n - x̂ Σdy·x̂/n)`
//! with batch statistics; with running statistics (constants) `dt = gamma · inv_std · dy`.

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, Var,
};

use super::dense::f32_slice;
use super::fused::{
    gradient_through_relu, relu_backward, relu_in_place, unit_bias_fits, with_values, Units,
};

/// Per-unit batch mean and population variance of a contiguous CPU tensor `[B, C, ...]`.
pub(crate) fn moments(t: &Tensor) -> Result<(Vec<f32>, Vec<f32>)> {
    let units = Units::of(t.shape())?;
    with_values(t, |v| Ok(moments_of(&units, v)))
}

/// [`moments`] of host values laid out as `units` says.
pub(crate) fn moments_of(units: &Units, v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut sum = vec![0f64; units.units];
    let mut sq = vec![0f64; units.units];
    if units.inner == 1 {
        feature_sums(v, &mut sum, &mut sq);
    } else {
        units.runs(|u, run| {
            // Four partial sums each: independent additions pipeline.
            let (mut s4, mut q4) = ([0f64; 4], [0f64; 4]);
            let chunks = v[run].chunks_exact(4);
            for &x in chunks.remainder() {
                sum[u] += f64::from(x);
                sq[u] += f64::from(x) * f64::from(x);
            }
            for c in chunks {
                for ((s, q), &x) in s4.iter_mut().zip(q4.iter_mut()).zip(c) {
                    *s += f64::from(x);
                    *q += f64::from(x) * f64::from(x);
                }
            }
            sum[u] += s4.iter().sum::<f64>();
            sq[u] += q4.iter().sum::<f64>();
        });
    }
    let n = units.per_unit() as f64;
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let var = sq
        .iter()
        .zip(&mean)
        .map(|(s, m)| ((s / n) - m * m).max(0.0) as f32)
        .collect();
    (mean.into_iter().map(|m| m as f32).collect(), var)
}

crate::avx2::dispatch! {
    /// Per-feature sums of `x` and `x^2` over the rows of `v` (`[B, units]`), each
    /// feature its own running sum: the additions run across features in SIMD lanes.
    fn feature_sums(v: &[f32], sum: &mut [f64], sq: &mut [f64]) {
        let u = sum.len();
        let (sum, sq) = (&mut sum[..u], &mut sq[..u]);
        for row in v.chunks_exact(u) {
            let row = &row[..u];
            for j in 0..u {
                let x = f64::from(row[j]);
                sum[j] += x;
                sq[j] += x * x;
            }
        }
    }
}

crate::avx2::dispatch! {
    /// `(t - mean) * scale + beta` per feature, row by row, and `max(·, 0)` with
    /// `relu`, in the same pass (into a buffer that is written once, not zeroed first).
    fn normalize_features(
        t: &[f32],
        mean: &[f32],
        scale: &[f32],
        beta: &[f32],
        relu: bool,
    ) -> Vec<f32> {
        let u = mean.len();
        let (m, scale, beta) = (&mean[..u], &scale[..u], &beta[..u]);
        let mut out = Vec::with_capacity(t.len());
        for row in t.chunks_exact(u) {
            let values = row.iter().zip(m).zip(scale).zip(beta);
            let normalized = values.map(|(((x, m), s), b)| (x - m) * s + b);
            if relu {
                out.extend(normalized.map(|y| y.max(0.0)));
            } else {
                out.extend(normalized);
            }
        }
        out
    }
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
    if batch.len() != running.elem_count() {
        candle_core::bail!(
            "running statistics of {} values for {} units",
            running.elem_count(),
            batch.len()
        );
    }
    running.as_tensor().inplace_op1(&BlendRunning {
        batch,
        momentum: momentum as f32,
        factor,
    })
}

/// The running-statistics update in place (no copy out and back).
struct BlendRunning<'a> {
    batch: &'a [f32],
    momentum: f32,
    factor: f32,
}

impl candle_core::InplaceOp1 for BlendRunning<'_> {
    fn name(&self) -> &'static str {
        "blend-running-statistics"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let (CpuStorage::F32(v), Some((a, b))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("running statistics must be contiguous f32 values");
        };
        let m = self.momentum;
        for (r, x) in v[a..b].iter_mut().zip(self.batch) {
            *r = (1.0 - m) * *r + m * x * self.factor;
        }
        Ok(())
    }
}

/// The normalization with given statistics: the batch's (from [`moments`]), through
/// which gradients flow, or running ones, which are constants.
#[derive(Clone)]
pub(crate) struct BatchNormOp {
    pub mean: Vec<f32>,
    /// `1 / sqrt(var + eps)`, or 0 where that is infinite (one value, eps 0): the
    /// output is then `beta` and no gradient passes below.
    pub inv_std: Vec<f32>,
    pub batch_statistics: bool,
    /// A ReLU follows in the same op (one graph node for a hidden layer).
    pub relu: bool,
}

impl BatchNormOp {
    /// Training mode: `mean` and `var` are this batch's.
    pub fn training(mean: Vec<f32>, var: &[f32], eps: f64) -> Self {
        Self::new(mean, var, eps, true)
    }

    /// Evaluation mode: `mean` and `var` are the running statistics.
    pub fn evaluation(mean: Vec<f32>, var: &[f32], eps: f64) -> Self {
        Self::new(mean, var, eps, false)
    }

    fn new(mean: Vec<f32>, var: &[f32], eps: f64, batch_statistics: bool) -> Self {
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
        Self {
            mean,
            inv_std,
            batch_statistics,
            relu: false,
        }
    }

    /// The same normalization followed by a ReLU.
    pub fn with_relu(self, relu: bool) -> Self {
        Self { relu, ..self }
    }

    /// The layer's output on host values `t` laid out as `units` says, and a ReLU's
    /// after it with `relu`.
    pub(crate) fn normalize(
        &self,
        units: &Units,
        t: &[f32],
        gamma: &[f32],
        beta: &[f32],
        relu: bool,
    ) -> Result<Vec<f32>> {
        // (t - mean) first: folding the mean into a shift loses precision when the
        // scale is large (a variance near 0).
        let scale: Vec<f32> = gamma
            .iter()
            .zip(&self.inv_std)
            .map(|(g, s)| g * s)
            .collect();
        let out = if units.inner == 1 {
            if [self.mean.len(), scale.len(), beta.len()] != [units.units; 3] {
                candle_core::bail!("batch norm: statistics do not fit {} units", units.units);
            }
            normalize_features(t, &self.mean, &scale, beta, relu)
        } else {
            let per_unit: Vec<[f32; 3]> = (0..units.units)
                .map(|u| [self.mean[u], scale[u], beta[u]])
                .collect();
            let mut out = units.map(t, &per_unit, |t, [m, scale, beta]| (t - m) * scale + beta);
            if relu {
                relu_in_place(&mut out);
            }
            out
        };
        Ok(out)
    }
}

impl CustomOp3 for BatchNormOp {
    fn name(&self) -> &'static str {
        "batch-norm"
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
        let out = self.normalize(&Units::of(l1.shape())?, t, gamma, beta, self.relu)?;
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let units = Units::of(t.shape())?;
        let gamma_values = gamma.to_vec1::<f32>()?;
        let (dt, dgamma, dbeta) = if units.inner == 1 {
            self.gradients_over_features(t, &gamma_values, out, grad)?
        } else {
            self.gradients_over_channels(&units, t, &gamma_values, out, grad)?
        };
        Ok((
            Some(Tensor::from_vec(dt, t.shape(), t.device())?),
            Some(Tensor::from_vec(dgamma, gamma.shape(), gamma.device())?),
            Some(Tensor::from_vec(dbeta, beta.shape(), beta.device())?),
        ))
    }
}

type Gradients = (Vec<f32>, Vec<f32>, Vec<f32>);

impl BatchNormOp {
    /// `(dt, dgamma, dbeta)` over features (`[B, units]`), the ReLU's mask applied
    /// inside the one backward pass.
    fn gradients_over_features(
        &self,
        t: &Tensor,
        gamma: &[f32],
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<Gradients> {
        with_values(t, |x| {
            with_values(&grad.contiguous()?, |dy| {
                with_values(out, |y| {
                    Ok(self.feature_gradients(gamma, x, y, dy, self.relu))
                })
            })
        })
    }

    /// `(dt, dgamma, dbeta)` over features on host values: the layer input `x`, the
    /// output `y` (read only with `relu`, a ReLU ending the layer) and its gradient `dy`.
    pub(crate) fn feature_gradients(
        &self,
        gamma: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &[f32],
        relu: bool,
    ) -> Gradients {
        let features = FeatureBackward {
            gamma,
            mean: &self.mean,
            inv_std: &self.inv_std,
            batch_statistics: self.batch_statistics,
        };
        feature_gradients(&features, x, dy, relu.then_some(y))
    }

    /// `(dt, dgamma, dbeta)` over channels (`[B, C, H, W]`), per unit's runs.
    fn gradients_over_channels(
        &self,
        units: &Units,
        t: &Tensor,
        gamma: &[f32],
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<Gradients> {
        let grad = gradient_through_relu(self.relu, out, grad)?;
        let n = units.per_unit() as f32;
        let (m, s) = (&self.mean, &self.inv_std);
        with_values(t, |x| {
            with_values(&grad, |dy| {
                let stats: Vec<(f32, f32)> = m.iter().copied().zip(s.iter().copied()).collect();
                let sum_dy = units.sums(dy);
                let sum_dy_xhat = units.sums2(x, dy, &stats, |x, dy, (m, s)| dy * (x - m) * s);
                if !self.batch_statistics {
                    let k: Vec<f32> = gamma.iter().zip(s).map(|(g, s)| g * s).collect();
                    let dt = units.map(dy, &k, |dy, k| k * dy);
                    return Ok((dt, sum_dy_xhat, sum_dy));
                }
                // dt = k * (dy - mean_dy - (x - m) * s * mean_dy_xhat) per unit.
                let per_unit: Vec<[f32; 5]> = (0..units.units)
                    .map(|u| {
                        let k = gamma[u] * s[u];
                        [k, sum_dy[u] / n, m[u], s[u], sum_dy_xhat[u] / n]
                    })
                    .collect();
                let dt = units.map2(
                    x,
                    dy,
                    &per_unit,
                    |x, dy, [k, mean_dy, m, s, mean_dy_xhat]| {
                        k * (dy - mean_dy - (x - m) * s * mean_dy_xhat)
                    },
                );
                Ok((dt, sum_dy_xhat, sum_dy))
            })
        })
    }
}

/// Batch norm's backward over features (`[B, units]`, an MLP layer), row by row with
/// each per-unit quantity in its own array: the loops then run across units in SIMD
/// lanes, where per-unit tuples did not vectorize.
struct FeatureBackward<'a> {
    gamma: &'a [f32],
    mean: &'a [f32],
    inv_std: &'a [f32],
    batch_statistics: bool,
}

crate::avx2::dispatch! {
    /// `(dt, dgamma, dbeta)` from the layer input `x` and the output gradient `dy`;
    /// with `relu_out` (the op's output when a ReLU ends it), `dy` only where it is > 0.
    fn feature_gradients(
        fb: &FeatureBackward<'_>,
        x: &[f32],
        dy: &[f32],
        relu_out: Option<&[f32]>,
    ) -> Gradients {
        fb.gradients(x, dy, relu_out)
    }
}

impl FeatureBackward<'_> {
    #[inline(always)]
    fn gradients(&self, x: &[f32], dy: &[f32], relu_out: Option<&[f32]>) -> Gradients {
        let units = self.gamma.len();
        let (m, s) = (&self.mean[..units], &self.inv_std[..units]);
        let rows = x.len() / units.max(1);
        // dt holds the gradient below the ReLU first, then is rewritten in place.
        let mut dt = match relu_out {
            Some(y) => y
                .iter()
                .zip(dy)
                .map(|(y, d)| if *y > 0.0 { *d } else { 0.0 })
                .collect(),
            None => dy.to_vec(),
        };
        let (mut sum_dy, mut sum_dy_xhat) = (vec![0f32; units], vec![0f32; units]);
        let (sum_dy_u, sum_dy_xhat_u) = (&mut sum_dy[..units], &mut sum_dy_xhat[..units]);
        for (x, d) in x.chunks_exact(units).zip(dt.chunks_exact(units)) {
            let (x, d) = (&x[..units], &d[..units]);
            for u in 0..units {
                sum_dy_u[u] += d[u];
                sum_dy_xhat_u[u] += d[u] * (x[u] - m[u]) * s[u];
            }
        }
        let k: Vec<f32> = self.gamma.iter().zip(s).map(|(g, s)| g * s).collect();
        let k = &k[..units];
        if !self.batch_statistics {
            for dt in dt.chunks_exact_mut(units) {
                let dt = &mut dt[..units];
                for u in 0..units {
                    dt[u] *= k[u];
                }
            }
            return (dt, sum_dy_xhat, sum_dy);
        }
        let n = rows as f32;
        let mean_dy: Vec<f32> = sum_dy.iter().map(|v| v / n).collect();
        let mean_dy_xhat: Vec<f32> = sum_dy_xhat.iter().map(|v| v / n).collect();
        let (mean_dy, mean_dy_xhat) = (&mean_dy[..units], &mean_dy_xhat[..units]);
        for (dt, x) in dt.chunks_exact_mut(units).zip(x.chunks_exact(units)) {
            let (dt, x) = (&mut dt[..units], &x[..units]);
            for u in 0..units {
                dt[u] = k[u] * (dt[u] - mean_dy[u] - (x[u] - m[u]) * s[u] * mean_dy_xhat[u]);
            }
        }
        (dt, sum_dy_xhat, sum_dy)
    }
}

/// `d - mean_u(d)` per unit, given the per-unit sums of `d`: the gradient through a
/// subtracted batch mean.
fn centered(units: &Units, d: &[f32], sums: &[f32]) -> Vec<f32> {
    let n = units.per_unit() as f32;
    let means: Vec<f32> = sums.iter().map(|s| s / n).collect();
    units.map(d, &means, |d, m| d - m)
}

/// Mean-only batch norm's forward, `y = t - mean_u`. With the batch's mean, the
/// backward is that of a batch mean, `dt = dy - mean_u(dy)`; with the running mean (a
/// constant), `dt = dy`.
pub(crate) struct SubtractUnitMean {
    pub mean: Vec<f32>,
    pub batch_statistics: bool,
}

impl CustomOp1 for SubtractUnitMean {
    fn name(&self) -> &'static str {
        "subtract-unit-mean"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let t = f32_slice(s, l)?;
        let out = Units::of(l.shape())?.map(t, &self.mean, |t, m| t - m);
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, t: &Tensor, _out: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        if !self.batch_statistics {
            return Ok(Some(grad.clone()));
        }
        let grad = grad.contiguous()?;
        let units = Units::of(t.shape())?;
        let dt = with_values(&grad, |dy| Ok(centered(&units, dy, &units.sums(dy))))?;
        Ok(Some(Tensor::from_vec(dt, t.shape(), t.device())?))
    }
}

/// Mean-only batch norm, the layer's bias and the ReLU in one op:
/// `y = relu(t - mean_u + b_u)`. Backward: `d = dy` where `y > 0`, `db = Σ d`, and
/// `dt = d - mean_u(d)` with the batch's mean, `dt = d` with the running mean.
pub(crate) struct CenteredBiasRelu {
    pub mean: Vec<f32>,
    pub batch_statistics: bool,
}

impl CustomOp2 for CenteredBiasRelu {
    fn name(&self) -> &'static str {
        "centered-bias-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, b) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let units = unit_bias_fits(l1.shape(), b)?;
        if self.mean.len() != units.units {
            candle_core::bail!(
                "mean of {} values for {} units",
                self.mean.len(),
                units.units
            );
        }
        let shift: Vec<f32> = b.iter().zip(&self.mean).map(|(b, m)| b - m).collect();
        // (t - m) + b equals t + (b - m) up to rounding; one shift per unit.
        let out = units.map(t, &shift, |t, shift| (t + shift).max(0.0));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        b: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = relu_backward(out, grad)?;
        let units = Units::of(t.shape())?;
        let (dt, db) = with_values(&d, |d| {
            let db = units.sums(d);
            if !self.batch_statistics {
                return Ok((None, db));
            }
            Ok((Some(centered(&units, d, &db)), db))
        })?;
        let dt = match dt {
            Some(dt) => Tensor::from_vec(dt, t.shape(), t.device())?,
            None => d,
        };
        Ok((Some(dt), Some(Tensor::from_vec(db, b.shape(), b.device())?)))
    }
}
