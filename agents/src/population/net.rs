//! A population of Q-networks (MLPs and convolutional ones) as one network: every
//! parameter carries a leading population axis, and each layer is one product over all
//! agents (on the CPU each agent's with the single network's kernel, elsewhere one
//! batched product) and one op after it. A hidden layer's normalization is its
//! method's type (`nn::normalization::Normalization`, in the method's own file) over
//! the agents' stacked variables, with each agent's statistics its own; this file names
//! no method. The agents' networks are stacked from single
//! [`QNetwork`]s, so each starts exactly as it would alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{Result, Tensor, Var};

use super::conv::Im2col;
use crate::kernels::agent_product::{self, AgentConv};
use crate::kernels::bias_relu::{AgentBias, AgentScaledBias};
use crate::kernels::per_agent::{Applied, PerAgent};
use crate::nn::normalization::{copy_var, Identity, Normalization};
use crate::nn::weight::{Weight, WeightParam};
use crate::nn::{BnStats, Layer, LinearMap, NormConfig, QNetwork, Role, WeightNorm};

/// One layer: `[P, out, in]` weights (each agent's in its single network's layout, a
/// convolution's inputs flattened to its patch), or weight norm's `v` in that layout
/// and its gains, with the rule after each step and NaP's initial norms `[P, 1, 1]`
/// (a single network's weight type, `nn::weight`); an optional bias `[P, 1, out]`, the
/// normalization and the ReLU.
pub(super) struct PopulationLayer {
    pub(super) weight: Weight,
    pub(super) bias: Option<Var>,
    /// The method's normalization over the agents' variables, on layers that have one.
    pub(super) norm: Option<Box<dyn Normalization>>,
    pub(super) relu: bool,
    /// A convolution's unfolding; its per-unit values are `[P, 1, out, 1]`, over the
    /// feature maps `[P, B, out, positions]`.
    conv: Option<Im2col>,
    /// A convolution of the observations as one fused op (the first layer's, on the
    /// CPU).
    pub(super) data_conv: Option<AgentConv>,
}

impl PopulationLayer {
    /// Trainable variables, in a fixed order.
    fn trainable(&self) -> Vec<&Var> {
        let mut v = self.weight.trainable();
        v.extend(&self.bias);
        v.extend(self.norm.iter().flat_map(|n| n.vars().0));
        v
    }

    /// Everything a target sync copies: the trainable variables, then the buffers.
    fn all(&self) -> Vec<&Var> {
        let mut v = self.trainable();
        v.extend(self.norm.iter().flat_map(|n| n.vars().1));
        v.extend(&self.weight.rho);
        v
    }

    /// The weight rule's step after optimizer step `updates`, as a single network's
    /// layer takes it (`nn::after_step`), if it is one of `every_step` rules (or of the
    /// interval rules). Whether it ran.
    fn after_step(&self, updates: u64, config: &NormConfig, every_step: bool) -> Result<bool> {
        if self.weight.after.every_step() != every_step {
            return Ok(false);
        }
        let norm = self.norm.as_deref().unwrap_or(&Identity);
        self.weight.after_step(updates, config, norm)
    }

    /// The kernel's product of inputs `x` with weights `w` (`[P, out, in]`): `[P, B, out]`
    /// for a dense layer (feature maps from below flattened channel-major first),
    /// `[P, B, out, positions]` for a convolution.
    /// `fused`: the fused CPU ops, where the layer has them.
    pub(super) fn product(&self, x: &Tensor, w: &Tensor, fused: bool) -> Result<Tensor> {
        let batch = x.dim(1)?;
        match (&self.conv, &self.data_conv) {
            (Some(_), Some(data_conv)) if fused => data_conv.apply(x, w),
            (Some(conv), _) => conv.channels_first(&conv.patches(x)?.matmul(&w.t()?)?, batch),
            (None, _) if fused => agent_product::linear(x, w),
            (None, _) if x.rank() > 3 => x.flatten_from(2)?.matmul(&w.t()?),
            (None, _) => x.matmul(&w.t()?),
        }
    }

    /// Whether this layer is a convolution whose input needs a gradient (it is not the
    /// first): one the fused population ops do not cover.
    pub(super) fn conv_needs_input_gradient(&self, first: bool) -> bool {
        self.conv.is_some() && (!first || self.data_conv.is_none())
    }

    /// The weight the product uses: `w`, or weight norm's from `v` and its gains
    /// (fused: formed once per `version` of the network).
    fn effective_weight(&self, fused: bool, version: u64) -> Result<Tensor> {
        match &self.weight.param {
            WeightParam::Normed(wn) => wn.stacked_weight(fused, version),
            WeightParam::Plain(w) => Ok(w.as_tensor().clone()),
        }
    }

    /// Weight norm's fused op at the network's `version` with its backward, where the
    /// layer is weight-normed (`WeightNorm::fused`): formed inside a captured step
    /// from its own step's variables, as a cached one would be a tensor of the step
    /// the graph was captured at.
    pub(super) fn fused_weight_norm(
        &self,
        version: u64,
    ) -> Result<Option<(&WeightNorm, Arc<Applied>)>> {
        let Some(wn) = self.weight.weight_norm() else {
            return Ok(None);
        };
        let cache = !super::graph::capturing();
        Ok(Some((wn, wn.fused(version, cache)?)))
    }
}

/// Which code runs a population's layers, as [`PopulationNet::path`] chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The fused CPU ops: each agent's single-network loops (`kernels::per_agent`), the
    /// update's backward by hand (`tape`).
    CpuOps,
    /// The fused ops' CUDA kernels (`kernels/cuda`), the update's backward by hand, the
    /// steps captured as CUDA graphs (`graph`).
    DeviceKernels,
    /// The tensor forms: candle's ops on any device, candle's backward; the fused
    /// ops' reference.
    TensorForms,
}

/// What follows a layer's product in its fused form.
pub(super) enum After {
    /// One op: the normalization, weight norm's scale, the bias, the ReLU (those the
    /// layer has).
    Op(Applied),
    /// Nothing: the output is the product.
    Identity,
    /// No fused form here: the tensor forms.
    Unfused,
}

/// The settings every layer shares.
#[derive(Clone)]
struct Settings {
    agents: usize,
    actions: usize,
    /// A distributional head's values `[K]` (its output is `[P, B, actions K]`); empty
    /// for Q-values.
    support: Vec<f32>,
    /// The agents' method: its weight rule's steps, weight norm's settings.
    norm: NormConfig,
    /// The methods' fused CPU ops where they have them (on the CPU); off, the tensor
    /// forms a device runs.
    fused: bool,
}

/// P agents' Q-networks, of any method (each method's stacked form is in its `nn/`
/// file, found through `nn::registry`).
pub struct PopulationNet {
    layers: Vec<PopulationLayer>,
    /// Every variable's (buffers too) single-network name, role and layout, in the
    /// order of the layers' [`PopulationLayer::all`]; the trainable ones, in order, are
    /// those of [`Self::vars`].
    layouts: Vec<VarLayout>,
    settings: Settings,
    /// Moved by every change of the variables (the optimizer's steps too, through the
    /// store it trains: [`Self::version_counter`]); keys the layers' derived weights.
    version: Arc<AtomicU64>,
}

/// How a single network's variable is laid out in the population's: a weight
/// `[out, in...]` becomes `[P, out, in]` (its inputs flattened: the fused products are
/// the single network's, and a device's products read it transposed without a copy);
/// per-unit values gain axes of size one for broadcasting.
#[derive(Clone)]
pub(crate) struct VarLayout {
    pub(crate) name: String,
    /// The variable's optimizer role (weight norm's gains have a learning rate of their own);
    /// `Buffer` for what is never trained.
    role: Role,
    /// A weight: its inputs flattened.
    weight: bool,
}

impl VarLayout {
    /// Every agent's values `[P, single shape...]` in the population's layout `shape`.
    pub(crate) fn stack(&self, values: &Tensor, shape: &[usize]) -> Result<Tensor> {
        match self.weight {
            true => values.flatten_from(2)?.contiguous(),
            false => values.reshape(shape),
        }
    }

    /// Agent `i`'s values of a population variable `values`, in the single network's
    /// shape `single`.
    pub(crate) fn agent(&self, values: &Tensor, i: usize, single: &[usize]) -> Result<Tensor> {
        values.get(i)?.contiguous()?.reshape(single)
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
/// variable's name, role and layout added to `layouts`.
fn stack_layer(
    nets: &[&QNetwork],
    layer: &Layer,
    config: &NormConfig,
    (conv, data_conv): (Option<Im2col>, Option<AgentConv>),
    layouts: &mut Vec<VarLayout>,
) -> Result<PopulationLayer> {
    let (name, is_conv) = (layer.name(), conv.is_some());
    let mut take = |suffix: &str, role: Role| -> Result<Var> {
        let full = format!("{name}.{suffix}");
        let values = stacked(nets, &full)?;
        let layout = VarLayout {
            name: full,
            role,
            weight: matches!(suffix, "weight" | "v"),
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
    let (var, gain) = match layer.weight_norm() {
        Some(_) => (take("v", Role::Weight)?, Some(take("g", Role::Gain)?)),
        None => (take("weight", Role::Weight)?, None),
    };
    let bias = layer
        .bias()
        .map(|_| take("bias", Role::Weight))
        .transpose()?;
    let norm = match layer.relu {
        true => config.stacked_hidden(&mut take)?,
        false => config.stacked_head(&mut take)?,
    };
    // A weight-normed layer with a bias and no normalization after it scales its
    // output, as a single network's does.
    let scaled = bias.is_some() && norm.is_none();
    let param = match gain {
        Some(g) => WeightParam::Normed(WeightNorm::stacked(var, g, scaled)?),
        None => WeightParam::Plain(var),
    };
    let mut weight = Weight::new(param, layer.weight.after, 1);
    weight.rho = (layer.weight.rho.as_ref())
        .map(|_| take("rho", Role::Buffer))
        .transpose()?;
    Ok(PopulationLayer {
        weight,
        bias,
        norm,
        relu: layer.relu,
        conv,
        data_conv,
    })
}

impl PopulationNet {
    /// The networks of `nets` (one per agent, alike but for their values) as one.
    pub fn stack(nets: &[&QNetwork]) -> Result<Self> {
        let Some(first) = nets.first() else {
            candle_core::bail!("a population needs at least one agent");
        };
        let config = first.norm();
        let mut layouts = vec![];
        let mut layers = vec![];
        let mut shape = first.obs_shape().to_vec();
        for (i, layer) in first.layers().enumerate() {
            let conv = match layer.kernel() {
                LinearMap::Conv2d {
                    c_in, k, stride, ..
                } => {
                    let (h, w) = (shape[1], shape[2]);
                    let im2col = Im2col::new(c_in, (h, w), k, stride, first.store().device())?;
                    shape = layer.kernel().output_shape(&shape);
                    // The observations need no gradient: the first layer's convolution
                    // is the fused data convolution's.
                    let data = AgentConv {
                        c_in,
                        h,
                        w,
                        k,
                        stride,
                    };
                    (Some(im2col), (i == 0).then_some(data))
                }
                LinearMap::Linear { .. } => (None, None),
            };
            layers.push(stack_layer(nets, layer, config, conv, &mut layouts)?);
        }
        let settings = Settings {
            agents: nets.len(),
            actions: first.n_actions(),
            support: first.support_values().to_vec(),
            norm: config.clone(),
            fused: true,
        };
        Ok(Self {
            layers,
            layouts,
            settings,
            version: Arc::default(),
        })
    }

    pub fn agents(&self) -> usize {
        self.settings.agents
    }

    /// Where the population's variables live.
    pub fn device(&self) -> &candle_core::Device {
        self.layers[0].weight.var().device()
    }

    /// Actions per agent.
    pub fn actions(&self) -> usize {
        self.settings.actions
    }

    /// A distributional head's values `[K]`: the head's output is `[P, B, actions K]`,
    /// each action's logits over them. Empty for a head of Q-values.
    pub fn support(&self) -> &[f32] {
        &self.settings.support
    }

    /// Every trainable variable, named as in a single network (a weight `[out, in...]`
    /// is stored `[P, out, in]`; per-unit values `[P, 1, out]`).
    ///
    /// Handing them out marks the weights derived from them stale (whoever holds them
    /// may change them).
    pub fn vars(&self) -> Vec<(&str, &Var)> {
        self.changed();
        let vars = self.layers.iter().flat_map(PopulationLayer::trainable);
        self.trainable_layouts()
            .into_iter()
            .map(|l| l.name.as_str())
            .zip(vars)
            .collect()
    }

    /// Every variable with its name, the buffers too (running statistics, counts).
    pub fn vars_and_buffers(&self) -> Vec<(&str, &Var)> {
        self.changed();
        let all = self.layers.iter().flat_map(PopulationLayer::all);
        self.layouts
            .iter()
            .map(|l| l.name.as_str())
            .zip(all)
            .collect()
    }

    /// The optimizer role of each of [`Self::vars`] (weight norm's gains have a
    /// learning rate of their own).
    pub(crate) fn roles(&self) -> Vec<Role> {
        self.trainable_layouts().iter().map(|l| l.role).collect()
    }

    /// Q-values `[P, B, actions]` of observations `[P, B, obs]`: agent `i`'s network on
    /// agent `i`'s rows. With batch statistics, batch norm uses each agent's batch and
    /// updates its running statistics, as a single network's training forward does.
    pub fn forward(&self, x: &Tensor, stats: BnStats) -> Result<Tensor> {
        self.forward_with(x, stats, false)
    }

    /// [`Self::forward`] through candle's graph, for candle's backward: on a device the
    /// tensor forms, whose every op is a node of the graph (a device's fused ops are
    /// not; they run only under the explicit backward, [`Self::forward_with_tape`]).
    pub(crate) fn forward_in_graph(&self, x: &Tensor, stats: BnStats) -> Result<Tensor> {
        self.forward_with(x, stats, true)
    }

    fn forward_with(&self, x: &Tensor, stats: BnStats, graph: bool) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = self.layer_output(layer, &h, stats, graph)?;
        }
        Ok(h)
    }

    /// One layer's output: the product, the normalization, the bias (after it: only
    /// mean-only BN has both), the ReLU; through candle's graph with `graph`.
    fn layer_output(
        &self,
        layer: &PopulationLayer,
        x: &Tensor,
        stats: BnStats,
        graph: bool,
    ) -> Result<Tensor> {
        let fused = self.path(graph) != Path::TensorForms;
        let w = layer.effective_weight(fused, self.version())?;
        let h = layer.product(x, &w, fused)?;
        if fused {
            match self.after_product(layer, &h, stats)? {
                After::Op(applied) => return Ok(applied.out),
                After::Identity => return Ok(h),
                After::Unfused => {}
            }
        }
        let mut h = match &layer.norm {
            Some(norm) => norm.normalize(h, stats)?,
            None => h,
        };
        if let Some(wn) = layer.weight.weight_norm() {
            h = wn.scale_output(h)?;
        }
        if let Some(b) = &layer.bias {
            h = h.broadcast_add(b.as_tensor())?;
        }
        if layer.relu {
            h = relu(&h)?;
        }
        Ok(h)
    }

    /// The fused op after `layer`'s product `h` (on the CPU).
    pub(super) fn after_product(
        &self,
        layer: &PopulationLayer,
        h: &Tensor,
        stats: BnStats,
    ) -> Result<After> {
        let agents = self.settings.agents;
        let norm = layer.norm.as_ref().filter(|n| !n.passes_through());
        if let Some(norm) = norm {
            let applied = match layer.relu {
                true => norm.fused_forward(h, stats, layer.bias.as_ref())?,
                false => None,
            };
            return Ok(applied.map_or(After::Unfused, After::Op));
        }
        let scale = layer.fused_weight_norm(self.version())?;
        match (&layer.bias, scale.filter(|(wn, _)| wn.scaled())) {
            (Some(b), Some((_, s))) => {
                let kernel = AgentScaledBias::of(h.shape(), layer.relu)?;
                let op = PerAgent { kernel, agents };
                Ok(After::Op(op.apply2(h, &s.out, b.as_tensor())?))
            }
            (Some(b), None) => {
                // Bias and ReLU in one op with a one-pass backward, per agent.
                let kernel = AgentBias::of(h.shape(), layer.relu)?;
                let op = PerAgent { kernel, agents };
                Ok(After::Op(op.apply1(h, b.as_tensor())?))
            }
            (None, _) if !layer.relu => Ok(After::Identity),
            (None, _) => Ok(After::Unfused),
        }
    }

    /// Weight norm's data-dependent init on each agent's batch `x` `[P, B, obs]`, layer
    /// by layer as a single network's: per unit, with `t = (v/||v||) . x`, `g = 1 /
    /// (std(t) + 1e-6)` and `b = -mean(t) g`; then the layer's output feeds the next.
    pub fn data_dependent_init(&self, x: &Tensor) -> Result<()> {
        let mut h = x.clone();
        for layer in &self.layers {
            // A layer whose normalization has a shift of its own (layer norm's) has no
            // bias: only its gains are set.
            if let Some(wn) = layer.weight.weight_norm() {
                let fused = self.path(false) != Path::TensorForms;
                let direction = wn.direction()?.detach();
                let mean_scaled = wn.initialize(&layer.product(&h, &direction, fused)?)?;
                if let Some(b) = &layer.bias {
                    b.set(&match &layer.norm {
                        Some(norm) => norm.initial_bias(&mean_scaled)?,
                        None => mean_scaled.neg()?,
                    })?;
                }
                self.changed();
            }
            h = self.layer_output(layer, &h, BnStats::Running, false)?;
        }
        Ok(())
    }

    /// The learning-rate factor of weight norm's gains.
    pub(crate) fn g_lr_scale(&self) -> f64 {
        self.settings.norm.g_lr_scale
    }

    /// Whether the agents' networks ask for weight norm's data-dependent init.
    pub(crate) fn wants_data_dependent_init(&self) -> bool {
        self.settings.norm.data_dependent_init
            && self.layers.iter().any(|l| l.weight.weight_norm().is_some())
    }

    /// `self = other` (a target network's sync, buffers included), every agent alike.
    pub fn copy_from(&self, other: &PopulationNet) -> Result<()> {
        self.changed();
        let mine = self.layers.iter().flat_map(PopulationLayer::all);
        for (a, b) in mine.zip(other.layers.iter().flat_map(PopulationLayer::all)) {
            a.set(b.as_tensor())?;
        }
        Ok(())
    }

    /// Each layer's every-step projection after an optimizer step (projected weight
    /// norm's and hyperspherical unit rows, NaP's initial norms): tensor ops on the
    /// device, inside the update (a CUDA graph replays them). Whether any ran.
    pub(crate) fn project(&self) -> Result<bool> {
        let mut ran = false;
        for layer in &self.layers {
            // The every-step rules read no step count.
            ran |= layer.after_step(0, &self.settings.norm, true)?;
        }
        if ran {
            self.changed();
        }
        Ok(ran)
    }

    /// After update `updates`: each hidden layer's method does its interval work on the
    /// layer when due (SVB's projection and BBN's bound of the gains, on the host).
    /// Whether any ran.
    pub(crate) fn after_optimizer_step(&self, updates: u64) -> Result<bool> {
        let mut ran = false;
        for layer in &self.layers {
            ran |= layer.after_step(updates, &self.settings.norm, false)?;
        }
        if ran {
            self.changed();
        }
        Ok(ran)
    }

    /// Polyak averaging, every agent alike: `self = (1 - tau) self + tau other` for
    /// the trainable variables; buffers are copied (a single network's rule).
    pub fn soft_update_from(&self, other: &PopulationNet, tau: f64) -> Result<()> {
        self.changed();
        for (mine, theirs) in self.layers.iter().zip(&other.layers) {
            for (a, b) in mine.trainable().into_iter().zip(theirs.trainable()) {
                a.set(&((a.as_tensor() * (1.0 - tau))? + (b.as_tensor() * tau)?)?)?;
            }
            let buffers = |l: &PopulationLayer| -> Vec<Var> {
                l.norm.iter().flat_map(|n| n.vars().1).cloned().collect()
            };
            for (a, b) in buffers(mine).iter().zip(buffers(theirs)) {
                a.set(b.as_tensor())?;
            }
        }
        Ok(())
    }

    /// The layout of each of [`Self::vars`] (the trainable variables).
    pub(crate) fn trainable_layouts(&self) -> Vec<&VarLayout> {
        let all = self.layouts.iter();
        all.filter(|l| l.role != Role::Buffer).collect()
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

    /// The same network through the tensor forms a device runs, on the CPU too (the
    /// fused CPU ops' reference, and the device path tested without a device).
    pub fn use_tensor_forms(&mut self) {
        self.settings.fused = false;
    }

    pub(crate) fn is_fused(&self) -> bool {
        self.settings.fused
    }

    /// The variables' version: moved by every change of them.
    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Marks the weights derived from the variables stale (after a change of them).
    pub(crate) fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The counter the optimizer's store moves with every step.
    pub(crate) fn version_counter(&self) -> Arc<AtomicU64> {
        self.version.clone()
    }

    /// Which code runs this network's layers on its device: the one place that
    /// chooses (the module's doc, "Paths"). The fused ops on the CPU unless the tensor
    /// forms were asked for ([`Self::use_tensor_forms`]); on a CUDA device the fused
    /// ops' kernels where every layer has them ([`Self::cuda_fusable`]), else the
    /// tensor forms. `graph`: the forward is for candle's backward, where a device's
    /// kernels make no nodes, so they give way to the tensor forms there (the CPU's
    /// ops have their nodes). A layer on the fused path whose method has no fused op
    /// for it takes its tensor form ([`After::Unfused`]), and an update with such a
    /// layer takes candle's backward (`tape`).
    pub fn path(&self, graph: bool) -> Path {
        let device = self.device();
        match self.settings.fused {
            true if device.is_cpu() => Path::CpuOps,
            true if device.is_cuda() && self.cuda_fusable() && !graph => Path::DeviceKernels,
            _ => Path::TensorForms,
        }
    }

    /// Whether a training step's work on the device is the same at every step (see
    /// `Normalization::step_invariant`), as a CUDA graph's replay needs.
    pub(crate) fn step_invariant(&self) -> bool {
        let norms = self.layers.iter().filter_map(|l| l.norm.as_ref());
        norms.into_iter().all(|n| n.step_invariant())
    }

    /// Whether this network's steps run the fused ops' kernels on its device (a CUDA
    /// device; see `kernels/cuda`), rather than the tensor forms.
    pub fn runs_device_kernels(&self) -> bool {
        self.path(false) == Path::DeviceKernels
    }

    /// Whether every layer has its fused ops' CUDA kernels: no convolution after the
    /// first layer, and a normalization only where it has a kernel and a ReLU ends the
    /// layer (a bias and a ReLU, or a bias alone, otherwise). Where a layer's method
    /// turns out to have no device form after all, the update takes the tensor forms
    /// (see [`Self::forward_in_graph`]): slower, not wrong.
    pub(crate) fn cuda_fusable(&self) -> bool {
        let layer_fusable = |(i, l): (usize, &PopulationLayer)| {
            let after = match l.norm.as_ref().filter(|n| !n.passes_through()) {
                Some(n) => n.has_cuda_kernel() && l.relu,
                None => l.bias.is_some() || !l.relu,
            };
            after && !l.conv_needs_input_gradient(i == 0)
        };
        cfg!(feature = "cuda") && self.layers.iter().enumerate().all(layer_fusable)
    }

    pub(super) fn layers(&self) -> &[PopulationLayer] {
        &self.layers
    }

    /// An independent copy (a target network).
    pub fn duplicate(&self) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let norm = l.norm.as_ref().map(|n| n.copied()).transpose()?;
                Ok(PopulationLayer {
                    weight: l.weight.copied()?,
                    bias: l.bias.as_ref().map(copy_var).transpose()?,
                    norm,
                    relu: l.relu,
                    conv: l.conv.clone(),
                    data_conv: l.data_conv,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            layouts: self.layouts.clone(),
            settings: self.settings.clone(),
            version: Arc::default(),
        })
    }
}

/// ReLU with the single networks' (and PyTorch's) gradient at 0: none. Candle's own
/// ReLU passes the gradient at exactly 0, which a zero bias and an empty input patch
/// make common (SVB's CNN from its first update).
fn relu(h: &Tensor) -> Result<Tensor> {
    h * h.gt(0.0)?.to_dtype(h.dtype())?
}
