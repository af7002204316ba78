//! Layer normalization (Ba et al., 2016): each sample is normalized over all of a
//! layer's features (`(C, H, W)` for conv), then scaled and shifted per feature. Built
//! from differentiable tensor ops: candle's fused `LayerNorm` drops gradients.
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

use candle_core::{Result, Tensor, Var};

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
        let (mean, var) = sample_moments(t)?;
        t.broadcast_sub(&mean)?
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(self.gamma.as_tensor())?
            .broadcast_add(self.beta.as_tensor())
    }
}
