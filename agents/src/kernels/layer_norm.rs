//! Layer norm's CPU loops and fused op: each sample's statistics, the normalization
//! with its affine (and a ReLU), and the closed-form backward.
//!
//! Per sample, with `x̂ = (t - mean) / sqrt(var + eps)` over its `n` features:
//! `dbeta = Σ_b dy`, `dgamma = Σ_b dy·x̂`, and with `d = dy·gamma`,
//! `dt = (d - Σd/n - x̂ Σ(d·x̂)/n) / sqrt(var + eps)`.

use candle_core::{CustomOp3, Result, Shape, Tensor};

use super::bias_relu::gradient_through_relu;
use super::dense::lane_sum;
use super::per_agent::OpGradient;
#[cfg(feature = "cuda")]
use super::per_agent::{DeviceOutput, OpInputs};
use super::with_values;
use super::{cpu_forward, gradient_like, Grads3};

/// Host values `t` of whole rows of `gamma.len()` features (layer, group and RMS norm).
pub(crate) fn check_rows(t: &[f32], gamma: &[f32]) -> Result<()> {
    if gamma.is_empty() || !t.len().is_multiple_of(gamma.len()) {
        candle_core::bail!(
            "layer, group or RMS norm: {} values are not rows of {} features",
            t.len(),
            gamma.len()
        );
    }
    Ok(())
}

/// The features of each sample of `t` (all but its first dimension), checked against a
/// per-feature parameter of shape `param`.
pub(crate) fn features_per_sample(t: &Shape, param: &Shape, method: &str) -> Result<usize> {
    let n = t.elem_count() / t.dims().first().copied().unwrap_or(1).max(1);
    if param.elem_count() != n {
        candle_core::bail!("{method}: {t:?} does not fit a parameter of shape {param:?}");
    }
    Ok(n)
}

/// Layer norm, or group norm: each sample's features in `groups` contiguous groups,
/// each normalized by its own statistics, then the affine. Layer norm's parameters are
/// per feature (`spatial = 1`); group norm's per channel, each covering `spatial`
/// positions.
pub(crate) struct FusedLayerNorm {
    pub eps: f64,
    /// A ReLU follows in the same op.
    pub relu: bool,
    pub groups: usize,
    pub spatial: usize,
}

impl FusedLayerNorm {
    /// Per-channel parameters repeated over their positions (as they are, when each
    /// covers one).
    fn per_feature<'a>(&self, p: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        match self.spatial {
            1 => std::borrow::Cow::Borrowed(p),
            s => p.iter().flat_map(|&v| std::iter::repeat_n(v, s)).collect(),
        }
    }

    /// Per-feature sums folded back onto the per-channel parameters.
    fn per_parameter(&self, sums: Vec<f32>) -> Vec<f32> {
        match self.spatial {
            1 => sums,
            s => sums.chunks_exact(s).map(|c| c.iter().sum()).collect(),
        }
    }

    fn statistics(&self, t: &[f32], gamma: &[f32]) -> RowStatistics {
        let features = gamma.len() * self.spatial;
        row_statistics(t, features / self.groups.max(1), self.eps)
    }

    fn forward_values(&self, t: &[f32], gamma: &[f32], beta: &[f32]) -> Vec<f32> {
        let statistics = self.statistics(t, gamma);
        let (g, b) = (self.per_feature(gamma), self.per_feature(beta));
        normalize_rows(t, &statistics, &g, &b, self.relu)
    }

    fn gradients(&self, t: &[f32], gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let statistics = self.statistics(t, gamma);
        let (dt, dg, db) = row_gradients(t, &statistics, &self.per_feature(gamma), dy);
        (dt, self.per_parameter(dg), self.per_parameter(db))
    }

    fn features(&self, t: &Shape, gamma: &Shape) -> Result<usize> {
        let n = t.elem_count() / t.dims().first().copied().unwrap_or(1).max(1);
        let ok = gamma.elem_count() * self.spatial == n && n.is_multiple_of(self.groups.max(1));
        if !ok {
            candle_core::bail!(
                "layer/group norm: {t:?} does not fit {} groups and parameters of shape {gamma:?}",
                self.groups
            );
        }
        Ok(n)
    }
}

impl CustomOp3 for FusedLayerNorm {
    cpu_forward!("layer-norm", |op, t @ l1, gamma @ l2, beta @ l3| {
        op.features(l1.shape(), l2.shape())?;
        let out = op.forward_values(t, gamma, beta);
        Ok((out, l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, gamma: &Tensor, beta: &Tensor, out: &Tensor, dy: &Tensor) -> Grads3 {
        let dy = gradient_through_relu(self.relu, out, dy)?;
        self.features(t.shape(), gamma.shape())?;
        let (dt, dgamma, dbeta) = with_values(t, |t| {
            with_values(&gamma.contiguous()?, |gamma| {
                with_values(&dy, |dy| Ok(self.gradients(t, gamma, dy)))
            })
        })?;
        Ok((
            gradient_like(dt, t)?,
            gradient_like(dgamma, gamma)?,
            gradient_like(dbeta, beta)?,
        ))
    }
}

/// Layer and group norm in a population: the same loops on each agent's values.
impl super::per_agent::AgentKernel<2> for FusedLayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm-per-agent"
    }

    fn forward(&self, _agent: usize, t: &[f32], [gamma, beta]: [&[f32]; 2]) -> Result<Vec<f32>> {
        self.check(t, gamma)?;
        Ok(self.forward_values(t, gamma, beta))
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 2>) -> Result<(Vec<f32>, [Vec<f32>; 2])> {
        let (t, [gamma, _], out, dy) = pass.parts();
        self.check(t, gamma)?;
        let dy = &super::bias_relu::through_relu(self.relu, out, dy);
        let (dt, dg, db) = self.gradients(t, gamma, dy);
        Ok((dt, [dg, db]))
    }

    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 2>) -> DeviceOutput {
        let (agents, t, [gamma, beta]) = (x.agent, x.t, x.params);
        let s = self.cuda_dims(agents, t, gamma)?;
        let (out, stats) = super::cuda::device::row_norm_forward(t, gamma, Some(beta), s)?;
        Ok(Some((out, Some(stats))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 2>) -> Result<(Tensor, [Tensor; 2])> {
        let (t, [gamma, _], out, dy) = pass.parts();
        let agents = pass.inputs.agent;
        let Some(stats) = pass.kept else {
            candle_core::bail!("layer norm: the CUDA forward kept no statistics");
        };
        let s = self.cuda_dims(agents, t, gamma)?;
        let kept = (t, gamma, stats);
        let (dt, dg, db) = super::cuda::device::row_norm_backward(kept, out, dy, s, true)?;
        let Some(db) = db else {
            candle_core::bail!("layer norm: no shift gradient from the CUDA kernel");
        };
        Ok((dt, [dg, db]))
    }
}

impl FusedLayerNorm {
    /// The CUDA kernels' sizes for `t` and `gamma` over `agents`.
    #[cfg(feature = "cuda")]
    fn cuda_dims(
        &self,
        agents: usize,
        t: &Tensor,
        gamma: &Tensor,
    ) -> Result<super::cuda::args::RowNorm> {
        let sizes = (agents, t.elem_count(), gamma.elem_count());
        let kind = (self.relu, false, self.eps);
        super::cuda::args::RowNorm::of(sizes, (self.groups, self.spatial), kind)
    }
}

impl FusedLayerNorm {
    /// One agent's (or network's) values: whole samples of the parameters' features,
    /// in whole groups.
    fn check(&self, t: &[f32], gamma: &[f32]) -> Result<()> {
        let n = gamma.len() * self.spatial;
        if n == 0 || !t.len().is_multiple_of(n) || !n.is_multiple_of(self.groups.max(1)) {
            candle_core::bail!(
                "layer/group norm: {} values do not fit {} groups of {} parameters",
                t.len(),
                self.groups,
                gamma.len()
            );
        }
        Ok(())
    }
}

/// Each sample's (row's) mean and `1 / sqrt(var + eps)`.
pub(crate) struct RowStatistics {
    means: Vec<f32>,
    inv_stds: Vec<f32>,
}

impl RowStatistics {
    /// How many samples these are the statistics of.
    pub(crate) fn rows(&self) -> usize {
        self.means.len()
    }
}

crate::kernels::avx2::dispatch! {
/// Each sample's (row of `n` values) [`RowStatistics`]. Each step for all rows before
/// the next: row by row, every step waited on the one before (sums, a division, sums
/// again, a root), and the rows took 1 us per layer at batch 32.
pub(crate) fn row_statistics(t: &[f32], n: usize, eps: f64) -> RowStatistics {
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

crate::kernels::avx2::dispatch! {
    /// `(t - mean) / sqrt(var + eps) * gamma + beta` per sample (rows of `gamma.len()`
    /// values), then the ReLU if `relu`. The statistics are per group of each row (one
    /// group for layer norm, several for group norm), in order.
    pub(crate) fn normalize_rows(t: &[f32], statistics: &RowStatistics, gamma: &[f32], beta: &[f32], relu: bool) -> Vec<f32> {
        let m = t.len() / statistics.rows().max(1);
        let groups = gamma.len() / m.max(1);
        // Extended, not zero-filled then written: the fill cost as much as the pass.
        let mut out = Vec::with_capacity(t.len());
        let statistics = statistics.means.iter().zip(&statistics.inv_stds);
        for (k, (part, (mean, inv))) in t.chunks_exact(m).zip(statistics).enumerate() {
            let at = (k % groups) * m;
            let values = part.iter().zip(gamma[at..at + m].iter().zip(&beta[at..at + m]));
            if relu {
                out.extend(values.map(|(x, (g, b))| ((x - mean) * inv * g + b).max(0.0)));
            } else {
                out.extend(values.map(|(x, (g, b))| (x - mean) * inv * g + b));
            }
        }
        out
    }
}

crate::kernels::avx2::dispatch! {
    /// `(dL/dt, dL/dgamma, dL/dbeta)` from the input `t` and `dy`, the gradient with
    /// respect to the normalized output (below the ReLU); statistics per group as in
    /// [`normalize_rows`].
    pub(crate) fn row_gradients(t: &[f32], statistics: &RowStatistics, gamma: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = gamma.len();
        let m = t.len() / statistics.rows().max(1);
        let groups = n / m.max(1);
        let mut dgamma = vec![0f32; n];
        let mut dbeta = vec![0f32; n];
        let mut dt = Vec::with_capacity(t.len());
        // One group's x̂ and dy·gamma, reused.
        let (mut xhat, mut d) = (vec![0f32; m], vec![0f32; m]);
        let statistics = statistics.means.iter().zip(&statistics.inv_stds);
        let parts = t.chunks_exact(m).zip(dy.chunks_exact(m)).zip(statistics);
        for (k, ((part, dpart), (mean, inv))) in parts.enumerate() {
            let at = (k % groups) * m;
            // x̂, dy·gamma and the parameters' sums in one pass.
            let values = xhat.iter_mut().zip(d.iter_mut()).zip(part.iter().zip(dpart));
            let sums = dgamma[at..at + m].iter_mut().zip(dbeta[at..at + m].iter_mut()).zip(&gamma[at..at + m]);
            for (((xhat, d), (x, g)), ((dg, db), w)) in values.zip(sums) {
                *xhat = (x - mean) * inv;
                *d = g * w;
                *dg += g * *xhat;
                *db += g;
            }
            let mean_d = lane_sum(&d, &d, |d, _| d) / m as f32;
            let mean_dx = lane_sum(&d, &xhat, |d, x| d * x) / m as f32;
            dt.extend(d.iter().zip(&xhat).map(|(d, x)| inv * (d - mean_d - x * mean_dx)));
        }
        (dt, dgamma, dbeta)
    }
}
