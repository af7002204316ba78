//! Layer normalization (Ba et al., 2016): each sample is normalized over all of a
//! layer's features (`(C, H, W)` for conv), then scaled and shifted per feature. On the
//! CPU one fused op computes it and its closed-form backward (per agent in a
//! population, group norm's op with one group); elsewhere (and as the tested reference)
//! differentiable tensor ops do (candle's own `LayerNorm` drops gradients).
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

use crate::kernels::has_fused_ops;
use crate::kernels::layer_norm::{
    check_rows, normalize_rows, row_gradients, row_statistics, FusedLayerNorm,
};
use crate::kernels::per_agent::{Applied, PerAgent};
use crate::kernels::with_values;
use crate::nn::normalization::Fused;
use crate::nn::normalization::{
    affine, copy_var, fused_or_reference, push, Backward, GraphLayer, HostGradients, HostLayer,
    HostOutput, KernelGradient, NormTape, Normalization, Saved, Take,
};
use crate::nn::{BnStats, ParamStore, Role};

/// Layer norm of a layer: `gamma` and `beta` per feature, one network's (`lead` 0) or a
/// population's stacked (`lead` 1).
pub struct LayerNorm {
    gamma: Var,
    beta: Var,
    eps: f64,
    lead: usize,
}

impl LayerNorm {
    /// `features`: one sample's shape, e.g. `[n]` or `[C, H, W]`.
    pub fn new(store: &mut ParamStore, prefix: &str, features: &[usize], eps: f64) -> Result<Self> {
        Ok(Self {
            gamma: store.ones(&format!("{prefix}.ln.gamma"), features, Role::Weight)?,
            beta: store.zeros(&format!("{prefix}.ln.beta"), features, Role::Weight)?,
            eps,
            lead: 0,
        })
    }

    /// A population's, from the agents' stacked variables.
    pub(crate) fn stack(take: &mut Take, eps: f64) -> Result<Self> {
        Ok(Self {
            gamma: take("ln.gamma", Role::Weight)?,
            beta: take("ln.beta", Role::Weight)?,
            eps,
            lead: 1,
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

    fn op(&self, relu: bool) -> FusedLayerNorm {
        FusedLayerNorm {
            eps: self.eps,
            relu,
            groups: 1,
            spatial: 1,
        }
    }

    /// The layer through candle's tensor ops, for any leading axes.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        let x_hat = normalized_per_sample(t, self.lead + 1, Centered::Groups(1), self.eps)?;
        affine(x_hat, self.gamma.as_tensor(), self.beta.as_tensor())
    }
}

/// How [`normalized_per_sample`] normalizes a sample's features.
#[derive(Clone, Copy)]
pub(crate) enum Centered {
    /// By each of this many contiguous groups' mean and variance (layer norm: 1 group).
    Groups(usize),
    /// By their root mean square, uncentered (RMSNorm).
    No,
}

/// The per-sample normalizations' tensor-op form (layer norm, group norm, RMSNorm),
/// written once for a single network and a population: `t` is `[samples.., features]`
/// or `[samples.., channels, positions..]`, its first `sample_axes` axes the samples (a
/// batch `B`; a population's `P, B`), each normalized over its own features, before
/// the method's per-feature gain and shift. The fused ops' reference, and what a device
/// runs.
pub(crate) fn normalized_per_sample(
    t: &Tensor,
    sample_axes: usize,
    centered: Centered,
    eps: f64,
) -> Result<Tensor> {
    let samples: usize = t.dims()[..sample_axes].iter().product();
    match centered {
        Centered::Groups(groups) => {
            let grouped = t.reshape((samples, groups, ()))?;
            // Centered twice, as two nodes of the graph: the population's form always
            // was, and its gradients' summation order is what parity measures.
            let mean = grouped.mean_keepdim(2)?;
            let var = grouped.broadcast_sub(&mean)?.sqr()?.mean_keepdim(2)?;
            grouped
                .broadcast_sub(&mean)?
                .broadcast_div(&(var + eps)?.sqrt()?)?
                .reshape(t.shape())
        }
        Centered::No => {
            // Over a feature map's positions, then its channels.
            let h = match t.rank() - sample_axes {
                1 => t.clone(),
                _ => t.flatten_from(sample_axes + 1)?,
            };
            let last = h.rank() - 1;
            let mean_square = match h.rank() - sample_axes {
                1 => h.sqr()?.mean_keepdim(last)?,
                _ => h.sqr()?.mean_keepdim(last)?.mean_keepdim(last - 1)?,
            };
            h.broadcast_div(&(mean_square + eps)?.sqrt()?)?
                .reshape(t.shape())
        }
    }
}

impl Normalization for LayerNorm {
    /// The gain and offset (NaP projects them).
    fn affine(&self) -> Option<(&Var, &Var)> {
        Some((&self.gamma, &self.beta))
    }

    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![&self.gamma, &self.beta], vec![])
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        Ok(Box::new(Self {
            gamma: copy_var(&self.gamma)?,
            beta: copy_var(&self.beta)?,
            eps: self.eps,
            lead: self.lead,
        }))
    }

    fn normalize(&self, h: Tensor, _stats: BnStats) -> Result<Tensor> {
        self.forward_reference(&h)
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        self.forward_then(t, layer.relu)
    }

    #[inline]
    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        host_normalize([&self.gamma, &self.beta], layer, t, (1, self.eps), keep)
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        host_normalize_backward([&self.gamma, &self.beta], saved, dy, grads)
    }

    fn has_cuda_kernel(&self) -> bool {
        true
    }

    fn fused_forward(&self, h: &Tensor, _stats: BnStats, bias: Option<&Var>) -> Fused {
        fused_per_agent(h, [&self.gamma, &self.beta], (1, self.eps), bias)
    }

    // Its host loops (`host_forward`, `host_backward`) take no weight norm's scale.
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        !weight_normed
    }
}

/// Layer and group norm on host values (rows of features, `[gamma, beta]` one per
/// feature): each row's groups (`(groups, eps)`) normalized by their own statistics,
/// which the backward reads with the input where `keep`, then the affine and the
/// layer's ReLU.
pub(crate) fn host_normalize(
    [gamma, beta]: [&Var; 2],
    layer: &HostLayer,
    t: Vec<f32>,
    (groups, eps): (usize, f64),
    keep: bool,
) -> Result<HostOutput> {
    let (out, statistics) = with_values(gamma.as_tensor(), |gamma| {
        with_values(beta.as_tensor(), |beta| {
            check_rows(&t, gamma)?;
            let statistics = row_statistics(&t, gamma.len() / groups.max(1), eps);
            let out = normalize_rows(&t, &statistics, gamma, beta, layer.relu);
            Ok((out, statistics))
        })
    })?;
    Ok(HostOutput::keeping(
        out,
        t,
        keep,
        NormTape::Layer(statistics),
    ))
}

/// [`host_normalize`]'s backward: pushes `gamma`'s and `beta`'s gradients, returns the
/// input's.
pub(crate) fn host_normalize_backward(
    [gamma, beta]: [&Var; 2],
    saved: &Saved,
    dy: Vec<f32>,
    grads: &mut HostGradients,
) -> Backward {
    let NormTape::Layer(statistics) = saved.tape else {
        candle_core::bail!("host backward: the forward kept no layer or group statistics");
    };
    let dy = saved.below_relu(dy);
    let (dt, dgamma, dbeta) = with_values(gamma.as_tensor(), |g| {
        check_rows(saved.t, g)?;
        let rows = statistics.rows().max(1);
        let fits =
            saved.t.len().is_multiple_of(rows) && g.len().is_multiple_of(saved.t.len() / rows);
        if !fits {
            candle_core::bail!("layer or group norm: statistics of another input");
        }
        Ok(row_gradients(saved.t, statistics, g, &dy))
    })?;
    push(grads, gamma, dgamma);
    push(grads, beta, dbeta);
    Ok(KernelGradient::plain(dt))
}

/// Layer and group norm's per-agent fused op over a population's `h` (`[P, B, units]`
/// or `[P, B, channels, positions]`), each sample's `(groups, eps)` normalized, then the
/// affine and a ReLU; `None` where the device has no fused ops or the layer a bias.
pub(crate) fn fused_per_agent(
    h: &Tensor,
    [gamma, beta]: [&Var; 2],
    (groups, eps): (usize, f64),
    bias: Option<&Var>,
) -> Result<Option<Applied>> {
    if !has_fused_ops(h.device()) || bias.is_some() {
        return Ok(None);
    }
    // Group norm's parameters are per channel, each over its positions; layer norm's
    // per feature.
    let (agents, rows) = (h.dim(0)?, h.dim(1)?);
    let per_sample = h.elem_count() / (agents * rows).max(1);
    let positions = per_sample / (gamma.elem_count() / agents).max(1);
    let kernel = FusedLayerNorm {
        eps,
        relu: true,
        groups,
        spatial: positions,
    };
    let op = PerAgent { kernel, agents };
    op.apply2(h, gamma.as_tensor(), beta.as_tensor()).map(Some)
}
