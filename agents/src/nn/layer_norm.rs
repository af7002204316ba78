//! Layer normalization (Ba et al., 2016): each sample is normalized over all of a
//! layer's features (`(C, H, W)` for conv), then scaled and shifted per feature. On the
//! CPU one fused op computes it and its closed-form backward; elsewhere (and as the
//! tested reference) differentiable tensor ops do (candle's own `LayerNorm` drops
//! gradients).
//!
//! Per sample, with `x̂ = (t - mean) / sqrt(var + eps)` over its `n` features:
//! `dbeta = Σ_b dy`, `dgamma = Σ_b dy·x̂`, and with `d = dy·gamma`,
//! `dt = (d - Σd/n - x̂ Σ(d·x̂)/n) / sqrt(var + eps)`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{LayerNorm, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let ln = LayerNorm::new(&mut store, "fc", &[2], 0.0).unwrap();
//! let t = Tensor::new(&[[1.0f32, 3.0], [10.0, 30.0]], &Device::Cpu).unwrap();
//! let y = ln.forward(&t).unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(y, vec![vec![-1.0, 1.0], vec![-1.0, 1.0]]);
//! ```

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, Var};

use super::dense::{f32_slice, lane_sum};
use super::fused::{gradient_through_relu, relu_mask, with_values};
use super::kernel::sample_moments;
use super::{Group, ParamStore};

pub struct LayerNorm {
    gamma: Var,
    beta: Var,
    eps: f64,
}

impl LayerNorm {
    /// `features`: one sample's shape, e.g. `[n]` or `[C, H, W]`.
    pub fn new(store: &mut ParamStore, prefix: &str, features: &[usize], eps: f64) -> Result<Self> {
        Ok(Self {
            gamma: store.ones(&format!("{prefix}.ln.gamma"), features, Group::Weight)?,
            beta: store.zeros(&format!("{prefix}.ln.beta"), features, Group::Weight)?,
            eps,
        })
    }

    pub fn forward(&self, t: &Tensor) -> Result<Tensor> {
        self.forward_then(t, false)
    }

    /// `relu(forward(t))`, in one op on the CPU.
    pub fn forward_relu(&self, t: &Tensor) -> Result<Tensor> {
        self.forward_then(t, true)
    }

    fn forward_then(&self, t: &Tensor, relu: bool) -> Result<Tensor> {
        if !t.device().is_cpu() {
            let y = self.forward_reference(t)?;
            return if relu { y.relu() } else { Ok(y) };
        }
        t.contiguous()?.apply_op3(
            &self.gamma.as_tensor().contiguous()?,
            &self.beta.as_tensor().contiguous()?,
            self.op(relu),
        )
    }

    /// [`Self::forward`] (with the ReLU if `relu`) on host values: `t` holds rows of
    /// this layer's features.
    /// Also returns the samples' statistics, which [`Self::host_backward`] reads.
    pub(crate) fn host_forward(&self, t: &[f32], relu: bool) -> Result<(Vec<f32>, RowStatistics)> {
        with_values(self.gamma.as_tensor(), |gamma| {
            with_values(self.beta.as_tensor(), |beta| {
                check_rows(t, gamma)?;
                let statistics = row_statistics(t, gamma.len(), self.eps);
                let out = normalize_rows(t, &statistics, gamma, beta, relu);
                Ok((out, statistics))
            })
        })
    }

    /// The gradients of [`Self::host_forward`]'s input, `gamma` and `beta` from `dy`, the
    /// gradient of its output `out`.
    pub(crate) fn host_backward(
        &self,
        t: &[f32],
        statistics: &RowStatistics,
        out: &[f32],
        dy: Vec<f32>,
        relu: bool,
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let dy = if relu { relu_mask(out, &dy) } else { dy };
        with_values(self.gamma.as_tensor(), |gamma| {
            check_rows(t, gamma)?;
            if statistics.means.len() * gamma.len() != t.len() {
                candle_core::bail!("layer norm: statistics of another input");
            }
            Ok(row_gradients(t, statistics, gamma, &dy))
        })
    }

    pub(crate) fn gamma(&self) -> &Var {
        &self.gamma
    }

    pub(crate) fn beta(&self) -> &Var {
        &self.beta
    }

    fn op(&self, relu: bool) -> FusedLayerNorm {
        FusedLayerNorm {
            eps: self.eps,
            relu,
        }
    }

    /// The layer through candle's tensor ops.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        let (mean, var) = sample_moments(t)?;
        t.broadcast_sub(&mean)?
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(self.gamma.as_tensor())?
            .broadcast_add(self.beta.as_tensor())
    }
}

/// Host values `t` of whole rows of `gamma.len()` features.
fn check_rows(t: &[f32], gamma: &[f32]) -> Result<()> {
    if gamma.is_empty() || !t.len().is_multiple_of(gamma.len()) {
        candle_core::bail!(
            "layer norm: {} values are not rows of {}",
            t.len(),
            gamma.len()
        );
    }
    Ok(())
}

struct FusedLayerNorm {
    eps: f64,
    /// A ReLU follows in the same op.
    relu: bool,
}

impl FusedLayerNorm {
    fn forward_values(&self, t: &[f32], gamma: &[f32], beta: &[f32]) -> Vec<f32> {
        let statistics = row_statistics(t, gamma.len(), self.eps);
        normalize_rows(t, &statistics, gamma, beta, self.relu)
    }

    fn gradients(&self, t: &[f32], gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        row_gradients(t, &row_statistics(t, gamma.len(), self.eps), gamma, dy)
    }

    fn features(t: &Shape, gamma: &Shape) -> Result<usize> {
        let n = t.elem_count() / t.dims().first().copied().unwrap_or(1).max(1);
        if gamma.elem_count() != n {
            candle_core::bail!("layer norm: {t:?} does not fit an affine of shape {gamma:?}");
        }
        Ok(n)
    }
}

impl CustomOp3 for FusedLayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
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
        Self::features(l1.shape(), l2.shape())?;
        let out = self.forward_values(t, gamma, beta);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        out: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dy = gradient_through_relu(self.relu, out, dy)?;
        Self::features(t.shape(), gamma.shape())?;
        let (dt, dgamma, dbeta) = with_values(t, |t| {
            with_values(&gamma.contiguous()?, |gamma| {
                with_values(&dy, |dy| Ok(self.gradients(t, gamma, dy)))
            })
        })?;
        Ok((
            Some(Tensor::from_vec(dt, t.shape(), t.device())?),
            Some(Tensor::from_vec(dgamma, gamma.shape(), gamma.device())?),
            Some(Tensor::from_vec(dbeta, beta.shape(), beta.device())?),
        ))
    }
}

/// Each sample's (row's) mean and `1 / sqrt(var + eps)`.
pub(crate) struct RowStatistics {
    means: Vec<f32>,
    inv_stds: Vec<f32>,
}

crate::avx2::dispatch! {
/// Each sample's (row of `n` values) [`RowStatistics`]. Each step for all rows before
/// the next: row by row, every step waited on the one before (sums, a division, sums
/// again, a root), and the rows took 1 us per layer at batch 32.
fn row_statistics(t: &[f32], n: usize, eps: f64) -> RowStatistics {
    let rows = t.len() / n.max(1);
    let mut means = vec![0f32; rows];
    for (m, row) in means.iter_mut().zip(t.chunks_exact(n)) {
        *m = lane_sum(row, row, |x, _| x);
    }
    for m in means.iter_mut() {
        *m = (f64::from(*m) / n as f64) as f32;
    }
    let mut inv_stds = vec![0f32; rows];
    for ((v, row), &m) in inv_stds.iter_mut().zip(t.chunks_exact(n)).zip(&means) {
        *v = lane_sum(row, row, |x, _| (x - m) * (x - m));
    }
    for v in inv_stds.iter_mut() {
        *v = (1.0 / (f64::from(*v) / n as f64 + eps).sqrt()) as f32;
    }
    RowStatistics { means, inv_stds }
}
}

crate::avx2::dispatch! {
    /// `(t - mean) / sqrt(var + eps) * gamma + beta` per sample (row of `gamma.len()`
    /// values), then the ReLU if `relu`.
    fn normalize_rows(t: &[f32], statistics: &RowStatistics, gamma: &[f32], beta: &[f32], relu: bool) -> Vec<f32> {
        let n = gamma.len();
        // Extended, not zero-filled then written: the fill cost as much as the pass.
        let mut out = Vec::with_capacity(t.len());
        let statistics = statistics.means.iter().zip(&statistics.inv_stds);
        for (row, (m, inv)) in t.chunks_exact(n).zip(statistics) {
            let values = row.iter().zip(gamma.iter().zip(beta));
            if relu {
                out.extend(values.map(|(x, (g, b))| ((x - m) * inv * g + b).max(0.0)));
            } else {
                out.extend(values.map(|(x, (g, b))| (x - m) * inv * g + b));
            }
        }
        out
    }
}

crate::avx2::dispatch! {
    /// `(dL/dt, dL/dgamma, dL/dbeta)` from the input `t` and `dy`, the gradient with
    /// respect to the normalized output (below the ReLU).
    fn row_gradients(t: &[f32], statistics: &RowStatistics, gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = gamma.len();
        let mut dgamma = vec![0f32; n];
        let mut dbeta = vec![0f32; n];
        let mut dt = Vec::with_capacity(t.len());
        // One row's x̂ and dy·gamma, reused.
        let (mut xhat, mut d) = (vec![0f32; n], vec![0f32; n]);
        let statistics = statistics.means.iter().zip(&statistics.inv_stds);
        for ((row, drow), (m, inv)) in t.chunks_exact(n).zip(dy.chunks_exact(n)).zip(statistics) {
            // x̂, dy·gamma and the parameters' sums in one pass.
            let values = xhat.iter_mut().zip(d.iter_mut()).zip(row.iter().zip(drow));
            let sums = dgamma.iter_mut().zip(dbeta.iter_mut()).zip(gamma);
            for (((xhat, d), (x, g)), ((dg, db), w)) in values.zip(sums) {
                *xhat = (x - m) * inv;
                *d = g * w;
                *dg += g * *xhat;
                *db += g;
            }
            let mean_d = lane_sum(&d, &d, |d, _| d) / n as f32;
            let mean_dx = lane_sum(&d, &xhat, |d, x| d * x) / n as f32;
            dt.extend(
                d.iter()
                    .zip(&xhat)
                    .map(|(d, x)| inv * (d - mean_d - x * mean_dx)),
            );
        }
        (dt, dgamma, dbeta)
    }
}
