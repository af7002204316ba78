//! A population of MLP Q-networks as one network: every parameter carries a leading
//! population axis, each layer is one batched product over all agents, and every
//! normalization's statistics are per agent (layer norm's per agent and sample, batch
//! norm's per agent over its own batch). The agents' networks are stacked from single
//! [`QNetwork`]s, so each starts exactly as it would alone.

use candle_core::{Result, Tensor, Var};

use crate::nn::{BnStats, NormKind, QNetwork};

/// A hidden layer's normalization, its values `[P, 1, units]`.
enum PopulationNorm {
    None,
    Layer {
        gamma: Var,
        beta: Var,
    },
    /// Batch norm: running statistics (buffers, never trained) besides `gamma`, `beta`.
    Batch {
        gamma: Var,
        beta: Var,
        running_mean: Var,
        running_var: Var,
    },
}

/// One layer: `[P, in, out]` weights (stored transposed, so that the product needs no
/// copy), an optional bias `[P, 1, out]`, the normalization and the ReLU.
struct PopulationLayer {
    weight: Var,
    bias: Option<Var>,
    norm: PopulationNorm,
    relu: bool,
}

impl PopulationLayer {
    /// Trainable variables, in a fixed order.
    fn trainable(&self) -> Vec<&Var> {
        let mut v = vec![&self.weight];
        v.extend(&self.bias);
        match &self.norm {
            PopulationNorm::None => {}
            PopulationNorm::Layer { gamma, beta } | PopulationNorm::Batch { gamma, beta, .. } => {
                v.extend([gamma, beta])
            }
        }
        v
    }

    /// Everything a target sync copies: the trainable variables, then the buffers.
    fn all(&self) -> Vec<&Var> {
        let mut v = self.trainable();
        if let PopulationNorm::Batch {
            running_mean,
            running_var,
            ..
        } = &self.norm
        {
            v.extend([running_mean, running_var]);
        }
        v
    }
}

/// The settings every layer shares.
#[derive(Clone, Copy)]
struct Settings {
    agents: usize,
    ln_eps: f64,
    bn_eps: f64,
    bn_momentum: f64,
}

/// P agents' Q-networks: MLPs with no normalization, layer norm or batch norm (the
/// other methods are not built yet: `stack` refuses them).
pub struct PopulationNet {
    layers: Vec<PopulationLayer>,
    /// Each trainable variable's single-network name, in the order of [`Self::vars`].
    names: Vec<String>,
    settings: Settings,
}

/// The values of `name` in every agent's store, stacked along a new first axis.
fn stacked(nets: &[&QNetwork], name: &str) -> Result<Tensor> {
    let values = nets
        .iter()
        .map(|n| match n.store().get(name) {
            Some(p) => Ok(p.var.as_tensor().clone()),
            None => candle_core::bail!("agent networks differ: one has no {name}"),
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::stack(&values, 0)
}

impl PopulationNet {
    /// The networks of `nets` (one per agent, alike but for their values) as one.
    pub fn stack(nets: &[&QNetwork]) -> Result<Self> {
        let Some(first) = nets.first() else {
            candle_core::bail!("a population needs at least one agent");
        };
        let config = first.norm();
        let kind = config.kind;
        let supported = matches!(
            kind,
            NormKind::None | NormKind::LayerNorm | NormKind::BatchNorm
        );
        if !supported || first.layers().any(|l| l.kernel().weight_shape().len() != 2) {
            candle_core::bail!(
                "populations support MLPs with norm none, layer_norm or batch_norm so far, not {kind}"
            );
        }
        let mut names = vec![];
        let mut layers = vec![];
        for layer in first.layers() {
            let name = layer.name();
            let mut take = |suffix: &str, trainable: bool| -> Result<Var> {
                let full = format!("{name}.{suffix}");
                let values = stacked(nets, &full)?;
                if trainable {
                    names.push(full);
                }
                match suffix {
                    "weight" => Var::from_tensor(&values.transpose(1, 2)?.contiguous()?),
                    _ => Var::from_tensor(&values.unsqueeze(1)?),
                }
            };
            let weight = take("weight", true)?;
            let bias = layer.bias().map(|_| take("bias", true)).transpose()?;
            let norm = match (kind, layer.relu) {
                (NormKind::LayerNorm, true) => PopulationNorm::Layer {
                    gamma: take("ln.gamma", true)?,
                    beta: take("ln.beta", true)?,
                },
                (NormKind::BatchNorm, true) => PopulationNorm::Batch {
                    gamma: take("bn.gamma", true)?,
                    beta: take("bn.beta", true)?,
                    running_mean: take("bn.running_mean", false)?,
                    running_var: take("bn.running_var", false)?,
                },
                _ => PopulationNorm::None,
            };
            let relu = layer.relu;
            layers.push(PopulationLayer {
                weight,
                bias,
                norm,
                relu,
            });
        }
        let settings = Settings {
            agents: nets.len(),
            ln_eps: config.ln_eps,
            bn_eps: config.bn_eps,
            bn_momentum: config.bn_momentum,
        };
        Ok(Self {
            layers,
            names,
            settings,
        })
    }

    pub fn agents(&self) -> usize {
        self.settings.agents
    }

    /// Every trainable variable, named as in a single network (a weight is stored
    /// transposed: `[P, in, out]` for `[out, in]`; per-unit values `[P, 1, out]`).
    pub fn vars(&self) -> Vec<(&str, &Var)> {
        let vars = self.layers.iter().flat_map(PopulationLayer::trainable);
        self.names.iter().map(String::as_str).zip(vars).collect()
    }

    /// Q-values `[P, B, actions]` of observations `[P, B, obs]`: agent `i`'s network on
    /// agent `i`'s rows. With batch statistics, batch norm uses each agent's batch and
    /// updates its running statistics, as a single network's training forward does.
    pub fn forward(&self, x: &Tensor, stats: BnStats) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = h.matmul(layer.weight.as_tensor())?;
            if let Some(b) = &layer.bias {
                h = h.broadcast_add(b.as_tensor())?;
            }
            h = self.normalize(&layer.norm, h, stats)?;
            if layer.relu {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    fn normalize(&self, norm: &PopulationNorm, h: Tensor, stats: BnStats) -> Result<Tensor> {
        let s = &self.settings;
        let affine = |x_hat: Tensor, gamma: &Var, beta: &Var| {
            x_hat
                .broadcast_mul(gamma.as_tensor())?
                .broadcast_add(beta.as_tensor())
        };
        match norm {
            PopulationNorm::None => Ok(h),
            PopulationNorm::Layer { gamma, beta } => {
                let (mean, var) = moments(&h, 2)?;
                let x_hat = h
                    .broadcast_sub(&mean)?
                    .broadcast_div(&(var + s.ln_eps)?.sqrt()?)?;
                affine(x_hat, gamma, beta)
            }
            PopulationNorm::Batch {
                gamma,
                beta,
                running_mean,
                running_var,
            } => {
                let (mean, var) = match stats {
                    BnStats::Batch => {
                        let (mean, var) = moments(&h, 1)?;
                        self.update_running(&h, (&mean, &var), (running_mean, running_var))?;
                        (mean, var)
                    }
                    BnStats::Running => (
                        running_mean.as_tensor().clone(),
                        running_var.as_tensor().clone(),
                    ),
                };
                let x_hat = h
                    .broadcast_sub(&mean)?
                    .broadcast_div(&(var + s.bn_eps)?.sqrt()?)?;
                affine(x_hat, gamma, beta)
            }
        }
    }

    /// Batch norm's running statistics from one agent batch each: the mean always, the
    /// (unbiased) variance where a batch has more than one row.
    fn update_running(
        &self,
        h: &Tensor,
        batch: (&Tensor, &Tensor),
        running: (&Var, &Var),
    ) -> Result<()> {
        let m = self.settings.bn_momentum;
        let n = h.dim(1)? as f64;
        let blend = |running: &Var, batch: Tensor| -> Result<()> {
            running.set(&((running.as_tensor() * (1.0 - m))? + (batch.detach() * m)?)?)
        };
        blend(running.0, batch.0.clone())?;
        if n > 1.0 {
            blend(running.1, (batch.1 * (n / (n - 1.0)))?)?;
        }
        Ok(())
    }

    /// `self = other` (a target network's sync, buffers included), every agent alike.
    pub fn copy_from(&self, other: &PopulationNet) -> Result<()> {
        let mine = self.layers.iter().flat_map(PopulationLayer::all);
        for (a, b) in mine.zip(other.layers.iter().flat_map(PopulationLayer::all)) {
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
                let norm = match &l.norm {
                    PopulationNorm::None => PopulationNorm::None,
                    PopulationNorm::Layer { gamma, beta } => PopulationNorm::Layer {
                        gamma: copy(gamma)?,
                        beta: copy(beta)?,
                    },
                    PopulationNorm::Batch {
                        gamma,
                        beta,
                        running_mean,
                        running_var,
                    } => PopulationNorm::Batch {
                        gamma: copy(gamma)?,
                        beta: copy(beta)?,
                        running_mean: copy(running_mean)?,
                        running_var: copy(running_var)?,
                    },
                };
                Ok(PopulationLayer {
                    weight: copy(&l.weight)?,
                    bias: l.bias.as_ref().map(copy).transpose()?,
                    norm,
                    relu: l.relu,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            names: self.names.clone(),
            settings: self.settings,
        })
    }
}

/// Mean and population variance of `h` along `dim`, kept for broadcasting.
fn moments(h: &Tensor, dim: usize) -> Result<(Tensor, Tensor)> {
    let mean = h.mean_keepdim(dim)?;
    let var = h.broadcast_sub(&mean)?.sqr()?.mean_keepdim(dim)?;
    Ok((mean, var))
}
