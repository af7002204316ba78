//! Group normalization (Wu & He, 2018): per sample, the units (Linear) or channels
//! (conv) are split into `groups` contiguous groups, each normalized by its own mean
//! and variance (over its channels and all their positions), then scaled and shifted
//! per unit or channel. No batch statistics: training and evaluation agree. `groups = 1`
//! is layer norm over all of a layer's features (with per-channel parameters);
//! `groups = channels` is instance norm.
//!
//! It runs on layer norm's loops and fused op ([`crate::kernels::layer_norm`]), which
//! take their statistics per group; a population's per agent.
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

use crate::kernels::layer_norm::FusedLayerNorm;
use crate::nn::layer_norm::{
    fused_per_agent, host_normalize, host_normalize_backward, normalized_per_sample, Centered,
};
use crate::nn::normalization::Fused;
use crate::nn::normalization::{
    affine, copy_var, fused_or_reference, unit_view, Backward, GraphLayer, HostGradients,
    HostLayer, HostOutput, Normalization, Saved, Take,
};
use crate::nn::{BnStats, ParamStore, Role};

/// Group norm of a layer: `gamma` and `beta` per unit or channel, one network's (`lead`
/// 0) or a population's stacked (`lead` 1).
pub struct GroupNorm {
    gamma: Var,
    beta: Var,
    groups: usize,
    eps: f64,
    lead: usize,
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
        let gamma = store.ones(&format!("{prefix}.gn.gamma"), channels, Role::Weight)?;
        let beta = store.zeros(&format!("{prefix}.gn.beta"), channels, Role::Weight)?;
        Ok(Self::of([gamma, beta], groups, eps, 0))
    }

    /// A population's, from the agents' stacked variables.
    pub(crate) fn stack(take: &mut Take, groups: usize, eps: f64) -> Result<Self> {
        let gamma = take("gn.gamma", Role::Weight)?;
        let beta = take("gn.beta", Role::Weight)?;
        Ok(Self::of([gamma, beta], groups, eps, 1))
    }

    pub(crate) fn of([gamma, beta]: [Var; 2], groups: usize, eps: f64, lead: usize) -> Self {
        Self {
            gamma,
            beta,
            groups,
            eps,
            lead,
        }
    }

    /// The normalization, then the ReLU where `relu`: one op on the CPU.
    pub fn forward(&self, t: &Tensor, relu: bool) -> Result<Tensor> {
        let reference = |t: &Tensor| self.forward_reference(t);
        fused_or_reference(t, relu, reference, |t| {
            // Values per channel in one sample (1 for a Linear layer).
            let spatial = t.elem_count() / (t.dim(0)? * t.dim(1)?).max(1);
            let op = FusedLayerNorm {
                eps: self.eps,
                relu,
                groups: self.groups,
                spatial,
            };
            let (gamma, beta) = (self.gamma.as_tensor(), self.beta.as_tensor());
            t.apply_op3(&gamma.contiguous()?, &beta.contiguous()?, op)
        })
    }

    /// The layer through candle's tensor ops, for any leading axes.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        let centered = Centered::Groups(self.groups);
        let x_hat = normalized_per_sample(t, self.lead + 1, centered, self.eps)?;
        let gamma = unit_view(self.gamma.as_tensor(), t, self.lead)?;
        let beta = unit_view(self.beta.as_tensor(), t, self.lead)?;
        affine(x_hat, &gamma, &beta)
    }
}

impl Normalization for GroupNorm {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![&self.gamma, &self.beta], vec![])
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        let vars = [copy_var(&self.gamma)?, copy_var(&self.beta)?];
        Ok(Box::new(Self::of(vars, self.groups, self.eps, self.lead)))
    }

    fn normalize(&self, h: Tensor, _stats: BnStats) -> Result<Tensor> {
        self.forward_reference(&h)
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        self.forward(t, layer.relu)
    }

    // The host path runs Linear layers only, whose parameters are per feature as its
    // loops expect.
    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        let groups = (self.groups, self.eps);
        host_normalize([&self.gamma, &self.beta], layer, t, groups, keep)
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        host_normalize_backward([&self.gamma, &self.beta], saved, dy, grads)
    }

    fn has_cuda_kernel(&self) -> bool {
        true
    }

    fn fused_forward(&self, h: &Tensor, _stats: BnStats, bias: Option<&Var>) -> Fused {
        let vars = [&self.gamma, &self.beta];
        fused_per_agent(h, vars, (self.groups, self.eps), bias)
    }

    // Its host loops (`host_forward`, `host_backward`) take no weight norm's scale.
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        !weight_normed
    }
}
