//! A population of MLP Q-networks as one network: every parameter carries a leading
//! population axis, each layer is one batched product over all agents, and layer
//! norm's statistics are per agent and sample by construction. The agents' networks
//! are stacked from single [`QNetwork`]s, so each starts exactly as it would alone.

use candle_core::{Result, Tensor, Var};

use crate::nn::{NormKind, QNetwork};

/// One layer: `[P, in, out]` weights (stored transposed, so that the product needs no
/// copy), and a bias or layer norm's `gamma` and `beta`, each `[P, 1, out]`.
struct PopulationLayer {
    weight: Var,
    bias: Option<Var>,
    layer_norm: Option<(Var, Var)>,
    relu: bool,
}

/// P agents' Q-networks, MLPs without normalization or with layer norm (the other
/// methods are not built yet: `stack` refuses them).
pub struct PopulationNet {
    layers: Vec<PopulationLayer>,
    /// Each variable's single-network name, in the order of [`Self::vars`].
    names: Vec<String>,
    agents: usize,
    eps: f64,
}

impl PopulationNet {
    /// The networks of `nets` (one per agent, alike but for their values) as one.
    pub fn stack(nets: &[&QNetwork]) -> Result<Self> {
        let Some(first) = nets.first() else {
            candle_core::bail!("a population needs at least one agent");
        };
        let kind = first.norm().kind;
        if !matches!(kind, NormKind::None | NormKind::LayerNorm) || first.layers().count() == 0 {
            candle_core::bail!(
                "populations support MLPs with norm none or layer_norm so far, not {kind}"
            );
        }
        let stacked = |name: &str| -> Result<Var> {
            let values = nets
                .iter()
                .map(|n| match n.store().get(name) {
                    Some(p) => Ok(p.var.as_tensor().clone()),
                    None => candle_core::bail!("agent networks differ: one has no {name}"),
                })
                .collect::<Result<Vec<_>>>()?;
            Var::from_tensor(&Tensor::stack(&values, 0)?)
        };
        let mut names = vec![];
        let mut layers = vec![];
        for layer in first.layers() {
            if layer.kernel().weight_shape().len() != 2 {
                candle_core::bail!("populations support MLPs only so far");
            }
            let name = layer.name();
            let weight = stacked(&format!("{name}.weight"))?
                .as_tensor()
                .transpose(1, 2)?;
            let weight = Var::from_tensor(&weight.contiguous()?)?;
            names.push(format!("{name}.weight"));
            let mut per_unit = |suffix: &str| -> Result<Var> {
                names.push(format!("{name}.{suffix}"));
                let v = stacked(&format!("{name}.{suffix}"))?;
                Var::from_tensor(&v.as_tensor().unsqueeze(1)?)
            };
            let bias = layer.bias().map(|_| per_unit("bias")).transpose()?;
            let layer_norm = match kind == NormKind::LayerNorm && layer.relu {
                true => Some((per_unit("ln.gamma")?, per_unit("ln.beta")?)),
                false => None,
            };
            let relu = layer.relu;
            layers.push(PopulationLayer {
                weight,
                bias,
                layer_norm,
                relu,
            });
        }
        Ok(Self {
            layers,
            names,
            agents: nets.len(),
            eps: first.norm().ln_eps,
        })
    }

    pub fn agents(&self) -> usize {
        self.agents
    }

    /// Every trainable variable, named as in a single network (a weight is stored
    /// transposed: `[P, in, out]` for `[out, in]`; per-unit values `[P, 1, out]`).
    pub fn vars(&self) -> Vec<(&str, &Var)> {
        let vars = self.layers.iter().flat_map(|l| {
            let norm = l.layer_norm.iter().flat_map(|(g, b)| [g, b]);
            std::iter::once(&l.weight).chain(l.bias.iter()).chain(norm)
        });
        self.names.iter().map(String::as_str).zip(vars).collect()
    }

    /// Q-values `[P, B, actions]` of observations `[P, B, obs]`: agent `i`'s network on
    /// agent `i`'s rows.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = h.matmul(layer.weight.as_tensor())?;
            if let Some(b) = &layer.bias {
                h = h.broadcast_add(b.as_tensor())?;
            }
            if let Some((gamma, beta)) = &layer.layer_norm {
                let mean = h.mean_keepdim(2)?;
                let centered = h.broadcast_sub(&mean)?;
                let var = centered.sqr()?.mean_keepdim(2)?;
                let x_hat = centered.broadcast_div(&(var + self.eps)?.sqrt()?)?;
                h = x_hat
                    .broadcast_mul(gamma.as_tensor())?
                    .broadcast_add(beta.as_tensor())?;
            }
            if layer.relu {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    /// `self = other` (a target network's sync), agent by agent alike.
    pub fn copy_from(&self, other: &PopulationNet) -> Result<()> {
        for ((_, a), (_, b)) in self.vars().iter().zip(other.vars()) {
            a.set(b.as_tensor())?;
        }
        Ok(())
    }

    /// An independent copy (a target network).
    pub fn duplicate(&self) -> Result<Self> {
        let copy = |v: &Var| Var::from_tensor(&v.as_tensor().copy()?);
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let layer_norm = match &l.layer_norm {
                    Some((g, b)) => Some((copy(g)?, copy(b)?)),
                    None => None,
                };
                Ok(PopulationLayer {
                    weight: copy(&l.weight)?,
                    bias: l.bias.as_ref().map(copy).transpose()?,
                    layer_norm,
                    relu: l.relu,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            names: self.names.clone(),
            agents: self.agents,
            eps: self.eps,
        })
    }
}
