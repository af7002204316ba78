//! A weight-normed layer's `1/||v_u||` and `g_u/||v_u||` on host values, once per
//! version of the store.
//!
//! Every forward of the host path (an update's, acting, TD targets) runs the kernel with
//! `v` and scales its output by `g_u/||v_u||`; the scale costs nothing, as it joins the
//! bias pass. The norms change only when `v` and `g` do, so they are kept for the
//! store's version: in training, acting computes them once after each update and the
//! next update's forward reads them. (Acting once formed `w = g v/||v||` instead, which
//! took the same norms and a pass over `v` besides.)
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{Kernel, ParamStore, WeightNorm};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let kernel = Kernel::Linear { n_in: 2, n_out: 2 };
//! let v = Tensor::new(&[[3.0f32, 4.0], [0.0, 2.0]], &Device::Cpu).unwrap();
//! let g = Tensor::new(&[10.0f32, -1.0], &Device::Cpu).unwrap();
//! let wn = WeightNorm::from_values(&mut store, "fc", kernel, v, g).unwrap();
//! let norms = wn.unit_norms().unwrap();
//! assert_eq!(norms.inv_norms, vec![0.2, 0.5]);
//! assert_eq!(norms.scales, vec![2.0, -0.5]);
//! ```

use std::sync::{Arc, Mutex};

use candle_core::{Result, Var};

use super::fused::with_values;
use super::weight_norm::inverse_norms;
use super::weight_norm_op::unit_scales;

/// `1/||v_u||` and `s_u = g_u/||v_u||` per unit `u`.
#[derive(Debug, PartialEq)]
pub struct UnitNorms {
    pub inv_norms: Vec<f32>,
    pub scales: Vec<f32>,
}

/// [`UnitNorms`] for one version of the store.
#[derive(Default)]
pub(crate) struct UnitNormCache(Mutex<Option<(u64, Arc<UnitNorms>)>>);

impl UnitNormCache {
    /// The norms of `v` and `g` (`units` rows) at `version`, computed on the first call
    /// for that version.
    pub fn get(&self, version: u64, v: &Var, g: &Var, units: usize) -> Result<Arc<UnitNorms>> {
        let mut entry = self.0.lock().expect("unit norm cache poisoned");
        if let Some((at, norms)) = entry.as_ref() {
            if *at == version {
                return Ok(norms.clone());
            }
        }
        let inv_norms = with_values(v.as_tensor(), |v| Ok(inverse_norms(v, units)))?;
        let scales = with_values(g.as_tensor(), |g| Ok(unit_scales(g, &inv_norms)))?;
        let norms = Arc::new(UnitNorms { inv_norms, scales });
        *entry = Some((version, norms.clone()));
        Ok(norms)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use candle_core::{Device, Tensor};

    use crate::nn::{Kernel, ParamStore, WeightNorm};

    #[test]
    fn norms_are_kept_until_the_store_changes() {
        let dev = Device::Cpu;
        let mut store = ParamStore::new(dev.clone());
        let kernel = Kernel::Linear { n_in: 2, n_out: 1 };
        let v = Tensor::new(&[[3.0f32, 4.0]], &dev).unwrap();
        let g = Tensor::new(&[1.0f32], &dev).unwrap();
        let wn = WeightNorm::from_values(&mut store, "fc", kernel, v, g).unwrap();
        let first = wn.unit_norms().unwrap();
        assert!(Arc::ptr_eq(&first, &wn.unit_norms().unwrap()));
        assert_eq!(first.inv_norms, vec![0.2]);
        // A change that goes through the store (as an optimizer step does).
        wn.v.set(&Tensor::new(&[[0.0f32, 2.0]], &dev).unwrap())
            .unwrap();
        wn.g.set(&Tensor::new(&[3.0f32], &dev).unwrap()).unwrap();
        store.bump_version();
        let second = wn.unit_norms().unwrap();
        assert_eq!((second.inv_norms[0], second.scales[0]), (0.5, 1.5));
    }
}
