//! Batch norm's forward and backward (training and evaluation mode) as fused CPU ops
//! (candle's broadcasting reductions made them several passes and allocations each way).
//! Mean-only batch norm's are in `kernels/mean_only_bn.rs`.
//!
//! Forward, per unit `u` over its `n` values: `y = gamma_u * (t - mean_u) * inv_std_u +
//! beta_u` with `inv_std_u = 1 / sqrt(var_u + eps)` (population variance). Backward:
//! `dbeta = Σ dy`, `dgamma = Σ dy·x̂`, `dt = gamma · inv_std · (dy - Σdy/n - x̂ Σdy·x̂/n)`
//! with batch statistics; with running statistics (constants) `dt = gamma · inv_std · dy`.
//!
//! Batch renormalization is the same op with a per-unit correction `(r, d)` held
//! constant in the backward ([`Renorm`]): `y = gamma (x̂ r + d) + beta` is batch norm
//! with gain `gamma r` and shift `beta + gamma d`, and `dgamma = r Σdy·x̂ + d Σdy`.

use std::borrow::Cow;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Tensor, Var};

use super::bias_relu::{gradient_through_relu, relu_in_place};
use super::dense::f32_slice_mut;
use super::feature_pass::{
    affine_features, affine_features_into, affine_in_place, block, Affine, BLOCK,
};
use super::per_agent::OpGradient;
#[cfg(feature = "cuda")]
use super::per_agent::{DeviceOutput, OpInputs};
use super::units::Units;
use super::with_values;
use super::{cpu_forward, gradient_like, Grads3};

/// Per-unit batch mean and population variance of host values laid out as `units`
/// says.
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
    moments_from_sums(&sum, &sq, units.per_unit() as f64)
}

crate::kernels::avx2::dispatch! {
    /// `(mean, population variance)` per unit from the sums of `x` and `x^2` over `n`
    /// values, in SIMD lanes (one at a time, the divisions cost as much as the sums).
    fn moments_from_sums(sum: &[f64], sq: &[f64], n: f64) -> (Vec<f32>, Vec<f32>) {
        let (mut mean, mut var) = (vec![0f32; sum.len()], vec![0f32; sum.len()]);
        let units = mean.iter_mut().zip(var.iter_mut()).zip(sum.iter().zip(sq));
        for ((mean, var), (sum, sq)) in units {
            let m = sum / n;
            *mean = m as f32;
            *var = ((sq / n) - m * m).max(0.0) as f32;
        }
        (mean, var)
    }
}

crate::kernels::avx2::dispatch! {
    /// Per-feature sums of `x` and `x^2` over the rows of `v` (`[B, units]`), each
    /// feature its own running sum. Blocks of features ([`BLOCK`]) go down all the rows,
    /// so that their sums stay in registers (across a whole row they did not fit).
    fn feature_sums(v: &[f32], sum: &mut [f64], sq: &mut [f64]) {
        let u = sum.len();
        let blocks = u / BLOCK;
        for b in 0..blocks {
            let (mut s, mut q) = ([0f64; BLOCK], [0f64; BLOCK]);
            for row in v.chunks_exact(u) {
                let x = &row[b * BLOCK..][..BLOCK];
                for j in 0..BLOCK {
                    let x = f64::from(x[j]);
                    s[j] += x;
                    q[j] += x * x;
                }
            }
            sum[b * BLOCK..][..BLOCK].copy_from_slice(&s);
            sq[b * BLOCK..][..BLOCK].copy_from_slice(&q);
        }
        for row in v.chunks_exact(u) {
            for j in blocks * BLOCK..u {
                let x = f64::from(row[j]);
                sum[j] += x;
                sq[j] += x * x;
            }
        }
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
        let m = self.momentum;
        for (r, x) in f32_slice_mut(storage, layout)?.iter_mut().zip(self.batch) {
            *r = (1.0 - m) * *r + m * x * self.factor;
        }
        Ok(())
    }
}

crate::kernels::avx2::dispatch! {
    /// `1 / sqrt(var + eps)` per unit, or 0 where that is infinite, in SIMD lanes (one
    /// at a time, the roots and quotients cost more than a whole pass over a layer).
    fn inverse_std(var: &[f32], eps: f64) -> Vec<f32> {
        var.iter()
            .map(|&v| {
                let s = (f64::from(v) + eps).sqrt();
                let inv = (1.0 / s) as f32;
                if s > 0.0 {
                    inv
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// The normalization with given statistics: the batch's (from [`moments_of`]), through
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
    /// Batch renormalization's correction, in training mode.
    pub renorm: Option<Renorm>,
}

/// Batch renormalization's per-unit correction (Ioffe 2017), constants of the backward:
/// `r = clip(s_B / s, 1/r_max, r_max)`, `d = clip((mu_B - mu) / s, -d_max, d_max)`, with
/// the batch's `mu_B`, `s_B = sqrt(var_B + eps)` and the running `mu`, `s`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Renorm {
    pub r: Vec<f32>,
    pub d: Vec<f32>,
}

/// The clip bounds of [`Renorm`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RenormBounds {
    pub r_max: f64,
    pub d_max: f64,
    pub eps: f64,
}

impl Renorm {
    /// The correction of batch moments `(mean, var)` against running ones.
    pub fn of(batch: (&[f32], &[f32]), running: (&[f32], &[f32]), bounds: RenormBounds) -> Self {
        let RenormBounds { r_max, d_max, eps } = bounds;
        let units = batch
            .0
            .iter()
            .zip(batch.1)
            .zip(running.0.iter().zip(running.1));
        let (r, d) = units
            .map(|((&mu_b, &var_b), (&mu, &var))| {
                let s_b = (f64::from(var_b) + eps).sqrt();
                let s = (f64::from(var) + eps).sqrt();
                let r = (s_b / s).clamp(1.0 / r_max, r_max);
                let d = ((f64::from(mu_b) - f64::from(mu)) / s).clamp(-d_max, d_max);
                (r as f32, d as f32)
            })
            .unzip();
        Self { r, d }
    }
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
        let inv_std = inverse_std(var, eps);
        Self {
            mean,
            inv_std,
            batch_statistics,
            relu: false,
            renorm: None,
        }
    }

    /// The same training-mode op with batch renormalization's correction.
    pub fn with_renorm(self, renorm: Renorm) -> Self {
        Self {
            renorm: Some(renorm),
            ..self
        }
    }

    /// The gain and shift batch norm applies: `gamma` and `beta`, or with a
    /// renormalization `gamma r` and `beta + gamma d`.
    fn renormed<'a>(&self, gamma: &'a [f32], beta: &'a [f32]) -> (Cow<'a, [f32]>, Cow<'a, [f32]>) {
        let Some(Renorm { d, .. }) = &self.renorm else {
            return (Cow::Borrowed(gamma), Cow::Borrowed(beta));
        };
        let shift = beta
            .iter()
            .zip(gamma.iter().zip(d))
            .map(|(b, (g, d))| b + g * d);
        (self.gain(gamma), Cow::Owned(shift.collect()))
    }

    /// The gain alone: `gamma`, or `gamma r`.
    fn gain<'a>(&self, gamma: &'a [f32]) -> Cow<'a, [f32]> {
        match &self.renorm {
            None => Cow::Borrowed(gamma),
            Some(Renorm { r, .. }) => Cow::Owned(gamma.iter().zip(r).map(|(g, r)| g * r).collect()),
        }
    }

    /// `dgamma` from batch norm's `Σdy·x̂` (`dgain`) and `Σdy` (`dbeta`): itself, or
    /// with a renormalization `r Σdy·x̂ + d Σdy`.
    fn gamma_gradient(&self, dgain: Vec<f32>, dbeta: &[f32]) -> Vec<f32> {
        match &self.renorm {
            None => dgain,
            Some(Renorm { r, d }) => dgain
                .iter()
                .zip(dbeta)
                .zip(r.iter().zip(d))
                .map(|((g, b), (r, d))| r * g + d * b)
                .collect(),
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
        let (gamma, beta) = self.renormed(gamma, beta);
        let (gamma, beta) = (&gamma[..], &beta[..]);
        let scale = self.scale(gamma);
        let out = if units.inner == 1 {
            let affine = self.feature_affine(units.units, &scale, beta, relu)?;
            affine_features(t, units.units, affine)
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

    /// [`Self::normalize`] of features (`[B, units]`) appended to `out` (a population
    /// appends each agent's).
    pub(crate) fn normalize_features_into(
        &self,
        t: &[f32],
        (gamma, beta): (&[f32], &[f32]),
        relu: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (gamma, beta) = self.renormed(gamma, beta);
        let scale = self.scale(&gamma);
        let units = self.mean.len();
        let affine = self.feature_affine(units, &scale, &beta, relu)?;
        affine_features_into(t, units, affine, out);
        Ok(())
    }

    /// [`Self::normalize`] of features (`[B, units]`) in place, where the input is not
    /// kept (evaluation forwards): no buffer to allocate.
    pub(crate) fn normalize_features_in_place(
        &self,
        t: &mut [f32],
        gamma: &[f32],
        beta: &[f32],
        relu: bool,
    ) -> Result<()> {
        let (gamma, beta) = self.renormed(gamma, beta);
        let (gamma, beta) = (&gamma[..], &beta[..]);
        let scale = self.scale(gamma);
        let units = self.mean.len();
        affine_in_place(t, units, self.feature_affine(units, &scale, beta, relu)?);
        Ok(())
    }

    /// `gamma_u / sqrt(var_u + eps)`.
    pub(crate) fn scale(&self, gamma: &[f32]) -> Vec<f32> {
        gamma
            .iter()
            .zip(&self.inv_std)
            .map(|(g, s)| g * s)
            .collect()
    }

    /// `relu((t - mean) * scale + beta)` over `units` features, checked against the
    /// statistics. `(t - mean)` first: folding the mean into a shift loses precision
    /// when the scale is large (a variance near 0).
    fn feature_affine<'a>(
        &'a self,
        units: usize,
        scale: &'a [f32],
        beta: &'a [f32],
        relu: bool,
    ) -> Result<Affine<'a>> {
        if [self.mean.len(), scale.len(), beta.len()] != [units; 3] {
            candle_core::bail!("batch norm: statistics do not fit {units} units");
        }
        Ok(Affine {
            center: Some(&self.mean),
            scale: Some(scale),
            bias: Some(beta),
            relu,
        })
    }
}

impl CustomOp3 for BatchNormOp {
    cpu_forward!("batch-norm", |op, t @ l1, gamma @ l2, beta @ l3| {
        let out = op.normalize(&Units::of(l1.shape())?, t, gamma, beta, op.relu)?;
        Ok((out, l1.shape().clone()))
    });

    fn bwd(
        &self,
        t: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Grads3 {
        let units = Units::of(t.shape())?;
        let gamma_values = gamma.to_vec1::<f32>()?;
        let gain = self.gain(&gamma_values);
        let (dt, dgain, dbeta) = if units.inner == 1 {
            self.gradients_over_features(t, &gain, out, grad)?
        } else {
            self.gradients_over_channels(&units, t, &gain, out, grad)?
        };
        let dgamma = self.gamma_gradient(dgain, &dbeta);
        Ok((
            gradient_like(dt, t)?,
            gradient_like(dgamma, gamma)?,
            gradient_like(dbeta, beta)?,
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
                    let mut dt = dy.to_vec();
                    let (dgamma, dbeta) = self.gain_gradients(gamma, x, y, &mut dt, self.relu);
                    Ok((dt, dgamma, dbeta))
                })
            })
        })
    }

    /// `(dgamma, dbeta)` over features on host values, turning the output gradient `dy`
    /// into the layer input's in place: `x` is the layer input and `y` the output
    /// (read only with `relu`, a ReLU ending the layer).
    pub(crate) fn feature_gradients(
        &self,
        gamma: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        relu: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let gain = self.gain(gamma);
        let (dgain, dbeta) = self.gain_gradients(&gain, x, y, dy, relu);
        (self.gamma_gradient(dgain, &dbeta), dbeta)
    }

    /// [`Self::feature_gradients`] for the gain batch norm applies (`gamma r` with a
    /// renormalization): `(Σdy·x̂, Σdy)`.
    fn gain_gradients(
        &self,
        gain: &[f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        relu: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let features = FeatureBackward {
            gamma: gain,
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
        with_values(t, |x| {
            with_values(&grad, |dy| Ok(self.channel_gradients(units, x, gamma, dy)))
        })
    }

    /// [`Self::gradients_over_channels`] on host values, `dy` already through the ReLU.
    fn channel_gradients(&self, units: &Units, x: &[f32], gamma: &[f32], dy: &[f32]) -> Gradients {
        let n = units.per_unit() as f32;
        let (m, s) = (&self.mean, &self.inv_std);
        let stats: Vec<(f32, f32)> = m.iter().copied().zip(s.iter().copied()).collect();
        let sum_dy = units.sums(dy);
        let sum_dy_xhat = units.sums2(x, dy, &stats, |x, dy, (m, s)| dy * (x - m) * s);
        if !self.batch_statistics {
            let k: Vec<f32> = gamma.iter().zip(s).map(|(g, s)| g * s).collect();
            let dt = units.map(dy, &k, |dy, k| k * dy);
            return (dt, sum_dy_xhat, sum_dy);
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
        (dt, sum_dy_xhat, sum_dy)
    }
}

/// Batch norm in a population: each agent's op (its own batch or running statistics,
/// its own renormalization) on its values, laid out as `units` says.
pub(crate) struct AgentBatchNorm {
    pub ops: Vec<BatchNormOp>,
    pub units: Units,
}

impl super::per_agent::AgentKernel<2> for AgentBatchNorm {
    fn name(&self) -> &'static str {
        "batch-norm-per-agent"
    }

    fn forward(&self, agent: usize, t: &[f32], [gamma, beta]: [&[f32]; 2]) -> Result<Vec<f32>> {
        let op = self.op(agent, t, gamma)?;
        op.normalize(&self.units, t, gamma, beta, op.relu)
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 2>) -> Result<(Vec<f32>, [Vec<f32>; 2])> {
        let (x, [gamma, _], out, dy) = pass.parts();
        let agent = pass.inputs.agent;
        let op = self.op(agent, x, gamma)?;
        if self.units.inner == 1 {
            let mut dt = dy.to_vec();
            let (dgamma, dbeta) = op.feature_gradients(gamma, x, out, &mut dt, op.relu);
            return Ok((dt, [dgamma, dbeta]));
        }
        let masked = super::bias_relu::through_relu(op.relu, out, dy);
        let (dt, dgain, dbeta) = op.channel_gradients(&self.units, x, &op.gain(gamma), &masked);
        Ok((dt, [op.gamma_gradient(dgain, &dbeta), dbeta]))
    }

    fn forward_extend(
        &self,
        agent: usize,
        t: &[f32],
        [gamma, beta]: [&[f32]; 2],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let op = self.op(agent, t, gamma)?;
        if self.units.inner != 1 {
            out.extend(op.normalize(&self.units, t, gamma, beta, op.relu)?);
            return Ok(());
        }
        // Features: the single network's one pass, written where the agent's run goes.
        op.normalize_features_into(t, (gamma, beta), op.relu, out)
    }

    fn backward_extend(
        &self,
        pass: OpGradient<'_, [f32], 2>,
        dt: &mut Vec<f32>,
    ) -> Result<[Vec<f32>; 2]> {
        let (x, [gamma, _], out, dy) = pass.parts();
        let agent = pass.inputs.agent;
        let op = self.op(agent, x, gamma)?;
        if self.units.inner != 1 || dy.len() != x.len() || out.len() != x.len() {
            let (d, params) = self.backward(pass)?;
            dt.extend(d);
            return Ok(params);
        }
        // Features: the gradient made in place where the agent's run goes.
        let at = dt.len();
        dt.extend_from_slice(dy);
        let (dgamma, dbeta) = op.feature_gradients(gamma, x, out, &mut dt[at..], op.relu);
        Ok([dgamma, dbeta])
    }
}

/// Batch norm in a population on a CUDA device: every agent's normalization in one
/// launch each way (`kernels/cuda/batch_norm.cu`), with the statistics `[P, units]`
/// (the batch's, from the moments kernel, or the running ones) and batch
/// renormalization's `(r, d)` already on the device.
#[cfg(feature = "cuda")]
pub(crate) struct DeviceBatchNorm {
    pub mean: Tensor,
    pub var: Tensor,
    pub renorm: Option<(Tensor, Tensor)>,
    pub units: Units,
    pub batch_statistics: bool,
    pub eps: f64,
}

#[cfg(feature = "cuda")]
impl DeviceBatchNorm {
    fn statistics(&self) -> super::cuda::device::BatchNormStatistics<'_> {
        super::cuda::device::BatchNormStatistics {
            moments: (&self.mean, &self.var),
            renorm: self.renorm.as_ref().map(|(r, d)| (r, d)),
        }
    }

    fn dims(&self, agents: usize) -> super::cuda::args::BatchNorm {
        let kind = (true, self.batch_statistics, self.eps);
        super::cuda::args::BatchNorm::of(agents, &self.units, kind)
    }
}

#[cfg(feature = "cuda")]
impl super::per_agent::AgentKernel<2> for DeviceBatchNorm {
    fn name(&self) -> &'static str {
        "batch-norm-per-agent-cuda"
    }

    fn forward(&self, _: usize, _: &[f32], _: [&[f32]; 2]) -> Result<Vec<f32>> {
        candle_core::bail!("batch norm's CUDA op runs on a CUDA device only")
    }

    fn backward(&self, _: OpGradient<'_, [f32], 2>) -> Result<(Vec<f32>, [Vec<f32>; 2])> {
        candle_core::bail!("batch norm's CUDA op runs on a CUDA device only")
    }

    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 2>) -> DeviceOutput {
        let (agents, t, [gamma, beta]) = (x.agent, x.t, x.params);
        let s = self.dims(agents);
        let out = super::cuda::device::batch_norm_forward(t, &self.statistics(), (gamma, beta), s)?;
        Ok(Some((out, None)))
    }

    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 2>) -> Result<(Tensor, [Tensor; 2])> {
        let (t, [gamma, _], out, dy) = pass.parts();
        let agents = pass.inputs.agent;
        let s = self.dims(agents);
        let stats = self.statistics();
        let (dt, dg, db) =
            super::cuda::device::batch_norm_backward((t, gamma), &stats, out, dy, s)?;
        Ok((dt, [dg, db]))
    }
}

impl AgentBatchNorm {
    /// Agent `agent`'s op, checked against its values and gains.
    fn op(&self, agent: usize, t: &[f32], gamma: &[f32]) -> Result<&BatchNormOp> {
        let Units {
            outer,
            units,
            inner,
        } = self.units;
        match self.ops.get(agent) {
            Some(op) if t.len() == outer * units * inner && gamma.len() == units => Ok(op),
            _ => candle_core::bail!("batch norm: agent {agent}'s values do not fit {units} units"),
        }
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

crate::kernels::avx2::dispatch! {
    /// `(dgamma, dbeta)` from the layer input `x`, turning the output gradient `dy` into
    /// `dt` in place; with `relu_out` (the op's output when a ReLU ends it), `dy` counts
    /// only where it is > 0.
    fn feature_gradients(
        fb: &FeatureBackward<'_>,
        x: &[f32],
        dy: &mut [f32],
        relu_out: Option<&[f32]>,
    ) -> (Vec<f32>, Vec<f32>) {
        match relu_out {
            Some(y) => fb.gradients::<true>(x, dy, y),
            None => fb.gradients::<false>(x, dy, &[]),
        }
    }
}

impl FeatureBackward<'_> {
    /// Block by block of units ([`BLOCK`]), two passes down the rows: the ReLU's mask
    /// and the sums, then `dt`.
    #[inline(always)]
    fn gradients<const RELU: bool>(
        &self,
        x: &[f32],
        dy: &mut [f32],
        y: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let units = self.gamma.len();
        let mut sums = (vec![0f32; units], vec![0f32; units]);
        let full = units / BLOCK * BLOCK;
        for start in (0..full).step_by(BLOCK) {
            self.block::<RELU, BLOCK>(x, dy, y, start, &mut sums);
        }
        for start in full..units {
            self.block::<RELU, 1>(x, dy, y, start, &mut sums);
        }
        let (sum_dy, sum_dy_xhat) = sums;
        (sum_dy_xhat, sum_dy)
    }

    /// Units `start..start + W` of [`Self::gradients`]; `sums` are `(Σ d, Σ d·x̂)`.
    #[inline(always)]
    fn block<const RELU: bool, const W: usize>(
        &self,
        x: &[f32],
        dy: &mut [f32],
        y: &[f32],
        start: usize,
        sums: &mut (Vec<f32>, Vec<f32>),
    ) {
        let units = self.gamma.len();
        let (m, s): ([f32; W], [f32; W]) = (block(self.mean, start), block(self.inv_std, start));
        let (mut sum_dy, mut sum_dy_xhat) = ([0f32; W], [0f32; W]);
        for (r, d) in dy.chunks_exact_mut(units).enumerate() {
            let at = r * units + start;
            let d: &mut [f32; W] = (&mut d[start..start + W]).try_into().expect("block");
            let x: [f32; W] = block(x, at);
            let y: [f32; W] = if RELU { block(y, at) } else { [1.0; W] };
            for j in 0..W {
                let (g, keep) = (d[j], !RELU || y[j] > 0.0);
                let du = if keep { g } else { 0.0 };
                // `+ 0.0` (not an identity: -0 becomes +0) keeps the store whole; storing
                // `du` itself became a masked store of the zeros, which is slow on AMD.
                d[j] = du + 0.0;
                sum_dy[j] += du;
                sum_dy_xhat[j] += du * (x[j] - m[j]) * s[j];
            }
        }
        sums.0[start..start + W].copy_from_slice(&sum_dy);
        sums.1[start..start + W].copy_from_slice(&sum_dy_xhat);
        let gamma: [f32; W] = block(self.gamma, start);
        let k: [f32; W] = std::array::from_fn(|j| gamma[j] * s[j]);
        if !self.batch_statistics {
            for d in dy.chunks_exact_mut(units) {
                for (d, k) in d[start..start + W].iter_mut().zip(k) {
                    *d *= k;
                }
            }
            return;
        }
        let n = (dy.len() / units) as f32;
        let mean_dy: [f32; W] = std::array::from_fn(|j| sum_dy[j] / n);
        let mean_dy_xhat: [f32; W] = std::array::from_fn(|j| sum_dy_xhat[j] / n);
        for (r, d) in dy.chunks_exact_mut(units).enumerate() {
            let d: &mut [f32; W] = (&mut d[start..start + W]).try_into().expect("block");
            let x: [f32; W] = block(x, r * units + start);
            for j in 0..W {
                d[j] = k[j] * (d[j] - mean_dy[j] - (x[j] - m[j]) * s[j] * mean_dy_xhat[j]);
            }
        }
    }
}
