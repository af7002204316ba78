//! Group normalization (Wu & He, 2018): per sample, the units (Linear) or channels
//! (conv) are split into `groups` contiguous groups, each normalized by its own mean
//! and variance (over its channels and all their positions), then scaled and shifted
//! per unit or channel. No batch statistics: training and evaluation agree. `groups = 1`
//! is layer norm over all of a layer's features (with per-channel parameters);
//! `groups = channels` is instance norm.
//!
//! It runs on layer norm's loops and fused op ([`crate::kernels::layer_norm`]), which
//! take their statistics per group.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{GroupNorm, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let gn = GroupNorm::new(&mut store, "fc", &[4], 2, 0.0).unwrap();
//! let t = Tensor::new(&[[1.0f32, 3.0, 10.0, 30.0]], &Device::Cpu).unwrap();
//! let y = gn.forward(&t, false).unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(y, vec![vec![-1.0, 1.0, -1.0, 1.0]]);
//! ```

use candle_core::{Result, Tensor, Var};

use super::activation_norm::{
    fused_or_reference, ActivationNorm, Backward, GraphLayer, HostGradients, HostLayer, HostOutput,
    Saved,
};
use super::layer_norm::{host_normalize, host_normalize_backward, normalized_per_sample, Centered};
use super::{ParamStore, Role};
use crate::kernels::layer_norm::FusedLayerNorm;

pub struct GroupNorm {
    gamma: Var,
    beta: Var,
    groups: usize,
    eps: f64,
    /// Values per channel in one sample (1 for a Linear layer).
    spatial: usize,
}

impl GroupNorm {
    /// `features`: one sample's shape, `[units]` or `[C, H, W]`; `groups` must divide
    /// the units or channels.
    pub fn new(
        store: &mut ParamStore,
        prefix: &str,
        features: &[usize],
        groups: usize,
        eps: f64,
    ) -> Result<Self> {
        let channels = features.first().copied().unwrap_or(0);
        if groups == 0 || !channels.is_multiple_of(groups) {
            candle_core::bail!("group norm: {groups} groups do not divide {channels} channels");
        }
        Ok(Self {
            gamma: store.ones(&format!("{prefix}.gn.gamma"), channels, Role::Weight)?,
            beta: store.zeros(&format!("{prefix}.gn.beta"), channels, Role::Weight)?,
            groups,
            eps,
            spatial: features[1..].iter().product(),
        })
    }

    /// The normalization, then the ReLU where `relu`: one op on the CPU.
    pub fn forward(&self, t: &Tensor, relu: bool) -> Result<Tensor> {
        let reference = |t: &Tensor| self.forward_reference(t);
        fused_or_reference(t, relu, reference, |t| {
            let op = FusedLayerNorm {
                eps: self.eps,
                relu,
                groups: self.groups,
                spatial: self.spatial,
            };
            let (gamma, beta) = (self.gamma.as_tensor(), self.beta.as_tensor());
            t.apply_op3(&gamma.contiguous()?, &beta.contiguous()?, op)
        })
    }

    /// The layer through candle's tensor ops.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        let normalized = normalized_per_sample(t, 1, Centered::Groups(self.groups), self.eps)?;
        let mut shape = vec![1; t.rank()];
        shape[1] = t.dim(1)?;
        normalized
            .broadcast_mul(&self.gamma.as_tensor().reshape(shape.as_slice())?)?
            .broadcast_add(&self.beta.as_tensor().reshape(shape.as_slice())?)
    }
}

impl ActivationNorm for GroupNorm {
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        // Linear layers only: their parameters are per feature, as the loops expect.
        !weight_normed && self.spatial == 1
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        self.forward(t, layer.relu)
    }

    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        let groups = (self.groups, self.eps);
        host_normalize([&self.gamma, &self.beta], layer, t, groups, keep)
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        host_normalize_backward([&self.gamma, &self.beta], saved, dy, grads)
    }
}

/// Group norm's population form: each agent's sample over each of `groups` contiguous
/// groups of units (of channels with all their positions), `gamma` and `beta` per unit.
pub(crate) struct StackedGroupNorm {
    gamma: Var,
    beta: Var,
    groups: usize,
    eps: f64,
}

impl StackedGroupNorm {
    pub(crate) fn stack(take: &mut super::stacked::Take, groups: usize, eps: f64) -> Result<Self> {
        let gamma = take("gn.gamma", super::Role::Weight)?;
        let beta = take("gn.beta", super::Role::Weight)?;
        Ok(Self::new(gamma, beta, groups, eps))
    }

    pub(crate) fn new(gamma: Var, beta: Var, groups: usize, eps: f64) -> Self {
        Self {
            gamma,
            beta,
            groups,
            eps,
        }
    }
}

impl super::stacked::StackedNorm for StackedGroupNorm {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![&self.gamma, &self.beta], vec![])
    }

    fn copied(&self) -> Result<Box<dyn super::stacked::StackedNorm>> {
        use super::stacked::copy_var;
        let (gamma, beta) = (copy_var(&self.gamma)?, copy_var(&self.beta)?);
        Ok(Box::new(Self::new(gamma, beta, self.groups, self.eps)))
    }

    fn has_cuda_kernel(&self) -> bool {
        true
    }

    fn fused_forward(
        &self,
        h: &Tensor,
        _stats: super::BnStats,
        bias: Option<&Var>,
    ) -> Result<Option<crate::kernels::per_agent::Applied>> {
        if !crate::kernels::has_fused_ops(h.device()) || bias.is_some() {
            return Ok(None);
        }
        // Group norm's parameters are per channel, each over its positions; layer
        // norm's per feature.
        let (agents, rows) = (h.dim(0)?, h.dim(1)?);
        let per_sample = h.elem_count() / (agents * rows).max(1);
        let positions = per_sample / (self.gamma.elem_count() / agents).max(1);
        let kernel = crate::kernels::layer_norm::FusedLayerNorm {
            eps: self.eps,
            relu: true,
            groups: self.groups,
            spatial: positions,
        };
        let op = crate::kernels::per_agent::PerAgent { kernel, agents };
        op.apply2(h, self.gamma.as_tensor(), self.beta.as_tensor())
            .map(Some)
    }

    fn normalize(&self, h: Tensor, _stats: super::BnStats) -> Result<Tensor> {
        let x_hat = normalized_per_sample(&h, 2, Centered::Groups(self.groups), self.eps)?;
        super::stacked::affine(x_hat, &self.gamma, &self.beta)
    }
}
