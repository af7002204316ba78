//! Mean-only batch norm's training forward and backward as fused CPU ops: `y = t -
//! mean_u`, alone or with the layer's bias and ReLU in the same op.

use candle_core::{CustomOp1, CustomOp2, Result, Tensor};

use super::bias_relu::{bias_relu_gradients, bias_relu_values, unit_bias_fits};
use super::per_agent::OpGradient;
#[cfg(feature = "cuda")]
use super::per_agent::{DeviceOutput, OpInputs};
use super::units::Units;
use super::with_values;
use super::{cpu_forward, gradient_like, Grads2};

/// Each unit's mean from its sum over `per_unit` values.
pub(crate) fn batch_means(sums: &[f32], per_unit: usize) -> Vec<f32> {
    let n = per_unit as f32;
    sums.iter().map(|s| s / n).collect()
}

/// `b_u - mean_u` (`-mean_u` without a bias): the one shift per unit that subtracting
/// the mean and adding the bias make together.
pub(crate) fn mean_shift(bias: Option<&[f32]>, mean: &[f32]) -> Vec<f32> {
    match bias {
        Some(b) => b.iter().zip(mean).map(|(b, m)| b - m).collect(),
        None => mean.iter().map(|m| -m).collect(),
    }
}

/// `d - mean_u(d)` per unit, given the per-unit sums of `d`: the gradient through a
/// subtracted batch mean.
fn centered(units: &Units, d: &[f32], sums: &[f32]) -> Vec<f32> {
    units.map(d, &batch_means(sums, units.per_unit()), |d, m| d - m)
}

/// Mean-only batch norm's forward, `y = t - mean_u`. With the batch's mean, the
/// backward is that of a batch mean, `dt = dy - mean_u(dy)`; with the running mean (a
/// constant), `dt = dy`.
pub(crate) struct SubtractUnitMean {
    pub mean: Vec<f32>,
    pub batch_statistics: bool,
}

impl CustomOp1 for SubtractUnitMean {
    cpu_forward!("subtract-unit-mean", |op, t @ l| {
        let out = Units::of(l.shape())?.map(t, &op.mean, |t, m| t - m);
        Ok((out, l.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, _out: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        if !self.batch_statistics {
            return Ok(Some(grad.clone()));
        }
        let grad = grad.contiguous()?;
        let units = Units::of(t.shape())?;
        let dt = with_values(&grad, |dy| Ok(centered(&units, dy, &units.sums(dy))))?;
        gradient_like(dt, t)
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
    cpu_forward!("centered-bias-relu", |op, t @ l1, b @ l2| {
        let units = unit_bias_fits(l1.shape(), b)?;
        if op.mean.len() != units.units {
            candle_core::bail!("mean of {} values for {} units", op.mean.len(), units.units);
        }
        // (t - m) + b equals t + (b - m) up to rounding; one shift per unit.
        let out = bias_relu_values(&units, t, &mean_shift(Some(b), &op.mean));
        Ok((out, l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, b: &Tensor, out: &Tensor, grad: &Tensor) -> Grads2 {
        let units = Units::of(t.shape())?;
        let (d, db) = bias_relu_gradients(&units, out, grad)?;
        let dt = if self.batch_statistics {
            let dt = with_values(&d, |d| Ok(centered(&units, d, &db)))?;
            Tensor::from_vec(dt, t.shape(), t.device())?
        } else {
            d
        };
        Ok((Some(dt), gradient_like(db, b)?))
    }
}

/// [`CenteredBiasRelu`] in a population: each agent's mean (its batch's or its running
/// one) on its values, laid out as `units` says.
pub(crate) struct AgentCenteredBiasRelu {
    pub means: Vec<Vec<f32>>,
    pub batch_statistics: bool,
    pub units: Units,
}

impl super::per_agent::AgentKernel<1> for AgentCenteredBiasRelu {
    fn name(&self) -> &'static str {
        "centered-bias-relu-per-agent"
    }

    fn forward(&self, agent: usize, t: &[f32], [b]: [&[f32]; 1]) -> Result<Vec<f32>> {
        let mean = self.mean(agent, t, b)?;
        Ok(bias_relu_values(&self.units, t, &mean_shift(Some(b), mean)))
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 1>) -> Result<(Vec<f32>, [Vec<f32>; 1])> {
        let (t, [b], out, dy) = pass.parts();
        let agent = pass.inputs.agent;
        self.mean(agent, t, b)?;
        let d = super::bias_relu::relu_mask(out, dy);
        let db = self.units.sums(&d);
        let dt = match self.batch_statistics {
            true => centered(&self.units, &d, &db),
            false => d,
        };
        Ok((dt, [db]))
    }
}

/// [`AgentCenteredBiasRelu`] on a CUDA device: `relu(t + (b - mean))` by the bias
/// kernel, every agent at once, with each agent's mean `[P, 1, units...]` (its batch's
/// or its running one) already on the device; the backward's batch-mean term in tensor
/// ops.
#[cfg(feature = "cuda")]
pub(crate) struct DeviceCenteredBiasRelu {
    pub mean: Tensor,
    pub batch_statistics: bool,
    pub units: Units,
}

#[cfg(feature = "cuda")]
impl super::per_agent::AgentKernel<1> for DeviceCenteredBiasRelu {
    fn name(&self) -> &'static str {
        "centered-bias-relu-per-agent-cuda"
    }

    fn forward(&self, _: usize, _: &[f32], _: [&[f32]; 1]) -> Result<Vec<f32>> {
        candle_core::bail!("mean-only batch norm's CUDA op runs on a CUDA device only")
    }

    fn backward(&self, _: OpGradient<'_, [f32], 1>) -> Result<(Vec<f32>, [Vec<f32>; 1])> {
        candle_core::bail!("mean-only batch norm's CUDA op runs on a CUDA device only")
    }

    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 1>) -> DeviceOutput {
        let (agents, t, [b]) = (x.agent, x.t, x.params);
        let shift = (b - &self.mean)?.contiguous()?;
        let layout = (agents, &self.units, true);
        let out = super::cuda::device::bias_forward(t, None, &shift, layout)?;
        Ok(Some((out, Some(shift))))
    }

    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 1>) -> Result<(Tensor, [Tensor; 1])> {
        let (t, _, out, dy) = pass.parts();
        let agents = pass.inputs.agent;
        let Some(shift) = pass.kept else {
            candle_core::bail!("mean-only batch norm: the CUDA forward kept no shift");
        };
        let layout = (agents, &self.units, true);
        let (d, _, db) = super::cuda::device::bias_backward((t, None, shift), out, dy, layout)?;
        if !self.batch_statistics {
            return Ok((d, [db]));
        }
        // Through the subtracted batch mean: `d - mean_u(d)`.
        let mean_d = (&db / self.units.per_unit() as f64)?;
        Ok((d.broadcast_sub(&mean_d)?, [db]))
    }
}

impl AgentCenteredBiasRelu {
    /// Agent `agent`'s mean, checked against its values and bias.
    fn mean(&self, agent: usize, t: &[f32], b: &[f32]) -> Result<&[f32]> {
        let Units {
            outer,
            units,
            inner,
        } = self.units;
        match self.means.get(agent) {
            Some(m) if m.len() == units && b.len() == units && t.len() == outer * units * inner => {
                Ok(m)
            }
            _ => candle_core::bail!(
                "mean-only batch norm: agent {agent}'s values do not fit {units} units"
            ),
        }
    }
}
