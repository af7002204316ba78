//! Weight normalization (Salimans & Kingma, 2016): each output unit's weight vector is
//! `w = g * v / ||v||`, with `g` a scalar per unit and the norm over the unit's inputs
//! (`(c_in, kh, kw)` for conv). `w` is recomputed from `g` and `v` in every training
//! forward, so autodiff yields the paper's gradients
//!
//! ```text
//! dL/dg = (dL/dw) . v/||v||
//! dL/dv = g/||v|| * (dL/dw - (dL/dg) * v/||v||)
//! ```
//!
//! Gradient-free forwards (acting, target networks) on the graph reuse a cached `w`,
//! recomputed only when the variables change, so acting costs what a plain layer costs.
//! The host path never forms `w`: it caches the norms instead ([`Self::unit_norms`]).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{Kernel, ParamStore, WeightNorm};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let kernel = Kernel::Linear { n_in: 3, n_out: 2 };
//! let v = Tensor::new(&[[3.0f32, 0.0, 4.0], [0.0, 2.0, 0.0]], &Device::Cpu).unwrap();
//! let g = Tensor::new(&[10.0f32, -1.0], &Device::Cpu).unwrap();
//! let wn = WeightNorm::from_values(&mut store, "fc", kernel, v, g).unwrap();
//! let w = wn.weight().unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(w, vec![vec![6.0, 0.0, 8.0], vec![0.0, -1.0, 0.0]]);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Storage, Tensor, Var};

use super::data_conv::DataConv2d;
use super::dense::{dot, f32_slice, lane_sum};
use super::fused::with_values;
use super::linear_op::LinearCore;
use super::unit_norms::{UnitNormCache, UnitNorms};
use super::weight_norm_op::{NormedKernel, ScaleByGain};
use super::{Group, Kernel, ParamStore};

/// How many more values than the weight an output must have before forming `w` (one
/// more graph node, about a microsecond) pays for the per-output scaling it saves.
const FORM_WEIGHT_MARGIN: usize = 4096;

pub struct WeightNorm {
    kernel: Kernel,
    pub(crate) v: Var,
    /// One gain per output unit, shape `[units]`.
    pub(crate) g: Var,
    version: Arc<AtomicU64>,
    cache: Mutex<Option<(u64, Tensor)>>,
    unit_norms: UnitNormCache,
}

impl WeightNorm {
    /// Registers `{prefix}.v` and `{prefix}.g` with the given values.
    pub fn from_values(
        store: &mut ParamStore,
        prefix: &str,
        kernel: Kernel,
        v: Tensor,
        g: Tensor,
    ) -> Result<Self> {
        let v = store.add(&format!("{prefix}.v"), v, Group::Weight)?;
        let g = store.add(&format!("{prefix}.g"), g, Group::Gain)?;
        Ok(Self {
            kernel,
            v,
            g,
            version: store.version_handle(),
            cache: Mutex::new(None),
            unit_norms: UnitNormCache::default(),
        })
    }

    /// `g = ||v||` per unit, so that `w` starts equal to `v` (the init without
    /// data-dependent initialization).
    pub fn norm_preserving(
        store: &mut ParamStore,
        prefix: &str,
        kernel: Kernel,
        v: Tensor,
    ) -> Result<Self> {
        let units = kernel.units();
        let g = v.reshape((units, ()))?.sqr()?.sum(1)?.sqrt()?;
        Self::from_values(store, prefix, kernel, v, g)
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// `v / ||v||` per unit (the direction), differentiable.
    pub fn direction(&self) -> Result<Tensor> {
        let units = self.kernel.units();
        let v = self.v.as_tensor().reshape((units, ()))?;
        let norm = v.sqr()?.sum_keepdim(1)?.sqrt()?;
        v.broadcast_div(&norm)?.reshape(self.kernel.weight_shape())
    }

    /// `w = g * v / ||v||`, differentiable with respect to `g` and `v`. On the CPU one
    /// fused op computes it and its closed-form backward; elsewhere (and in
    /// [`Self::weight_reference`]) tensor ops do.
    pub fn weight(&self) -> Result<Tensor> {
        if self.v.device().is_cpu() {
            let v = self.v.as_tensor();
            return v.apply_op2(
                self.g.as_tensor(),
                FusedWeightNorm {
                    units: self.kernel.units(),
                },
            );
        }
        self.weight_reference()
    }

    /// The layer's kernel applied with `w` to `x`, differentiable. On the CPU `w` is
    /// formed only where the output has at least 4,096 values more than the weight (a
    /// convolution's feature maps, a large batch): that is then the smaller pass,
    /// forward and backward. Elsewhere it is never formed
    /// ([`Self::apply_output_scaled`]), which saves a graph node.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let forms_weight = match self.output_len(x) {
            Some(out_len) => out_len >= self.v.elem_count() + FORM_WEIGHT_MARGIN,
            None => false,
        };
        if !self.v.device().is_cpu() || forms_weight {
            return self.kernel.apply(x, &self.weight()?);
        }
        self.apply_output_scaled(x)
    }

    /// Values of the kernel's output on `x`, if `x` has the kernel's rank.
    fn output_len(&self, x: &Tensor) -> Option<usize> {
        let dims = x.dims();
        let rank = match self.kernel {
            Kernel::Linear { .. } => 2,
            Kernel::Conv2d { .. } => 4,
        };
        (dims.len() == rank).then(|| {
            dims[0]
                * self
                    .kernel
                    .output_shape(&dims[1..])
                    .iter()
                    .product::<usize>()
        })
    }

    /// [`Self::apply`] without forming `w`: the kernel runs with `v` and each unit's
    /// output is scaled by `g / ||v||`, in one op with the kernel where the kernel has
    /// a fused op. CPU only.
    pub fn apply_output_scaled(&self, x: &Tensor) -> Result<Tensor> {
        let (v, g) = (self.v.as_tensor(), self.g.as_tensor());
        let units = self.kernel.units();
        let inv_norms = with_values(v, |v| Ok(inverse_norms(v, units)))?;
        match self.kernel {
            Kernel::Linear { .. } => {
                let x = x.contiguous()?;
                let core = LinearCore::of(x.shape(), v.shape())?;
                x.apply_op3(v, g, NormedKernel { core, inv_norms })
            }
            Kernel::Conv2d {
                k,
                stride,
                padding: 0,
                ..
            } if !x.track_op() => {
                let (cols, core) = DataConv2d { k, stride }.columns(x, v)?;
                cols.apply_op3(v, g, NormedKernel { core, inv_norms })
            }
            Kernel::Conv2d { .. } => {
                let t = self.kernel.apply(x, v)?;
                t.apply_op3(v, g, ScaleByGain { inv_norms })
            }
        }
    }

    /// `w` from unfused tensor ops (autodiff through each), the reference the fused
    /// path is tested against.
    pub fn weight_reference(&self) -> Result<Tensor> {
        let units = self.kernel.units();
        let dir = self.direction()?.reshape((units, ()))?;
        let g = self.g.as_tensor().reshape((units, 1))?;
        dir.broadcast_mul(&g)?.reshape(self.kernel.weight_shape())
    }

    /// `w` without gradient, recomputed only when the store's version changed.
    pub fn cached_weight(&self) -> Result<Tensor> {
        let version = self.version.load(Ordering::Acquire);
        let mut cache = self.cache.lock().expect("weight cache poisoned");
        if let Some((v, w)) = cache.as_ref() {
            if *v == version {
                return Ok(w.clone());
            }
        }
        let w = self.weight()?.detach();
        *cache = Some((version, w.clone()));
        Ok(w)
    }

    /// `1/||v_u||` and `g_u/||v_u||` on host values, computed once per version of the
    /// store (see [`super::unit_norms`]). CPU only.
    pub fn unit_norms(&self) -> Result<Arc<UnitNorms>> {
        let version = self.version.load(Ordering::Acquire);
        let units = self.kernel.units();
        self.unit_norms.get(version, &self.v, &self.g, units)
    }

    /// Marks the cached `w` stale after `g` or `v` changed outside an optimizer step.
    pub fn mark_changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Sets `g` (after data-dependent initialization).
    pub fn set_gain(&self, g: &Tensor) -> Result<()> {
        self.g.set(&g.reshape(self.kernel.units())?)
    }
}

/// `w = g * v / ||v||` per unit in one pass, with the paper's closed-form gradients.
struct FusedWeightNorm {
    units: usize,
}

crate::avx2::dispatch! {
    /// `(1 / ||v_u||)` per unit `u` of `v`'s `units` rows: the squared norms first, then
    /// the roots and quotients in SIMD lanes (one at a time, they cost more than the
    /// squares).
    pub(crate) fn inverse_norms(v: &[f32], units: usize) -> Vec<f32> {
        // Loops, not collected iterators: those compiled outside the AVX2 copy.
        let mut inv = vec![0f32; units];
        for (inv, row) in inv.iter_mut().zip(v.chunks_exact(v.len() / units)) {
            *inv = lane_sum(row, row, |x, y| x * y);
        }
        for x in inv.iter_mut() {
            *x = 1.0 / x.sqrt();
        }
        inv
    }
}

impl CustomOp2 for FusedWeightNorm {
    fn name(&self) -> &'static str {
        "fused-weight-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (v, g) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let n = v.len() / self.units;
        let inv = inverse_norms(v, self.units);
        let mut w = Vec::with_capacity(v.len());
        for (i, row) in v.chunks_exact(n).enumerate() {
            let scale = g[i] * inv[i];
            w.extend(row.iter().map(|x| x * scale));
        }
        Ok((CpuStorage::F32(w), l1.shape().clone()))
    }

    fn bwd(
        &self,
        v: &Tensor,
        g: &Tensor,
        _w: &Tensor,
        dw: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dw = dw.contiguous()?;
        let (v_s, v_l) = v.storage_and_layout();
        let (g_s, g_l) = g.storage_and_layout();
        let (dw_s, dw_l) = dw.storage_and_layout();
        let (Storage::Cpu(v_c), Storage::Cpu(g_c), Storage::Cpu(dw_c)) = (&*v_s, &*g_s, &*dw_s)
        else {
            candle_core::bail!("fused weight norm runs on the CPU only");
        };
        let (vv, gv, dwv) = (
            f32_slice(v_c, v_l)?,
            f32_slice(g_c, g_l)?,
            f32_slice(dw_c, dw_l)?,
        );
        let n = vv.len() / self.units;
        let inv = inverse_norms(vv, self.units);
        let mut dv = Vec::with_capacity(vv.len());
        let mut dg = Vec::with_capacity(self.units);
        for i in 0..self.units {
            let (row, drow) = (&vv[i * n..(i + 1) * n], &dwv[i * n..(i + 1) * n]);
            // dL/dg = dL/dw . v/||v||
            let dgi = dot(row, drow) * inv[i];
            // dL/dv = g/||v|| (dL/dw - dL/dg v/||v||)
            let scale = gv[i] * inv[i];
            dv.extend(
                row.iter()
                    .zip(drow)
                    .map(|(a, d)| scale * (d - dgi * a * inv[i])),
            );
            dg.push(dgi);
        }
        let dv = Tensor::from_vec(dv, v.shape(), v.device())?;
        let dg = Tensor::from_vec(dg, g.shape(), g.device())?;
        Ok((Some(dv), Some(dg)))
    }
}
