//! A layer's bias and ReLU as CPU ops, each with a one-pass backward: adding a
//! per-unit bias (candle's broadcast-add backward is a slow general reduction) and
//! ReLU. On other devices, and as the tested reference, the same results come from
//! candle's tensor ops.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::kernels::bias_relu;
//!
//! let t = Tensor::new(&[[-1.0f32, 2.0], [3.0, -4.0]], &Device::Cpu).unwrap();
//! let b = Tensor::new(&[1.0f32, 1.0], &Device::Cpu).unwrap();
//! let y = bias_relu::relu(&bias_relu::add_unit_bias(&t, &b).unwrap()).unwrap();
//! assert_eq!(y.to_vec2::<f32>().unwrap(), vec![vec![0.0, 3.0], vec![4.0, 0.0]]);
//! ```

use candle_core::{CustomOp1, CustomOp2, Result, Shape, Tensor};

use super::feature_pass::{
    affine_features, affine_features_into, output_gradient, Affine, SavedOutput,
};
use super::per_agent::OpGradient;
#[cfg(feature = "cuda")]
use super::per_agent::{DeviceOutput, OpInputs};
use super::units::Units;
use super::{cpu_forward, gradient_like, with_values, Grads2};

/// `t + b` with `b` one value per unit (dim 1 of `t`: features or channels).
pub fn add_unit_bias(t: &Tensor, b: &Tensor) -> Result<Tensor> {
    if t.device().is_cpu() {
        t.contiguous()?.apply_op2(&b.contiguous()?, UnitBias)
    } else {
        add_unit_bias_reference(t, b)
    }
}

/// [`add_unit_bias`] through candle's broadcasting.
pub fn add_unit_bias_reference(t: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mut shape = vec![1; t.rank()];
    shape[1] = t.dim(1)?;
    t.broadcast_add(&b.reshape(shape)?)
}

/// `max(t + b, 0)` with `b` one value per unit, in one pass.
pub fn bias_relu(t: &Tensor, b: &Tensor) -> Result<Tensor> {
    if t.device().is_cpu() {
        t.contiguous()?.apply_op2(&b.contiguous()?, BiasRelu)
    } else {
        add_unit_bias_reference(t, b)?.relu()
    }
}

pub fn relu(t: &Tensor) -> Result<Tensor> {
    if t.device().is_cpu() {
        t.contiguous()?.apply_op1(Relu)
    } else {
        t.relu()
    }
}

struct UnitBias;

/// The units of `t`, checked against a bias of one value per unit.
pub(crate) fn unit_bias_fits(t: &Shape, bias: &[f32]) -> Result<Units> {
    let units = Units::of(t)?;
    if bias.len() != units.units {
        candle_core::bail!("bias of {} values for {} units", bias.len(), units.units);
    }
    Ok(units)
}

impl CustomOp2 for UnitBias {
    cpu_forward!("add-unit-bias", |op, t @ l1, b @ l2| {
        let out = unit_bias_fits(l1.shape(), b)?.map(t, b, |t, b| t + b);
        Ok((out, l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, b: &Tensor, _out: &Tensor, grad: &Tensor) -> Grads2 {
        let grad = grad.contiguous()?;
        let units = Units::of(t.shape())?;
        let db = with_values(&grad, |g| Ok(units.sums(g)))?;
        Ok((Some(grad), gradient_like(db, b)?))
    }
}

struct BiasRelu;

impl CustomOp2 for BiasRelu {
    cpu_forward!("unit-bias-relu", |op, t @ l1, b @ l2| {
        let units = unit_bias_fits(l1.shape(), b)?;
        let out = bias_relu_values(&units, t, b);
        Ok((out, l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, b: &Tensor, out: &Tensor, grad: &Tensor) -> Grads2 {
        let (dt, db) = bias_relu_gradients(&Units::of(t.shape())?, out, grad)?;
        Ok((Some(dt), gradient_like(db, b)?))
    }
}

/// `relu(t + b_u)` on host values laid out as `units` says; features through the host
/// path's one-pass loop.
pub(crate) fn bias_relu_values(units: &Units, t: &[f32], b: &[f32]) -> Vec<f32> {
    if units.inner == 1 {
        let affine = Affine {
            bias: Some(b),
            relu: true,
            ..Default::default()
        };
        affine_features(t, units.units, affine)
    } else {
        units.map(t, b, |t, b| (t + b).max(0.0))
    }
}

/// Below `relu(t + b_u)`, from its output `out` and gradient `grad`: the gradient of
/// `t` (`grad` where `out > 0`) and its per-unit sums (the bias's gradient).
pub(crate) fn bias_relu_gradients(
    units: &Units,
    out: &Tensor,
    grad: &Tensor,
) -> Result<(Tensor, Vec<f32>)> {
    if units.inner == 1 {
        // Features: the ReLU's mask and the bias sums in one pass.
        let mut dt = with_values(&grad.contiguous()?, |g| Ok(g.to_vec()))?;
        let sums = with_values(out, |y| {
            let saved = SavedOutput {
                y: Some(y),
                scaled: None,
            };
            Ok(output_gradient(&mut dt, units.units, saved))
        })?;
        Ok((Tensor::from_vec(dt, out.shape(), out.device())?, sums.d))
    } else {
        let dt = relu_backward(out, grad)?;
        let db = with_values(&dt, |d| Ok(units.sums(d)))?;
        Ok((dt, db))
    }
}

struct Relu;

impl CustomOp1 for Relu {
    cpu_forward!("relu", |op, v @ l| {
        Ok((v.iter().map(|x| x.max(0.0)).collect(), l.shape().clone()))
    });

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        relu_backward(res, grad).map(Some)
    }
}

/// `max(v, 0)` for every value, in place: a ReLU that ends a fused op's forward.
pub(crate) fn relu_in_place(values: &mut [f32]) {
    values.iter_mut().for_each(|v| *v = v.max(0.0));
}

/// The gradient below an op that ends in a ReLU when `relu` is set (see
/// [`relu_backward`]), else `dy` itself.
pub(crate) fn gradient_through_relu(relu: bool, y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    if relu {
        relu_backward(y, dy)
    } else {
        dy.contiguous()
    }
}

/// The gradient through a ReLU whose output was `y`: `dy` where `y > 0`, else 0.
pub(crate) fn relu_backward(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let d = with_values(y, |y| {
        with_values(&dy.contiguous()?, |g| Ok(relu_mask(y, g)))
    })?;
    Tensor::from_vec(d, y.shape(), y.device())
}

/// `dy` through a ReLU that ended an op with output `out` where `relu`, else `dy`.
pub(crate) fn through_relu<'a>(
    relu: bool,
    out: &[f32],
    dy: &'a [f32],
) -> std::borrow::Cow<'a, [f32]> {
    match relu {
        true => std::borrow::Cow::Owned(relu_mask(out, dy)),
        false => std::borrow::Cow::Borrowed(dy),
    }
}

/// [`relu_backward`] on host values.
pub(crate) fn relu_mask(y: &[f32], dy: &[f32]) -> Vec<f32> {
    y.iter()
        .zip(dy)
        .map(|(y, g)| if *y > 0.0 { *g } else { 0.0 })
        .collect()
}

/// A population layer's output pass per agent, on one agent's values laid out as
/// `units` says (see `kernels::per_agent`): its bias (one value per unit) and, where it
/// has one, its ReLU; `SCALED`, weight norm's per-unit scale before them.
pub(crate) struct AgentOutputPass<const SCALED: bool> {
    pub units: Units,
    pub relu: bool,
}

/// The bias and ReLU of a population's layer.
pub(crate) type AgentBias = AgentOutputPass<false>;

/// Weight norm's layer output in a population, per agent: each unit's kernel output
/// `t = v x` scaled by `s = g / ||v||`, its bias added and (where the layer has one)
/// the ReLU, as a single network's output pass does, so that `w` is never formed.
pub(crate) type AgentScaledBias = AgentOutputPass<true>;

/// One agent's per-unit layout in a population's `[P, B, units]` or `[P, B, channels,
/// positions]`.
fn agent_units(h: &Shape) -> Result<Units> {
    let dims = h.dims();
    if dims.len() < 3 {
        candle_core::bail!("a population's per-unit op needs [P, B, units, ...], got {dims:?}");
    }
    Units::of(&Shape::from(&dims[1..]))
}

impl<const SCALED: bool> AgentOutputPass<SCALED> {
    /// For a population's `[P, B, units]` or `[P, B, channels, positions]`.
    pub(crate) fn of(h: &Shape, relu: bool) -> Result<Self> {
        let units = agent_units(h)?;
        Ok(Self { units, relu })
    }
}

impl super::per_agent::AgentKernel<1> for AgentBias {
    fn name(&self) -> &'static str {
        "unit-bias-per-agent"
    }

    fn forward(&self, _agent: usize, t: &[f32], [b]: [&[f32]; 1]) -> Result<Vec<f32>> {
        let Units {
            outer,
            units,
            inner,
        } = self.units;
        if t.len() != outer * units * inner || b.len() != units {
            candle_core::bail!(
                "a bias of {} for {} values of {units} units",
                b.len(),
                t.len()
            );
        }
        Ok(match self.relu {
            true => bias_relu_values(&self.units, t, b),
            false => self.units.map(t, b, |t, b| t + b),
        })
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 1>) -> Result<(Vec<f32>, [Vec<f32>; 1])> {
        let (_, _, out, dy) = pass.parts();
        let dt = match self.relu {
            true => relu_mask(out, dy),
            false => dy.to_vec(),
        };
        let db = self.units.sums(&dt);
        Ok((dt, [db]))
    }

    fn forward_extend(
        &self,
        agent: usize,
        t: &[f32],
        [b]: [&[f32]; 1],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if !extend_features(&self.units, self.relu, (t, None, b), out) {
            out.extend(self.forward(agent, t, [b])?);
        }
        Ok(())
    }

    fn backward_extend(
        &self,
        pass: OpGradient<'_, [f32], 1>,
        dt: &mut Vec<f32>,
    ) -> Result<[Vec<f32>; 1]> {
        let (t, _, out, dy) = pass.parts();
        match extend_feature_gradients(&self.units, self.relu, (t, None), (out, dy), dt) {
            Some(sums) => Ok([sums.d]),
            None => {
                let (d, [db]) = self.backward(pass)?;
                dt.extend(d);
                Ok([db])
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 1>) -> DeviceOutput {
        let (agents, t, [b]) = (x.agent, x.t, x.params);
        let out = super::cuda::device::bias_forward(t, None, b, (agents, &self.units, self.relu))?;
        Ok(Some((out, None)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 1>) -> Result<(Tensor, [Tensor; 1])> {
        let (t, [b], out, dy) = pass.parts();
        let agents = pass.inputs.agent;
        let layout = (agents, &self.units, self.relu);
        let (dt, _, db) = super::cuda::device::bias_backward((t, None, b), out, dy, layout)?;
        Ok((dt, [db]))
    }
}

/// Over features (`inner == 1`), a population agent's `relu?(t s_u + b_u)` (`s` none:
/// `t + b_u`) appended to `out` in the single network's one pass; `false` (nothing
/// appended) for other layouts or sizes, which take the per-agent op.
fn extend_features(
    units: &Units,
    relu: bool,
    (t, s, b): (&[f32], Option<&[f32]>, &[f32]),
    out: &mut Vec<f32>,
) -> bool {
    let n = units.units;
    if units.inner != 1 || b.len() != n || s.is_some_and(|s| s.len() != n) {
        return false;
    }
    let affine = Affine {
        scale: s,
        bias: Some(b),
        relu,
        ..Default::default()
    };
    affine_features_into(t, n, affine, out);
    true
}

/// Over features, the gradient below [`extend_features`]'s output `out` from its
/// gradient `dy`, appended to `dt` in one pass (the ReLU's mask, the scale), with the
/// per-unit sums (the bias's and, with a scale, the scale's gradients); `None`
/// (nothing appended) for other layouts or sizes.
fn extend_feature_gradients(
    units: &Units,
    relu: bool,
    (t, s): (&[f32], Option<&[f32]>),
    (out, dy): (&[f32], &[f32]),
    dt: &mut Vec<f32>,
) -> Option<super::feature_pass::UnitSums> {
    let fits = dy.len() == out.len() && (s.is_none() || t.len() == out.len());
    if units.inner != 1 || !fits || s.is_some_and(|s| s.len() != units.units) {
        return None;
    }
    let at = dt.len();
    dt.extend_from_slice(dy);
    let saved = SavedOutput {
        y: relu.then_some(out),
        scaled: s.map(|s| (t, s)),
    };
    Some(output_gradient(&mut dt[at..], units.units, saved))
}

impl super::per_agent::AgentKernel<2> for AgentScaledBias {
    fn name(&self) -> &'static str {
        "unit-scale-bias-per-agent"
    }

    fn forward(&self, _agent: usize, t: &[f32], [s, b]: [&[f32]; 2]) -> Result<Vec<f32>> {
        let Units { units, .. } = self.units;
        if t.len() != self.units.per_unit() * units || s.len() != units || b.len() != units {
            candle_core::bail!(
                "a scale of {} and a bias of {} for {} values",
                s.len(),
                b.len(),
                t.len()
            );
        }
        let sb: Vec<(f32, f32)> = s.iter().copied().zip(b.iter().copied()).collect();
        Ok(match self.relu {
            true => self.units.map(t, &sb, |t, (s, b)| (t * s + b).max(0.0)),
            false => self.units.map(t, &sb, |t, (s, b)| t * s + b),
        })
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 2>) -> Result<(Vec<f32>, [Vec<f32>; 2])> {
        let (t, [s, _b], out, dy) = pass.parts();
        let d = through_relu(self.relu, out, dy);
        let dt = self.units.map(&d, s, |d, s| d * s);
        let ds = self.units.sums2(&d, t, &vec![(); s.len()], |d, t, _| d * t);
        let db = self.units.sums(&d);
        Ok((dt, [ds, db]))
    }

    fn forward_extend(
        &self,
        agent: usize,
        t: &[f32],
        [s, b]: [&[f32]; 2],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if !extend_features(&self.units, self.relu, (t, Some(s), b), out) {
            out.extend(self.forward(agent, t, [s, b])?);
        }
        Ok(())
    }

    fn backward_extend(
        &self,
        pass: OpGradient<'_, [f32], 2>,
        dt: &mut Vec<f32>,
    ) -> Result<[Vec<f32>; 2]> {
        let (t, [s, _], out, dy) = pass.parts();
        match extend_feature_gradients(&self.units, self.relu, (t, Some(s)), (out, dy), dt) {
            Some(sums) => Ok([sums.d_t, sums.d]),
            None => {
                let (d, [ds, db]) = self.backward(pass)?;
                dt.extend(d);
                Ok([ds, db])
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 2>) -> DeviceOutput {
        let (agents, t, [s, b]) = (x.agent, x.t, x.params);
        let layout = (agents, &self.units, self.relu);
        let out = super::cuda::device::bias_forward(t, Some(s), b, layout)?;
        Ok(Some((out, None)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 2>) -> Result<(Tensor, [Tensor; 2])> {
        let (t, [s, b], out, dy) = pass.parts();
        let agents = pass.inputs.agent;
        let layout = (agents, &self.units, self.relu);
        let (dt, ds, db) = super::cuda::device::bias_backward((t, Some(s), b), out, dy, layout)?;
        let Some(ds) = ds else {
            candle_core::bail!("weight norm's scale: no gradient from the CUDA kernel");
        };
        Ok((dt, [ds, db]))
    }
}
