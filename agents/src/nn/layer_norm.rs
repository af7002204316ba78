//! Layer normalization (Ba et al., 2016): each sample is normalized over all of a
//! layer's features (`(C, H, W)` for conv), then scaled and shifted per feature. On the
//! CPU one fused op computes it and its closed-form backward; elsewhere (and as the
//! tested reference) differentiable tensor ops do (candle's own `LayerNorm` drops
//! gradients).
//!
//! Per sample, with `x̂ = (t - mean) / sqrt(var + eps)` over its `n` features:
//! `dbeta = Σ_b dy`, `dgamma = Σ_b dy·x̂`, and with `d = dy·gamma`,
//! `dt = (d - Σd/n - x̂ Σ(d·x̂)/n) / sqrt(var + eps)`.
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

use super::activation_norm::{
    fused_or_reference, push, ActivationNorm, Backward, GraphLayer, HostGradient, HostGradients,
    HostLayer, HostOutput, NormTape, Saved,
};
use super::kernel::sample_moments;
use super::{Group, ParamStore};
use crate::kernels::fused::{relu_mask, with_values};
use crate::kernels::layer_norm::{
    check_rows, normalize_rows, row_gradients, row_statistics, FusedLayerNorm, RowStatistics,
};

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
        self.forward_then(t, false)
    }

    /// `relu(forward(t))`, in one op on the CPU.
    pub fn forward_relu(&self, t: &Tensor) -> Result<Tensor> {
        self.forward_then(t, true)
    }

    fn forward_then(&self, t: &Tensor, relu: bool) -> Result<Tensor> {
        fused_or_reference(
            t,
            relu,
            |t| self.forward_reference(t),
            |t| {
                t.apply_op3(
                    &self.gamma.as_tensor().contiguous()?,
                    &self.beta.as_tensor().contiguous()?,
                    self.op(relu),
                )
            },
        )
    }

    /// [`Self::forward`] (with the ReLU if `relu`) on host values: `t` holds rows of
    /// this layer's features.
    /// Also returns the samples' statistics, which [`Self::host_gradients`] reads.
    fn host_values(&self, t: &[f32], relu: bool) -> Result<(Vec<f32>, RowStatistics)> {
        with_values(self.gamma.as_tensor(), |gamma| {
            with_values(self.beta.as_tensor(), |beta| {
                check_rows(t, gamma)?;
                let statistics = row_statistics(t, gamma.len(), self.eps);
                let out = normalize_rows(t, &statistics, gamma, beta, relu);
                Ok((out, statistics))
            })
        })
    }

    /// The gradients of [`Self::host_values`]'s input, `gamma` and `beta` from `dy`, the
    /// gradient of its output `out`.
    fn host_gradients(
        &self,
        t: &[f32],
        statistics: &RowStatistics,
        out: &[f32],
        dy: Vec<f32>,
        relu: bool,
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let dy = if relu { relu_mask(out, &dy) } else { dy };
        with_values(self.gamma.as_tensor(), |gamma| {
            check_rows(t, gamma)?;
            if statistics.rows() * gamma.len() != t.len() {
                candle_core::bail!("layer norm: statistics of another input");
            }
            Ok(row_gradients(t, statistics, gamma, &dy))
        })
    }

    fn op(&self, relu: bool) -> FusedLayerNorm {
        FusedLayerNorm {
            eps: self.eps,
            relu,
        }
    }

    /// The layer through candle's tensor ops.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        let (mean, var) = sample_moments(t)?;
        t.broadcast_sub(&mean)?
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(self.gamma.as_tensor())?
            .broadcast_add(self.beta.as_tensor())
    }
}

impl ActivationNorm for LayerNorm {
    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        self.forward_then(t, layer.relu)
    }

    #[inline]
    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        let (out, statistics) = self.host_values(&t, layer.relu)?;
        // The backward reads the input and its statistics.
        Ok(HostOutput::keeping(
            out,
            t,
            keep,
            NormTape::Layer(statistics),
        ))
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        let NormTape::Layer(statistics) = saved.tape else {
            candle_core::bail!("host backward: the forward kept no layer-norm statistics");
        };
        let relu = saved.layer.relu;
        let (dt, dgamma, dbeta) = self.host_gradients(saved.t, statistics, saved.out, dy, relu)?;
        push(grads, &self.gamma, dgamma);
        push(grads, &self.beta, dbeta);
        Ok(HostGradient::plain(dt))
    }
}
