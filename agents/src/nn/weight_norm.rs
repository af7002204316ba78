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
//! Gradient-free forwards (acting, target networks) reuse a cached `w`, recomputed only
//! when the variables change, so acting costs what a plain layer costs.
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

use candle_core::{Result, Tensor, Var};

use super::{Group, Kernel, ParamStore};

pub struct WeightNorm {
    kernel: Kernel,
    pub(crate) v: Var,
    /// One gain per output unit, shape `[units]`.
    pub(crate) g: Var,
    version: Arc<AtomicU64>,
    cache: Mutex<Option<(u64, Tensor)>>,
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

    /// `w = g * v / ||v||`, differentiable with respect to `g` and `v`.
    pub fn weight(&self) -> Result<Tensor> {
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

    /// Marks the cached `w` stale after `g` or `v` changed outside an optimizer step.
    pub fn mark_changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Sets `g` (after data-dependent initialization).
    pub fn set_gain(&self, g: &Tensor) -> Result<()> {
        self.g.set(&g.reshape(self.kernel.units())?)
    }
}
