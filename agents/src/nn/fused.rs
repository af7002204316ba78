//! Fused CPU ops for the hot path of a layer, each with a one-pass backward: adding a
//! per-unit bias (candle's broadcast-add backward is a slow general reduction) and
//! ReLU. On other devices, and as the tested reference, the same results come from
//! candle's tensor ops.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::fused;
//!
//! let t = Tensor::new(&[[-1.0f32, 2.0], [3.0, -4.0]], &Device::Cpu).unwrap();
//! let b = Tensor::new(&[1.0f32, 1.0], &Device::Cpu).unwrap();
//! let y = fused::relu(&fused::add_unit_bias(&t, &b).unwrap()).unwrap();
//! assert_eq!(y.to_vec2::<f32>().unwrap(), vec![vec![0.0, 3.0], vec![4.0, 0.0]]);
//! ```

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Storage, Tensor};

use super::dense::f32_slice;

/// Runs `f` on a CPU tensor's values.
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

/// `(outer, units, inner)`: how a contiguous tensor splits around dim 1.
pub(crate) fn around_dim1(shape: &Shape) -> Result<(usize, usize, usize)> {
    let dims = shape.dims();
    if dims.len() < 2 {
        candle_core::bail!("a per-unit bias needs a batch and a unit dimension, got {dims:?}");
    }
    Ok((dims[0], dims[1], dims[2..].iter().product()))
}

impl CustomOp2 for UnitBias {
    fn name(&self) -> &'static str {
        "add-unit-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, b) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let (outer, units, inner) = around_dim1(l1.shape())?;
        if b.len() != units {
            candle_core::bail!("bias of {} values for {units} units", b.len());
        }
        let mut out = Vec::with_capacity(t.len());
        for o in 0..outer {
            for (u, &bias) in b.iter().enumerate() {
                let start = (o * units + u) * inner;
                out.extend(t[start..start + inner].iter().map(|v| v + bias));
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        b: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (outer, units, inner) = around_dim1(t.shape())?;
        let db = with_values(&grad, |g| {
            let mut db = vec![0f32; units];
            for o in 0..outer {
                for (u, d) in db.iter_mut().enumerate() {
                    let start = (o * units + u) * inner;
                    *d += g[start..start + inner].iter().sum::<f32>();
                }
            }
            Ok(db)
        })?;
        Ok((
            Some(grad),
            Some(Tensor::from_vec(db, b.shape(), b.device())?),
        ))
    }
}

struct BiasRelu;

impl CustomOp2 for BiasRelu {
    fn name(&self) -> &'static str {
        "unit-bias-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, b) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let (outer, units, inner) = around_dim1(l1.shape())?;
        if b.len() != units {
            candle_core::bail!("bias of {} values for {units} units", b.len());
        }
        let mut out = Vec::with_capacity(t.len());
        for o in 0..outer {
            for (u, &bias) in b.iter().enumerate() {
                let start = (o * units + u) * inner;
                out.extend(t[start..start + inner].iter().map(|v| (v + bias).max(0.0)));
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        b: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (outer, units, inner) = around_dim1(t.shape())?;
        let (dt, db) = with_values(out, |y| {
            with_values(&grad, |g| {
                let mut db = vec![0f32; units];
                let mut dt = Vec::with_capacity(g.len());
                for o in 0..outer {
                    for (u, d) in db.iter_mut().enumerate() {
                        let range = (o * units + u) * inner..(o * units + u + 1) * inner;
                        let start = dt.len();
                        dt.extend(y[range.clone()].iter().zip(&g[range]).map(|(y, g)| {
                            if *y > 0.0 {
                                *g
                            } else {
                                0.0
                            }
                        }));
                        *d += dt[start..].iter().sum::<f32>();
                    }
                }
                Ok((dt, db))
            })
        })?;
        Ok((
            Some(Tensor::from_vec(dt, t.shape(), t.device())?),
            Some(Tensor::from_vec(db, b.shape(), b.device())?),
        ))
    }
}

struct Relu;

impl CustomOp1 for Relu {
    fn name(&self) -> &'static str {
        "relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let v = f32_slice(s, l)?;
        Ok((
            CpuStorage::F32(v.iter().map(|x| x.max(0.0)).collect()),
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let d = with_values(res, |r| {
            with_values(&grad, |g| {
                Ok(r.iter()
                    .zip(g)
                    .map(|(r, g)| if *r > 0.0 { *g } else { 0.0 })
                    .collect::<Vec<f32>>())
            })
        })?;
        Ok(Some(Tensor::from_vec(d, res.shape(), res.device())?))
    }
}
