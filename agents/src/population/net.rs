//! A population of Q-networks (MLPs and convolutional ones) as one network: every
//! parameter carries a leading population axis, each layer is one batched product over
//! all agents, and every normalization's statistics are per agent (layer norm's per
//! agent and sample, batch norm's per agent over its own batch). The agents' networks
//! are stacked from single [`QNetwork`]s, so each starts exactly as it would alone.

use std::collections::HashMap;

use candle_core::{DType, Result, Tensor, Var};

use super::conv::Im2col;
use super::count::read_to_host;
use crate::nn::{BnStats, Group, Kernel, NormKind, NormLayer, QNetwork, RenormConfig};
use std::sync::atomic::{AtomicBool, Ordering};

/// A hidden layer's normalization, its values `[P, 1, units]` (`[P, 1, out, 1]` over
/// feature maps).
enum PopulationNorm {
    None,
    Layer {
        gamma: Var,
        beta: Var,
    },
    /// Group norm (MLPs): layer norm within each of `groups` contiguous groups.
    Group {
        gamma: Var,
        beta: Var,
        groups: usize,
    },
    Rms {
        gamma: Var,
    },
    /// Batch norm: running statistics (buffers, never trained) besides `gamma`, `beta`;
    /// with batch renormalization's correction for `batch_renorm`.
    Batch {
        gamma: Var,
        beta: Var,
        running_mean: Var,
        running_var: Var,
        renorm: Option<PopulationRenorm>,
    },
    /// Weight norm's mean-only batch norm: the batch mean subtracted, a running mean.
    MeanOnly {
        running_mean: Var,
    },
}

impl PopulationNorm {
    /// Trainable variables, then buffers.
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        match self {
            PopulationNorm::None => (vec![], vec![]),
            PopulationNorm::Layer { gamma, beta } | PopulationNorm::Group { gamma, beta, .. } => {
                (vec![gamma, beta], vec![])
            }
            PopulationNorm::Rms { gamma } => (vec![gamma], vec![]),
            PopulationNorm::Batch {
                gamma,
                beta,
                running_mean,
                running_var,
                renorm,
            } => {
                let mut buffers = vec![running_mean, running_var];
                buffers.extend(renorm.as_ref().map(|r| &r.updates));
                (vec![gamma, beta], buffers)
            }
            PopulationNorm::MeanOnly { running_mean } => (vec![], vec![running_mean]),
        }
    }

    /// The same normalization over copies of its variables.
    fn copied(&self) -> Result<Self> {
        let c = |v: &Var| Var::from_tensor(&v.as_tensor().copy()?);
        Ok(match self {
            PopulationNorm::None => PopulationNorm::None,
            PopulationNorm::Layer { gamma, beta } => PopulationNorm::Layer {
                gamma: c(gamma)?,
                beta: c(beta)?,
            },
            PopulationNorm::Group {
                gamma,
                beta,
                groups,
            } => PopulationNorm::Group {
                gamma: c(gamma)?,
                beta: c(beta)?,
                groups: *groups,
            },
            PopulationNorm::Rms { gamma } => PopulationNorm::Rms { gamma: c(gamma)? },
            PopulationNorm::Batch {
                gamma,
                beta,
                running_mean,
                running_var,
                renorm,
            } => PopulationNorm::Batch {
                gamma: c(gamma)?,
                beta: c(beta)?,
                running_mean: c(running_mean)?,
                running_var: c(running_var)?,
                renorm: match renorm {
                    Some(r) => Some(PopulationRenorm {
                        config: r.config,
                        updates: c(&r.updates)?,
                        open: AtomicBool::new(r.open.load(Ordering::Acquire)),
                    }),
                    None => None,
                },
            },
            PopulationNorm::MeanOnly { running_mean } => PopulationNorm::MeanOnly {
                running_mean: c(running_mean)?,
            },
        })
    }
}

/// Batch renormalization's clip and warm-up (see `nn/batch_renorm.rs`): the count of
/// training forwards is a buffer per agent (`[P, 1, 1]`), alike for all, read (agent
/// 0's, one read) only until the warm-up is over.
struct PopulationRenorm {
    config: RenormConfig,
    updates: Var,
    open: AtomicBool,
}

impl PopulationRenorm {
    /// Counts one training forward; whether the clip is open for it.
    fn count_update(&self) -> Result<bool> {
        if self.open.load(Ordering::Acquire) {
            return Ok(true);
        }
        let done = read_to_host::<f32>(&self.updates.as_tensor().flatten_all()?.narrow(0, 0, 1)?)?;
        if done[0] as u64 >= self.config.warmup {
            self.open.store(true, Ordering::Release);
            return Ok(true);
        }
        self.updates.set(&(self.updates.as_tensor() + 1.0)?)?;
        Ok(false)
    }

    /// `r` and `d` of a training forward (detached), from the batch's moments and the
    /// running statistics before this batch updates them.
    fn correction(
        &self,
        (mean, var): (&Tensor, &Tensor),
        (running_mean, running_var): (&Var, &Var),
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        let (r_max, d_max) = (self.config.r_max, self.config.d_max);
        let s = (running_var.as_tensor() + eps)?.sqrt()?;
        let s_batch = (var + eps)?.sqrt()?;
        let r = (s_batch / &s)?.clamp(1.0 / r_max, r_max)?.detach();
        let d = ((mean - running_mean.as_tensor())? / s)?
            .clamp(-d_max, d_max)?
            .detach();
        Ok((r, d))
    }
}

/// One layer: `[P, in, out]` weights (stored transposed, so that the product needs no
/// copy), or weight norm's `v` in that layout and its gains `g` `[P, 1, out]`; an
/// optional bias `[P, 1, out]`, the normalization and the ReLU.
struct PopulationLayer {
    weight: Var,
    gain: Option<Var>,
    bias: Option<Var>,
    norm: PopulationNorm,
    relu: bool,
    /// A convolution's unfolding; its per-unit values are `[P, 1, out, 1]`, over the
    /// feature maps `[P, B, out, positions]`.
    conv: Option<Im2col>,
}

impl PopulationLayer {
    /// Trainable variables, in a fixed order.
    fn trainable(&self) -> Vec<&Var> {
        let mut v = vec![&self.weight];
        v.extend(&self.gain);
        v.extend(&self.bias);
        v.extend(self.norm.vars().0);
        v
    }

    /// Everything a target sync copies: the trainable variables, then the buffers.
    fn all(&self) -> Vec<&Var> {
        let mut v = self.trainable();
        v.extend(self.norm.vars().1);
        v
    }

    /// The kernel's product of inputs `x` with weights `w` (`[P, in, out]`): `[P, B, out]`
    /// for a dense layer (feature maps from below flattened channel-major first),
    /// `[P, B, out, positions]` for a convolution.
    fn product(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let batch = x.dim(1)?;
        match &self.conv {
            Some(conv) => conv.channels_first(&conv.patches(x)?.matmul(w)?, batch),
            None if x.rank() > 3 => x.flatten_from(2)?.matmul(w),
            None => x.matmul(w),
        }
    }

    /// The weight the product uses: `w`, or weight norm's `g v / ||v||` per unit
    /// (`v`'s norms over its inputs, per agent). With `direction`, `v / ||v||` alone.
    fn effective_weight(&self, direction: bool) -> Result<Tensor> {
        let v = self.weight.as_tensor();
        let Some(g) = &self.gain else {
            return Ok(v.clone());
        };
        let inv_norm = v.sqr()?.sum_keepdim(1)?.sqrt()?.recip()?;
        match direction {
            true => v.broadcast_mul(&inv_norm),
            false => v.broadcast_mul(&(inv_norm * g.as_tensor())?),
        }
    }
}

/// The settings every layer shares.
#[derive(Clone, Copy)]
struct Settings {
    agents: usize,
    actions: usize,
    data_dependent_init: bool,
    g_lr_scale: f64,
    ln_eps: f64,
    bn_eps: f64,
    bn_momentum: f64,
    /// SVB's projection of the hidden layers' weights every `interval` updates, with
    /// bound `eps`; BBN's bound of the gains too, when set.
    svb: Option<SvbSettings>,
}

#[derive(Clone, Copy)]
struct SvbSettings {
    eps: f64,
    interval: u64,
    bbn_eps: Option<f64>,
}

/// P agents' Q-networks, with the methods the module's page lists (`stack` refuses the
/// others).
pub struct PopulationNet {
    layers: Vec<PopulationLayer>,
    /// Every variable's (buffers too) single-network name, group and layout, in the
    /// order of the layers' [`PopulationLayer::all`]; the trainable ones, in order, are
    /// those of [`Self::vars`].
    layouts: Vec<VarLayout>,
    settings: Settings,
}

/// How a single network's variable is laid out in the population's: a weight
/// `[out, in...]` becomes `[P, in, out]` (transposed, so that the product needs no
/// copy); per-unit values gain axes of size one for broadcasting.
#[derive(Clone)]
pub(crate) struct VarLayout {
    pub(crate) name: String,
    /// The optimizer's group (weight norm's gains have a learning rate of their own);
    /// `Buffer` for what is never trained.
    group: Group,
    transposed: bool,
}

impl VarLayout {
    /// Every agent's values `[P, single shape...]` in the population's layout `shape`.
    pub(crate) fn stack(&self, values: &Tensor, shape: &[usize]) -> Result<Tensor> {
        match self.transposed {
            true => values.flatten_from(2)?.transpose(1, 2)?.contiguous(),
            false => values.reshape(shape),
        }
    }

    /// Agent `i`'s values of a population variable `values`, in the single network's
    /// shape `single`.
    pub(crate) fn agent(&self, values: &Tensor, i: usize, single: &[usize]) -> Result<Tensor> {
        let x = values.get(i)?;
        let x = if self.transposed { x.t()? } else { x };
        x.contiguous()?.reshape(single)
    }
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

/// One layer of every agent's network as one (`layer` is the first agent's), every
/// variable's name, group and layout added to `layouts`.
fn stack_layer(
    nets: &[&QNetwork],
    layer: &NormLayer,
    (kind, groups, renorm): (NormKind, usize, RenormConfig),
    conv: Option<Im2col>,
    layouts: &mut Vec<VarLayout>,
) -> Result<PopulationLayer> {
    let (name, is_conv) = (layer.name(), conv.is_some());
    let mut take = |suffix: &str, group: Group| -> Result<Var> {
        let full = format!("{name}.{suffix}");
        let values = stacked(nets, &full)?;
        let layout = VarLayout {
            name: full,
            group,
            transposed: matches!(suffix, "weight" | "v"),
        };
        let (p, units) = (values.dim(0)?, values.dim(1)?);
        // Over feature maps `[P, B, channels, positions]`: a value per channel (batch
        // norm's), or per channel and position (layer norm's `[C, H, W]`).
        let positions = values.elem_count() / (p * units).max(1);
        let shape = match suffix {
            "g" => vec![p, 1, units],
            _ if is_conv => vec![p, 1, units, positions],
            _ => vec![p, 1, units],
        };
        let values = layout.stack(&values, &shape)?;
        layouts.push(layout);
        Var::from_tensor(&values)
    };
    let (weight, gain) = match layer.weight_norm() {
        Some(_) => (take("v", Group::Weight)?, Some(take("g", Group::Gain)?)),
        None => (take("weight", Group::Weight)?, None),
    };
    let bias = layer
        .bias()
        .map(|_| take("bias", Group::Weight))
        .transpose()?;
    let norm = match layer.relu {
        true => stack_norm(&mut take, kind, groups, renorm)?,
        false => PopulationNorm::None,
    };
    Ok(PopulationLayer {
        weight,
        gain,
        bias,
        norm,
        relu: layer.relu,
        conv,
    })
}

/// A hidden layer's normalization of every agent, its variables taken by `take`.
fn stack_norm(
    take: &mut impl FnMut(&str, Group) -> Result<Var>,
    kind: NormKind,
    groups: usize,
    renorm: RenormConfig,
) -> Result<PopulationNorm> {
    Ok(match kind {
        NormKind::LayerNorm => PopulationNorm::Layer {
            gamma: take("ln.gamma", Group::Weight)?,
            beta: take("ln.beta", Group::Weight)?,
        },
        NormKind::BatchNorm | NormKind::BatchRenorm | NormKind::Bbn => PopulationNorm::Batch {
            gamma: take("bn.gamma", Group::Weight)?,
            beta: take("bn.beta", Group::Weight)?,
            running_mean: take("bn.running_mean", Group::Buffer)?,
            running_var: take("bn.running_var", Group::Buffer)?,
            renorm: match kind {
                NormKind::BatchRenorm => Some(PopulationRenorm {
                    config: renorm,
                    updates: take("brn.updates", Group::Buffer)?,
                    open: AtomicBool::new(false),
                }),
                _ => None,
            },
        },
        NormKind::GroupNorm => PopulationNorm::Group {
            gamma: take("gn.gamma", Group::Weight)?,
            beta: take("gn.beta", Group::Weight)?,
            groups,
        },
        NormKind::RmsNorm => PopulationNorm::Rms {
            gamma: take("rms.gamma", Group::Weight)?,
        },
        NormKind::WnMeanOnlyBn => PopulationNorm::MeanOnly {
            running_mean: take("running_mean", Group::Buffer)?,
        },
        _ => PopulationNorm::None,
    })
}

impl PopulationNet {
    /// The networks of `nets` (one per agent, alike but for their values) as one.
    pub fn stack(nets: &[&QNetwork]) -> Result<Self> {
        let Some(first) = nets.first() else {
            candle_core::bail!("a population needs at least one agent");
        };
        let config = first.norm();
        let kind = config.kind;
        let mut layouts = vec![];
        let mut layers = vec![];
        let mut shape = first.obs_shape().to_vec();
        for layer in first.layers() {
            let conv = match layer.kernel() {
                Kernel::Conv2d {
                    c_in, k, stride, ..
                } => {
                    let device = first.store().device();
                    let im2col = Im2col::new(c_in, (shape[1], shape[2]), k, stride, device)?;
                    shape = layer.kernel().output_shape(&shape);
                    Some(im2col)
                }
                Kernel::Linear { .. } => None,
            };
            layers.push(stack_layer(
                nets,
                layer,
                (kind, config.groups, config.renorm()),
                conv,
                &mut layouts,
            )?);
        }
        let settings = Settings {
            agents: nets.len(),
            actions: first.n_actions(),
            data_dependent_init: config.data_dependent_init,
            g_lr_scale: config.g_lr_scale,
            ln_eps: config.ln_eps,
            bn_eps: config.bn_eps,
            bn_momentum: config.bn_momentum,
            svb: kind.uses_svb().then_some(SvbSettings {
                eps: config.svb_eps,
                interval: config.svb_interval,
                bbn_eps: (kind == NormKind::Bbn).then_some(config.bbn_eps),
            }),
        };
        Ok(Self {
            layers,
            layouts,
            settings,
        })
    }

    pub fn agents(&self) -> usize {
        self.settings.agents
    }

    /// Where the population's variables live.
    pub fn device(&self) -> &candle_core::Device {
        self.layers[0].weight.device()
    }

    /// Actions per agent.
    pub fn actions(&self) -> usize {
        self.settings.actions
    }

    /// Every trainable variable, named as in a single network (a weight is stored
    /// transposed: `[P, in, out]` for `[out, in]`; per-unit values `[P, 1, out]`).
    pub fn vars(&self) -> Vec<(&str, &Var)> {
        let vars = self.layers.iter().flat_map(PopulationLayer::trainable);
        self.trainable_layouts()
            .into_iter()
            .map(|l| l.name.as_str())
            .zip(vars)
            .collect()
    }

    /// The optimizer's group of each of [`Self::vars`] (weight norm's gains have a
    /// learning rate of their own).
    /// Every variable with its name, the buffers too (running statistics, counts).
    pub fn vars_and_buffers(&self) -> Vec<(&str, &Var)> {
        let all = self.layers.iter().flat_map(PopulationLayer::all);
        self.layouts
            .iter()
            .map(|l| l.name.as_str())
            .zip(all)
            .collect()
    }

    pub(crate) fn groups(&self) -> Vec<Group> {
        self.trainable_layouts().iter().map(|l| l.group).collect()
    }

    /// Q-values `[P, B, actions]` of observations `[P, B, obs]`: agent `i`'s network on
    /// agent `i`'s rows. With batch statistics, batch norm uses each agent's batch and
    /// updates its running statistics, as a single network's training forward does.
    pub fn forward(&self, x: &Tensor, stats: BnStats) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = self.layer_output(layer, &h, stats)?;
        }
        Ok(h)
    }

    /// One layer's output: the product, the normalization, the bias (after it: only
    /// mean-only BN has both), the ReLU.
    fn layer_output(&self, layer: &PopulationLayer, x: &Tensor, stats: BnStats) -> Result<Tensor> {
        let h = layer.product(x, &layer.effective_weight(false)?)?;
        let mut h = self.normalize(&layer.norm, h, stats)?;
        if let Some(b) = &layer.bias {
            h = h.broadcast_add(b.as_tensor())?;
        }
        if layer.relu {
            h = relu(&h)?;
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
                // Each sample over all its features (a feature map's channels and
                // positions).
                let (mean, var) = match h.rank() {
                    3 => moments(&h, 2)?,
                    _ => {
                        let mean = h.mean_keepdim(3)?.mean_keepdim(2)?;
                        let centered = h.broadcast_sub(&mean)?;
                        (mean, centered.sqr()?.mean_keepdim(3)?.mean_keepdim(2)?)
                    }
                };
                let x_hat = h
                    .broadcast_sub(&mean)?
                    .broadcast_div(&(var + s.ln_eps)?.sqrt()?)?;
                affine(x_hat, gamma, beta)
            }
            PopulationNorm::Batch { .. } => self.batch_normalize(norm, h, stats),
            PopulationNorm::Group {
                gamma,
                beta,
                groups,
            } => {
                // Each sample's contiguous groups of units, or of channels with all
                // their positions.
                let (p, b) = (h.dim(0)?, h.dim(1)?);
                let per_group = h.elem_count() / (p * b * groups);
                let grouped = h.reshape((p, b, *groups, per_group))?;
                let (mean, var) = moments(&grouped, 3)?;
                let x_hat = grouped
                    .broadcast_sub(&mean)?
                    .broadcast_div(&(var + s.ln_eps)?.sqrt()?)?
                    .reshape(h.shape())?;
                affine(x_hat, gamma, beta)
            }
            PopulationNorm::Rms { gamma } => {
                let mean_square = match h.rank() {
                    3 => h.sqr()?.mean_keepdim(2)?,
                    _ => h.sqr()?.mean_keepdim(3)?.mean_keepdim(2)?,
                };
                let rms = (mean_square + s.ln_eps)?.sqrt()?;
                h.broadcast_div(&rms)?.broadcast_mul(gamma.as_tensor())
            }
            PopulationNorm::MeanOnly { running_mean } => {
                let mean = match stats {
                    BnStats::Batch => {
                        let mean = unit_moments(&h)?.0;
                        blend(running_mean, &mean, s.bn_momentum)?;
                        mean
                    }
                    BnStats::Running => running_mean.as_tensor().clone(),
                };
                h.broadcast_sub(&mean)
            }
        }
    }

    /// Batch norm (and batch renormalization) with each agent's statistics.
    fn batch_normalize(&self, norm: &PopulationNorm, h: Tensor, stats: BnStats) -> Result<Tensor> {
        let PopulationNorm::Batch {
            gamma,
            beta,
            running_mean,
            running_var,
            renorm,
        } = norm
        else {
            candle_core::bail!("batch_normalize takes batch norm");
        };
        let s = &self.settings;
        let running = (running_mean, running_var);
        let (mean, var, correction) = match stats {
            BnStats::Batch => {
                let (mean, var) = unit_moments(&h)?;
                let correction = match renorm {
                    Some(brn) if brn.count_update()? => {
                        Some(brn.correction((&mean, &var), running, s.bn_eps)?)
                    }
                    _ => None,
                };
                self.update_running(&h, (&mean, &var), running)?;
                (mean, var, correction)
            }
            BnStats::Running => (
                running_mean.as_tensor().clone(),
                running_var.as_tensor().clone(),
                None,
            ),
        };
        // A single network's order: `(t - mean) * (gamma / std) + beta`; batch
        // renormalization's gain `gamma r` and shift `beta + gamma d`.
        let inv_std = (var + s.bn_eps)?.sqrt()?.recip()?;
        let (gain, shift) = match correction {
            None => (gamma.as_tensor().clone(), beta.as_tensor().clone()),
            Some((r, d)) => (
                r.broadcast_mul(gamma.as_tensor())?,
                d.broadcast_mul(gamma.as_tensor())?
                    .broadcast_add(beta.as_tensor())?,
            ),
        };
        h.broadcast_sub(&mean)?
            .broadcast_mul(&inv_std.broadcast_mul(&gain)?)?
            .broadcast_add(&shift)
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
        // Values per unit: the batch's rows, times the positions of a feature map.
        let n = (h.elem_count() / (h.dim(0)? * h.dim(2)?)) as f64;
        blend(running.0, batch.0, m)?;
        if n > 1.0 {
            blend(running.1, &(batch.1 * (n / (n - 1.0)))?, m)?;
        }
        Ok(())
    }

    /// Weight norm's data-dependent init on each agent's batch `x` `[P, B, obs]`, layer
    /// by layer as a single network's: per unit, with `t = (v/||v||) . x`, `g = 1 /
    /// (std(t) + 1e-6)` and `b = -mean(t) g`; then the layer's output feeds the next.
    pub fn data_dependent_init(&self, x: &Tensor) -> Result<()> {
        let mut h = x.clone();
        for layer in &self.layers {
            if let (Some(g), Some(b)) = (&layer.gain, &layer.bias) {
                let t = layer.product(&h, &layer.effective_weight(true)?.detach())?;
                let (mean, var) = unit_moments(&t)?;
                let scale = (var.sqrt()? + 1e-6)?.recip()?;
                g.set(&scale.reshape(g.shape())?)?;
                let mean_scaled = (mean * &scale)?.reshape(b.shape())?;
                match &layer.norm {
                    // The batch mean is subtracted anyway: the bias starts at 0 and
                    // the running mean at this batch's (scaled) mean.
                    PopulationNorm::MeanOnly { running_mean } => {
                        running_mean.set(&mean_scaled)?;
                        b.set(&mean_scaled.zeros_like()?)?;
                    }
                    _ => b.set(&mean_scaled.neg()?)?,
                }
            }
            h = self.layer_output(layer, &h, BnStats::Running)?;
        }
        Ok(())
    }

    /// The learning-rate factor of weight norm's gains.
    pub(crate) fn g_lr_scale(&self) -> f64 {
        self.settings.g_lr_scale
    }

    /// Whether the agents' networks ask for weight norm's data-dependent init.
    pub(crate) fn wants_data_dependent_init(&self) -> bool {
        self.settings.data_dependent_init && self.layers.iter().any(|l| l.gain.is_some())
    }

    /// `self = other` (a target network's sync, buffers included), every agent alike.
    pub fn copy_from(&self, other: &PopulationNet) -> Result<()> {
        let mine = self.layers.iter().flat_map(PopulationLayer::all);
        for (a, b) in mine.zip(other.layers.iter().flat_map(PopulationLayer::all)) {
            a.set(b.as_tensor())?;
        }
        Ok(())
    }

    /// After update `updates`: SVB's projection (and BBN's bound of the gains) when due,
    /// agent by agent on the host as a single network's (an SVD per agent and hidden
    /// layer, so this step's work grows with P, every `svb_interval` updates only).
    /// Whether it ran.
    pub(crate) fn after_optimizer_step(&self, updates: u64) -> Result<bool> {
        let Some(svb) = self.settings.svb else {
            return Ok(false);
        };
        if !updates.is_multiple_of(svb.interval) {
            return Ok(false);
        }
        for layer in self.layers.iter().filter(|l| l.relu) {
            let w = layer.weight.as_tensor();
            let projected = (0..self.agents())
                .map(|i| crate::nn::svb::project(&w.get(i)?.t()?, svb.eps)?.t())
                .collect::<Result<Vec<_>>>()?;
            layer
                .weight
                .set(&Tensor::stack(&projected, 0)?.contiguous()?)?;
            if let (
                Some(eps),
                PopulationNorm::Batch {
                    gamma, running_var, ..
                },
            ) = (svb.bbn_eps, &layer.norm)
            {
                gamma.set(&self.bounded_gains(gamma, running_var, eps)?)?;
            }
        }
        Ok(true)
    }

    /// BBN's bound of each agent's gains (`nn::svb::bound_bn_gains`), from its running
    /// variance.
    fn bounded_gains(&self, gamma: &Var, running_var: &Var, eps: f64) -> Result<Tensor> {
        let sigma = (running_var.as_tensor() + self.settings.bn_eps)?.sqrt()?;
        let mut bounded = vec![];
        for i in 0..self.agents() {
            let g: Vec<f32> = gamma.as_tensor().get(i)?.flatten_all()?.to_vec1()?;
            let s: Vec<f32> = sigma.get(i)?.flatten_all()?.to_vec1()?;
            bounded.extend(crate::nn::svb::bound_bn_gains(&g, &s, eps));
        }
        Tensor::from_vec(bounded, gamma.shape(), gamma.device())
    }

    /// Polyak averaging, every agent alike: `self = (1 - tau) self + tau other` for
    /// the trainable variables; buffers are copied (a single network's rule).
    pub fn soft_update_from(&self, other: &PopulationNet, tau: f64) -> Result<()> {
        for (mine, theirs) in self.layers.iter().zip(&other.layers) {
            for (a, b) in mine.trainable().into_iter().zip(theirs.trainable()) {
                a.set(&((a.as_tensor() * (1.0 - tau))? + (b.as_tensor() * tau)?)?)?;
            }
            for (a, b) in mine.norm.vars().1.into_iter().zip(theirs.norm.vars().1) {
                a.set(b.as_tensor())?;
            }
        }
        Ok(())
    }

    /// The layout of each of [`Self::vars`] (the trainable variables).
    pub(crate) fn trainable_layouts(&self) -> Vec<&VarLayout> {
        let all = self.layouts.iter();
        all.filter(|l| l.group != Group::Buffer).collect()
    }

    /// Writes agent `i`'s values (buffers included) into the single network `net`, a
    /// network of the kind this population was stacked from.
    pub fn export_agent(&self, i: usize, net: &QNetwork) -> Result<()> {
        let all = self.layers.iter().flat_map(PopulationLayer::all);
        let mut map = HashMap::new();
        for (layout, var) in self.layouts.iter().zip(all) {
            let Some(single) = net.store().get(&layout.name) else {
                candle_core::bail!("the agent's network has no {}", layout.name);
            };
            let values = layout.agent(var.as_tensor(), i, single.var.dims())?;
            map.insert(layout.name.clone(), values);
        }
        net.store().load_map(&map)
    }

    /// An independent copy (a target network).
    pub fn duplicate(&self) -> Result<Self> {
        let copy = |v: &Var| Var::from_tensor(&v.as_tensor().copy()?);
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let norm = l.norm.copied()?;
                Ok(PopulationLayer {
                    weight: copy(&l.weight)?,
                    gain: l.gain.as_ref().map(copy).transpose()?,
                    bias: l.bias.as_ref().map(copy).transpose()?,
                    norm,
                    relu: l.relu,
                    conv: l.conv.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            layouts: self.layouts.clone(),
            settings: self.settings,
        })
    }
}

/// ReLU with the single networks' (and PyTorch's) gradient at 0: none. Candle's own
/// ReLU passes the gradient at exactly 0, which a zero bias and an empty input patch
/// make common (SVB's CNN from its first update).
fn relu(h: &Tensor) -> Result<Tensor> {
    h * h.gt(0.0)?.to_dtype(h.dtype())?
}

/// `running = (1 - momentum) running + momentum batch`: a running statistic's update.
fn blend(running: &Var, batch: &Tensor, momentum: f64) -> Result<()> {
    let kept = (running.as_tensor() * (1.0 - momentum))?;
    running.set(&(kept + (batch.detach() * momentum)?)?)
}

/// Mean and population variance of `h` along `dim`, kept for broadcasting.
fn moments(h: &Tensor, dim: usize) -> Result<(Tensor, Tensor)> {
    let mean = h.mean_keepdim(dim)?;
    let var = h.broadcast_sub(&mean)?.sqr()?.mean_keepdim(dim)?;
    Ok((mean, var))
}

/// Each agent's per-unit moments over its batch (and a feature map's positions): `h`
/// is `[P, B, out]` or `[P, B, out, positions]`.
///
/// Summed in f64, as a single network's fused batch norm sums. (The sums' precision
/// alone does not keep a CNN population on its agents' paths: with f32 sums the test's
/// CNN with weight norm met a kink at update 41, with f64 sums not; see the test.)
fn unit_moments(h: &Tensor) -> Result<(Tensor, Tensor)> {
    let wide = h.to_dtype(DType::F64)?;
    let (mean, var) = match h.rank() {
        3 => moments(&wide, 1)?,
        _ => {
            let mean = wide.mean_keepdim(3)?.mean_keepdim(1)?;
            let centered = wide.broadcast_sub(&mean)?;
            let var = centered.sqr()?.mean_keepdim(3)?.mean_keepdim(1)?;
            (mean, var)
        }
    };
    Ok((mean.to_dtype(DType::F32)?, var.to_dtype(DType::F32)?))
}
