//! Fused CPU ops for the hot path of a layer, each with a one-pass backward: adding a
//! per-unit bias (candle's broadcast-add backward is a slow general reduction) and
//! ReLU. On other devices, and as the tested reference, the same results come from
//! candle's tensor ops.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::kernels::fused;
//!
//! let t = Tensor::new(&[[-1.0f32, 2.0], [3.0, -4.0]], &Device::Cpu).unwrap();
//! let b = Tensor::new(&[1.0f32, 1.0], &Device::Cpu).unwrap();
//! let y = fused::relu(&fused::add_unit_bias(&t, &b).unwrap()).unwrap();
//! assert_eq!(y.to_vec2::<f32>().unwrap(), vec![vec![0.0, 3.0], vec![4.0, 0.0]]);
//! ```

use candle_core::{CustomOp1, CustomOp2, Result, Shape, Storage, Tensor};

use super::dense::{f32_slice, lane_sum};
use super::feature_pass::{affine_features, output_gradient, Affine, SavedOutput};
use super::{cpu_forward, gradient_like, Grads2};

/// Runs `f` on a CPU tensor's values.
#[inline]
pub(crate) fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(c) => f(f32_slice(c, l)?),
        _ => candle_core::bail!("fused ops run on the CPU only"),
    }
}

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

/// How a contiguous tensor's values group around dim 1 (the units: features or
/// channels): `outer` blocks, each of `units` runs of `inner` values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Units {
    pub outer: usize,
    pub units: usize,
    pub inner: usize,
}

impl Units {
    pub(crate) fn of(shape: &Shape) -> Result<Self> {
        let dims = shape.dims();
        if dims.len() < 2 {
            candle_core::bail!("per-unit ops need a batch and a unit dimension, got {dims:?}");
        }
        Ok(Self {
            outer: dims[0],
            units: dims[1],
            inner: dims[2..].iter().product(),
        })
    }

    /// Values per unit.
    pub(crate) fn per_unit(&self) -> usize {
        self.outer * self.inner
    }

    /// Calls `f(unit, run)` for each run of one unit's indices, in memory order.
    #[inline(always)]
    pub(crate) fn runs(&self, mut f: impl FnMut(usize, std::ops::Range<usize>)) {
        for o in 0..self.outer {
            for u in 0..self.units {
                let start = (o * self.units + u) * self.inner;
                f(u, start..start + self.inner);
            }
        }
    }

    /// `x` and `y` cut to this layout's values and `per_unit` to its units (which also
    /// checks, once, that they hold that many).
    #[inline(always)]
    fn views<'a, P>(
        &self,
        x: &'a [f32],
        y: &'a [f32],
        per_unit: &'a [P],
    ) -> (&'a [f32], &'a [f32], &'a [P]) {
        let len = self.outer * self.units * self.inner;
        (&x[..len], &y[..len], &per_unit[..self.units])
    }

    /// `f(x, per_unit[u])` for every value `x` (of unit `u`), in memory order.
    #[inline]
    pub(crate) fn map<P: Copy>(
        &self,
        x: &[f32],
        per_unit: &[P],
        f: impl Fn(f32, P) -> f32,
    ) -> Vec<f32> {
        self.map2(x, x, per_unit, |x, _, p| f(x, p))
    }

    /// `f(x, y, per_unit[u])` for every pair of values of `x` and `y` (of unit `u`).
    #[inline]
    pub(crate) fn map2<P: Copy>(
        &self,
        x: &[f32],
        y: &[f32],
        per_unit: &[P],
        f: impl Fn(f32, f32, P) -> f32,
    ) -> Vec<f32> {
        let (x, y, per_unit) = self.views(x, y, per_unit);
        let units = self.units;
        let mut out = Vec::with_capacity(x.len());
        if self.inner == 1 {
            // Runs of one value: a whole row of units at a time.
            for (xs, ys) in x.chunks_exact(units).zip(y.chunks_exact(units)) {
                out.extend(
                    xs.iter()
                        .zip(ys)
                        .zip(per_unit)
                        .map(|((&x, &y), &p)| f(x, y, p)),
                );
            }
        } else {
            self.runs(|u, run| {
                let p = per_unit[u];
                let (xs, ys) = (&x[run.clone()], &y[run]);
                out.extend(xs.iter().zip(ys).map(|(&x, &y)| f(x, y, p)));
            });
        }
        out
    }

    /// Per-unit sums of `f(x, y, per_unit[u])` over the values of `x` and `y`.
    #[inline]
    pub(crate) fn sums2<P: Copy>(
        &self,
        x: &[f32],
        y: &[f32],
        per_unit: &[P],
        f: impl Fn(f32, f32, P) -> f32,
    ) -> Vec<f32> {
        let (x, y, per_unit) = self.views(x, y, per_unit);
        let units = self.units;
        let mut sums = vec![0f32; units];
        if self.inner == 1 {
            for (xs, ys) in x.chunks_exact(units).zip(y.chunks_exact(units)) {
                for (((s, &x), &y), &p) in sums.iter_mut().zip(xs).zip(ys).zip(per_unit) {
                    *s += f(x, y, p);
                }
            }
        } else {
            self.runs(|u, run| {
                let p = per_unit[u];
                let (xs, ys) = (&x[run.clone()], &y[run]);
                sums[u] += lane_sum(xs, ys, |x, y| f(x, y, p));
            });
        }
        sums
    }

    /// Per-unit sums of the values of `x`.
    #[inline]
    pub(crate) fn sums(&self, x: &[f32]) -> Vec<f32> {
        self.sums2(x, x, &vec![(); self.units], |x, _, _| x)
    }
}

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

/// [`relu_backward`] on host values.
pub(crate) fn relu_mask(y: &[f32], dy: &[f32]) -> Vec<f32> {
    y.iter()
        .zip(dy)
        .map(|(y, g)| if *y > 0.0 { *g } else { 0.0 })
        .collect()
}
