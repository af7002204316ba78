//! RMSNorm (Zhang & Sennrich, 2019; DreamerV3 uses it in every layer): each sample is
//! divided by the root mean square of all of a layer's features (`(C, H, W)` for conv)
//! and scaled per feature: `y = gamma * t / sqrt(mean(t²) + eps)`. No centering, no
//! shift (and so no layer bias), no batch statistics. On the CPU one fused op computes
//! it and its closed-form backward (per agent in a population); elsewhere (and as the
//! tested reference) differentiable tensor ops do.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{ParamStore, RmsNorm};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let rms = RmsNorm::new(&mut store, "fc", &[2], 0.0).unwrap();
//! let t = Tensor::new(&[[3.0f32, 4.0], [1.0, -1.0]], &Device::Cpu).unwrap();
//! let y = rms.forward(&t, false).unwrap().to_vec2::<f32>().unwrap();
//! // Root mean squares sqrt(12.5) and 1.
//! let root = 12.5f32.sqrt();
//! assert!((y[0][0] - 3.0 / root).abs() < 1e-6 && (y[0][1] - 4.0 / root).abs() < 1e-6);
//! assert_eq!(y[1], vec![1.0, -1.0]);
//! ```

use candle_core::{Result, Tensor, Var};

use crate::kernels::layer_norm::check_rows;
use crate::kernels::per_agent::PerAgent;
use crate::kernels::rms_norm::{inverse_rms, rms_gradients, scale_rows, FusedRmsNorm};
use crate::kernels::{has_fused_ops, with_values};
use crate::nn::layer_norm::{normalized_per_sample, Centered};
use crate::nn::normalization::Fused;
use crate::nn::normalization::{
    copy_var, fused_or_reference, push, Backward, GraphLayer, HostGradients, HostLayer, HostOutput,
    KernelGradient, NormTape, Normalization, Saved, Take,
};
use crate::nn::{BnStats, ParamStore, Role};

/// RMSNorm of a layer: `gamma` per feature, one network's (`lead` 0) or a population's
/// stacked (`lead` 1).
pub struct RmsNorm {
    gamma: Var,
    eps: f64,
    lead: usize,
}

impl RmsNorm {
    /// `features`: one sample's shape, e.g. `[n]` or `[C, H, W]`.
    pub fn new(store: &mut ParamStore, prefix: &str, features: &[usize], eps: f64) -> Result<Self> {
        let gamma = store.ones(&format!("{prefix}.rms.gamma"), features, Role::Weight)?;
        Ok(Self::of(gamma, eps, 0))
    }

    /// A population's, from the agents' stacked variables.
    pub(crate) fn stack(take: &mut Take, eps: f64) -> Result<Self> {
        Ok(Self::of(take("rms.gamma", Role::Weight)?, eps, 1))
    }

    pub(crate) fn of(gamma: Var, eps: f64, lead: usize) -> Self {
        Self { gamma, eps, lead }
    }

    /// The layer's normalization, then the ReLU where `relu`: one op on the CPU.
    pub fn forward(&self, t: &Tensor, relu: bool) -> Result<Tensor> {
        let reference = |t: &Tensor| self.forward_reference(t);
        fused_or_reference(t, relu, reference, |t| {
            let op = FusedRmsNorm {
                eps: self.eps,
                relu,
            };
            t.apply_op2(&self.gamma.as_tensor().contiguous()?, op)
        })
    }

    /// The layer through candle's tensor ops, for any leading axes.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        normalized_per_sample(t, self.lead + 1, Centered::No, self.eps)?
            .broadcast_mul(self.gamma.as_tensor())
    }

    /// [`Self::forward`] (with the ReLU if `relu`) on host values (rows of this layer's
    /// features); also returns each row's `1 / rms`, which the backward reads.
    fn host_values(&self, t: &[f32], relu: bool) -> Result<(Vec<f32>, Vec<f32>)> {
        with_values(self.gamma.as_tensor(), |gamma| {
            check_rows(t, gamma)?;
            let inv = inverse_rms(t, gamma.len(), self.eps);
            Ok((scale_rows(t, &inv, gamma, relu), inv))
        })
    }
}

impl Normalization for RmsNorm {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![&self.gamma], vec![])
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        Ok(Box::new(Self::of(
            copy_var(&self.gamma)?,
            self.eps,
            self.lead,
        )))
    }

    fn normalize(&self, h: Tensor, _stats: BnStats) -> Result<Tensor> {
        self.forward_reference(&h)
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        self.forward(t, layer.relu)
    }

    #[inline]
    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        let (out, inv) = self.host_values(&t, layer.relu)?;
        // The backward reads the input and each row's inverse RMS.
        Ok(HostOutput::keeping(out, t, keep, NormTape::Rms(inv)))
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        let NormTape::Rms(inv) = saved.tape else {
            candle_core::bail!("host backward: the forward kept no RMSNorm statistics");
        };
        let dy = saved.below_relu(dy);
        let (dt, dgamma) = with_values(self.gamma.as_tensor(), |gamma| {
            check_rows(saved.t, gamma)?;
            if inv.len() * gamma.len() != saved.t.len() {
                candle_core::bail!("RMSNorm: statistics of another input");
            }
            Ok(rms_gradients(saved.t, inv, gamma, &dy))
        })?;
        push(grads, &self.gamma, dgamma);
        Ok(KernelGradient::plain(dt))
    }

    fn has_cuda_kernel(&self) -> bool {
        true
    }

    fn fused_forward(&self, h: &Tensor, _stats: BnStats, bias: Option<&Var>) -> Fused {
        // Per feature gains only: the loops take a sample's features as one row.
        let (agents, rows) = (h.dim(0)?, h.dim(1)?);
        let per_sample = h.elem_count() / (agents * rows).max(1);
        if !has_fused_ops(h.device())
            || bias.is_some()
            || self.gamma.elem_count() != agents * per_sample
        {
            return Ok(None);
        }
        let kernel = FusedRmsNorm {
            eps: self.eps,
            relu: true,
        };
        let op = PerAgent { kernel, agents };
        op.apply1(h, self.gamma.as_tensor()).map(Some)
    }

    // Its host loops (`host_forward`, `host_backward`) take no weight norm's scale.
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        !weight_normed
    }
}
