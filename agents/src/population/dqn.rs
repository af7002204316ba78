//! One DQN update for a whole population, each step one operation over all agents: TD
//! targets, the TD loss (each agent's mean over its batch, summed over agents, so that
//! each agent's gradient is its own) and its gradient (on the CPU by the fused ops'
//! explicit backward, elsewhere candle's), gradient clipping per agent, and the single
//! agents' optimizer over the stacked variables (elementwise, so each agent's moments
//! are its own). Agents train exactly as they would alone.

mod distribution;

use std::borrow::Borrow;
use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var, D};
use rand::Rng;

use super::count::read_rows_to_host;
#[cfg(any(test, feature = "test-support"))]
use super::count::read_to_host;
use super::graph::StepGraph;
use super::inputs::{self, Inputs, Stacked};
use super::{DeviceFrames, PopulationNet};
use crate::dqn::distribution_targets::SupportTensors;
use crate::dqn::td::{self, TargetSync};
use crate::dqn::{epsilon_greedy, Dqn, DqnConfig, Loss};
use crate::dqn::{population_mean_taken, population_td, TdOutput};
use crate::dqn::{population_td_loss, population_td_loss_tensor_ops};
use crate::nn::{BnStats, ParamStore};
use crate::optim::{Optimizer, OptimizerConfig};
use crate::replay::Batch;

pub struct PopulationDqn {
    online: PopulationNet,
    target: PopulationNet,
    config: DqnConfig,
    /// Per-agent clipping happens before the optimizer, which then clips nothing: the
    /// single agents' fused optimizer, over the population's variables (its arithmetic
    /// is elementwise, so each agent's values move as they would alone).
    optimizer: Optimizer,
    max_grad_norm: f64,
    /// Each agent's discount `[P, 1]` where they differ (a per-agent hyperparameter);
    /// `None` when all share `config.gamma`.
    gammas: Option<Tensor>,
    /// Each agent's learning rate over the optimizer's (agent 0's), where they differ;
    /// `None` when all share one.
    lr_ratios: Option<Vec<f64>>,
    updates: u64,
    /// The first update's data-dependent init and target sync are done.
    initialized: bool,
    /// What each step reads from the host: fixed buffers on a device whose steps a
    /// CUDA graph may replay, new tensors elsewhere.
    inputs: Inputs,
    /// On a device, what every step reads that is fixed for the run.
    constants: Option<DeviceConstants>,
    /// The fixed outputs of a device's steps: the update's metrics `[3, P]` and the
    /// acting forward's actions `[P, 1]`.
    outputs: [Option<Tensor>; 2],
    /// The update's and the acting forward's CUDA graphs.
    graphs: [StepGraph; 2],
    /// The frames the update's graph gathers from.
    frames_id: Option<candle_core::TensorId>,
    /// A distributional loss's support, as constants on the device.
    support_tensors: Option<SupportTensors>,
}

/// A device step's fixed inputs, made once (an upload inside a step could not be
/// replayed): every agent's discount `[P, 1]` and, where they differ, learning rate
/// over the base one (f64, `[P]`).
struct DeviceConstants {
    gammas: Tensor,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    lr_ratios: Option<Tensor>,
}

/// The outputs the targets come from: the next observations' `[P, B, ..]` under the
/// target network (the online one without a target network), and under Double DQN the
/// online network's, whose (expected) values choose the next action.
struct NextOutputs {
    next: Tensor,
    chooser: Option<Tensor>,
}

/// Which of [`PopulationDqn::graphs`] and [`PopulationDqn::outputs`].
const UPDATE: usize = 0;
const ACTING: usize = 1;

/// How an update's optimizer step runs: on the host's fused loop or the tensor ops, or
/// (CUDA) the fused kernels with these fixed coefficients, its host half done.
enum Plan {
    Host,
    #[cfg(feature = "cuda")]
    Device(crate::kernels::cuda::optimizer::StepCoefficients),
}

impl PopulationDqn {
    /// Trains `online` (its target starts as a copy, as a single agent's does at its
    /// first update).
    pub fn new(
        online: PopulationNet,
        config: DqnConfig,
        optimizer: OptimizerConfig,
    ) -> Result<Self> {
        let target = online.duplicate()?;
        Self::with_target(online, target, config, optimizer)
    }

    /// The regression loss: [`Self::with_target`] refuses a distributional one.
    fn regression(&self) -> Loss {
        self.config.loss.regression().unwrap_or(Loss::Huber)
    }

    fn with_target(
        online: PopulationNet,
        target: PopulationNet,
        config: DqnConfig,
        optimizer: OptimizerConfig,
    ) -> Result<Self> {
        let support_tensors = match config.loss.is_distributional() {
            true => {
                let (loss, values) = (config.loss, online.support());
                Some(SupportTensors::new(
                    loss,
                    &config.support,
                    values,
                    online.device(),
                )?)
            }
            false => None,
        };
        let max_grad_norm = optimizer.max_grad_norm;
        let unclipped = OptimizerConfig {
            max_grad_norm: 0.0,
            ..optimizer
        };
        let optimizer = Optimizer::new(&trainables(&online), &unclipped, online.g_lr_scale());
        Ok(Self {
            online,
            target,
            config,
            optimizer,
            max_grad_norm,
            gammas: None,
            lr_ratios: None,
            updates: 0,
            initialized: false,
            inputs: Inputs::new(false),
            constants: None,
            outputs: [None, None],
            graphs: [
                StepGraph::new("update", false),
                StepGraph::new("acting forward", false),
            ],
            frames_id: None,
            support_tensors,
        })
    }

    /// The same population with its optimizer on the tensor path, the one an
    /// accelerator takes, whatever the device: what a GPU runs, tested on the CPU.
    /// Only before the first update (the fused loop's state is not carried over).
    pub fn with_tensor_optimizer(mut self) -> Result<Self> {
        if self.optimizer.steps() > 0 {
            candle_core::bail!("the optimizer's path is chosen before the first update");
        }
        let (config, scale) = (self.optimizer.config().clone(), self.online.g_lr_scale());
        self.optimizer = Optimizer::reference(&trainables(&self.online), &config, scale)?;
        Ok(self)
    }

    /// The same population through the tensor forms a device runs, on the CPU too: the
    /// networks' methods, the TD loss and the optimizer (the fused CPU ops' reference).
    /// Only before the first update.
    pub fn with_tensor_forms(mut self) -> Result<Self> {
        self = self.with_tensor_optimizer()?;
        self.online.use_tensor_forms();
        self.target.use_tensor_forms();
        Ok(self)
    }

    /// On a CUDA device, whether steps may be captured as CUDA graphs and replayed (the
    /// default there; `run.cuda_graphs`): their inputs then go into fixed buffers, and a
    /// step that cannot be captured, or whose replay differs from its eager run, stays
    /// eager (said once). Elsewhere nothing changes. Only before the first step.
    pub fn with_cuda_graphs(mut self, enabled: bool) -> Self {
        let on = enabled && self.device().is_cuda();
        self.inputs = Inputs::new(on);
        self.graphs = [
            StepGraph::new("update", on),
            StepGraph::new("acting forward", on),
        ];
        self
    }

    /// Whether steps on fixed buffers are forced (as a CUDA graph's), whatever the
    /// device: what a graph's replay reads, tested on the CPU.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_fixed_inputs(mut self) -> Self {
        self.inputs = Inputs::new(true);
        self
    }

    /// The storage addresses (on the CPU) of the fixed inputs and outputs: a test's
    /// view of what a captured graph relies on.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn fixed_buffer_addresses(&self) -> Vec<usize> {
        let mut all = self.inputs.addresses();
        all.extend(self.outputs.iter().flatten().map(inputs::cpu_address));
        all
    }

    /// Every tensor this population keeps from one update to the next, by name: the
    /// networks' variables and buffers, the optimizer's state, the per-agent
    /// hyperparameters. None may hold a graph (`agents/tests/no_graph_kept.rs`).
    pub fn held_tensors(&self) -> Vec<(String, Tensor)> {
        let mut held = Vec::new();
        for (net, which) in [(&self.online, "online"), (&self.target, "target")] {
            for (name, var) in net.vars_and_buffers() {
                held.push((format!("{which}.{name}"), var.as_tensor().clone()));
            }
        }
        held.extend(self.optimizer.held_tensors());
        held.extend(
            self.gammas
                .iter()
                .map(|t| ("gammas".to_string(), t.clone())),
        );
        held
    }

    /// The single agents `agents` as one population, each exactly where it stands:
    /// networks (buffers included), optimizer moments, update count. They must be alike
    /// but for their values, their discount `gamma` and their learning rate (per-agent
    /// tensors).
    pub fn from_agents(agents: &[&Dqn]) -> Result<Self> {
        Self::check_alike(agents)?;
        let first = &agents[0];
        let online = PopulationNet::stack(&agents.iter().map(|a| a.online()).collect::<Vec<_>>())?;
        let target = PopulationNet::stack(&agents.iter().map(|a| a.target()).collect::<Vec<_>>())?;
        let optimizer = first.optimizer().config().clone();
        let mut population = Self::with_target(online, target, first.config().clone(), optimizer)?;
        let states = agents
            .iter()
            .map(|a| a.optimizer().state_tensors())
            .collect::<Result<Vec<_>>>()?;
        population.load_optimizer_states(&states)?;
        population.updates = first.updates();
        population.initialized = first.is_initialized();
        let p = agents.len();
        let gammas: Vec<f32> = agents.iter().map(|a| a.config().gamma as f32).collect();
        if gammas.iter().any(|&g| g != gammas[0]) {
            population.gammas = Some(Tensor::from_vec(gammas, (p, 1), &population.device())?);
        }
        let lr = |a: &&Dqn| a.optimizer().config().lr;
        let ratios: Vec<f64> = agents.iter().map(|a| lr(a) / lr(first)).collect();
        if ratios.iter().any(|&r| r != 1.0) {
            population.lr_ratios = Some(ratios);
        }
        Ok(population)
    }

    /// That `agents` may train as one population: at least one, alike but for their
    /// values, gamma and learning rate, at the same update.
    pub(crate) fn check_alike(agents: &[&Dqn]) -> Result<()> {
        let Some(first) = agents.first() else {
            candle_core::bail!("a population needs at least one agent");
        };
        let same = |a: &&Dqn| {
            let config = DqnConfig {
                gamma: first.config().gamma,
                ..a.config().clone()
            };
            let optimizer = OptimizerConfig {
                lr: first.optimizer().config().lr,
                ..a.optimizer().config().clone()
            };
            config == *first.config()
                && optimizer == *first.optimizer().config()
                && (a.updates(), a.is_initialized()) == (first.updates(), first.is_initialized())
        };
        if !agents.iter().all(same) {
            candle_core::bail!(
                "a population's agents differ in more than their values, gamma and learning rate"
            );
        }
        Ok(())
    }

    /// The agents' optimizer states (as [`crate::optim::Optimizer::state_tensors`]
    /// names them) stacked into the population's optimizer.
    fn load_optimizer_states(&mut self, states: &[HashMap<String, Tensor>]) -> Result<()> {
        let mut map = HashMap::new();
        let vars = self.online.vars();
        for (layout, (_, var)) in self.online.trainable_layouts().into_iter().zip(vars) {
            for slot in ["state0", "state1"] {
                let key = format!("{}.{slot}", layout.name);
                let values = states
                    .iter()
                    .map(|s| match s.get(&key) {
                        Some(t) => Ok(t.to_device(var.device())?),
                        None => candle_core::bail!("an agent's optimizer lacks {key}"),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let stacked = Tensor::stack(&values, 0)?;
                map.insert(key, layout.stack(&stacked, var.dims())?);
            }
        }
        let steps = |s: &HashMap<String, Tensor>| s.get("steps").map(|t| t.to_vec1::<f64>());
        let first = steps(&states[0]).transpose()?;
        for s in states {
            if steps(s).transpose()? != first {
                candle_core::bail!("a population's agents have taken different optimizer steps");
            }
        }
        if let Some(first) = states[0].get("steps") {
            map.insert("steps".into(), first.clone());
        }
        self.optimizer.load_state_tensors(&map)
    }

    /// Writes agent `i` where it stands into the single agent `agent` (one of those the
    /// population was made from): both networks, the optimizer's moments and step
    /// count, the update count. The single agent then evaluates, reports and
    /// checkpoints exactly as the population's agent `i`.
    pub fn export_agent(&self, i: usize, agent: &mut Dqn) -> Result<()> {
        self.export_agents(&mut [(i, agent)])
    }

    /// [`Self::export_agent`] for several agents, `(i, agent)` each: the optimizer's
    /// state is read once for all of them (per agent, it was the whole population's
    /// state copied P times: 12 s for an export of 256 MinAtar agents).
    pub fn export_agents(&self, agents: &mut [(usize, &mut Dqn)]) -> Result<()> {
        let state = self.optimizer.state_tensors()?;
        for (i, agent) in agents.iter_mut() {
            let i = *i;
            self.online.export_agent(i, agent.online())?;
            self.target.export_agent(i, agent.target())?;
            let mut map = HashMap::new();
            let single = agent.online().store();
            for layout in self.online.trainable_layouts() {
                let Some(param) = single.get(&layout.name) else {
                    candle_core::bail!("the agent's network has no {}", layout.name);
                };
                for slot in ["state0", "state1"] {
                    let key = format!("{}.{slot}", layout.name);
                    let Some(values) = state.get(&key) else {
                        candle_core::bail!("the population's optimizer lacks {key}");
                    };
                    map.insert(key, layout.agent(values, i, param.var.dims())?);
                }
            }
            if let Some(steps) = state.get("steps") {
                map.insert("steps".into(), steps.clone());
            }
            agent.optimizer_mut().load_state_tensors(&map)?;
            agent.restore_counters(self.updates, self.initialized);
        }
        Ok(())
    }

    pub fn online(&self) -> &PopulationNet {
        &self.online
    }

    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Each agent's greedy action on its own observation (`obs`: one row per agent),
    /// with the acting statistics: one forward for all agents and one read of their P
    /// actions (on a GPU, the step's only wait for the device; the forward is one
    /// graph's launch once captured).
    pub fn greedy_actions(&mut self, obs: &[f32]) -> Result<Vec<u32>> {
        let (p, device) = (self.online.agents(), self.device());
        let (x, remade) = self.inputs.acting(obs, p, &device)?;
        let mode = self.config.acting_bn_mode;
        if self.distributional() && self.host_distributions() {
            return self.distribution_greedy(&x);
        }
        if !self.inputs.fixed() {
            let q = self.q_of(self.online.forward(&x, mode)?)?;
            // `[P, 1]`, read as rows: a flatten would be one more operation.
            let rows = read_rows_to_host::<u32>(&q.argmax(D::Minus1)?)?;
            return Ok(rows.into_iter().flatten().collect());
        }
        if remade {
            self.graphs[ACTING].recapture();
        }
        let out = inputs::output(&mut self.outputs[ACTING], (&[p, 1], DType::U32), &device)?;
        let mut graph = self.take_graph(ACTING);
        let region = || -> Result<()> {
            let q = self.q_of(self.online.forward(&x, mode)?)?;
            out.slice_set(&q.argmax(D::Minus1)?, 0, 0)
        };
        let ran = self.run_graph(&mut graph, &out, &region);
        self.graphs[ACTING] = graph;
        ran?;
        let rows = read_rows_to_host::<u32>(&out)?;
        Ok(rows.into_iter().flatten().collect())
    }

    /// Graph `which`, taken out while a step borrows the population (put it back).
    fn take_graph(&mut self, which: usize) -> StepGraph {
        std::mem::replace(&mut self.graphs[which], StepGraph::new("", false))
    }

    /// Runs `region`, a step's device work writing `out` and the population's held
    /// tensors, through `graph` (eagerly until captured; see `graph.rs`).
    fn run_graph(
        &self,
        graph: &mut StepGraph,
        out: &Tensor,
        region: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let ready = self.capturable();
        let mut held: Vec<Tensor> = match ready && !graph.replays() {
            true => self.held_tensors().into_iter().map(|(_, t)| t).collect(),
            false => Vec::new(),
        };
        held.push(out.clone());
        graph.run(&self.device(), ready, &held, region)
    }

    /// Whether a step may be captured now: fixed inputs, the device kernels' explicit
    /// step, nothing that changes on the host from step to step.
    fn capturable(&self) -> bool {
        let kernels = self.online.runs_device_kernels() && !self.config.joint_forward;
        let fixed = self.online.step_invariant() && self.target.step_invariant();
        self.inputs.fixed() && self.initialized && kernels && fixed
    }

    /// Epsilon-greedy for every agent with its own epsilon and generator, each drawing
    /// as a single agent's `act` does (one uniform draw decides, a second picks the
    /// random action).
    pub fn act<R: Rng>(
        &mut self,
        obs: &[f32],
        epsilons: &[f64],
        rngs: &mut [R],
    ) -> Result<Vec<usize>> {
        let greedy = self.greedy_actions(obs)?;
        let n = self.online.actions();
        let choices = rngs.iter_mut().zip(epsilons).zip(greedy);
        choices
            .map(|((rng, &epsilon), g)| epsilon_greedy(rng, epsilon, n, || Ok(g as usize)))
            .collect()
    }

    /// One update of every agent on its own batch (`batches[i]` is agent `i`'s, all of
    /// one size): each agent's TD loss, mean Q of the taken actions and gradient norm
    /// (before clipping), still on the device.
    pub fn update<B: Borrow<Batch>>(&mut self, batches: &[B]) -> Result<PopulationInfo> {
        self.update_with_frames(batches, None)
    }

    /// [`Self::update`] with the observations gathered from `frames` (the members'
    /// replay frames on the device) at the batches' slots, when given.
    ///
    /// The update's host work comes first (the batch to the device, the optimizer's
    /// step count), then its device work (targets, loss, gradients, the optimizer's
    /// step: one CUDA graph's launch once captured), then the host's bookkeeping
    /// (counts, SVB's and BBN's projections, the target sync).
    pub fn update_with_frames<B: Borrow<Batch>>(
        &mut self,
        batches: &[B],
        frames: Option<&DeviceFrames>,
    ) -> Result<PopulationInfo> {
        let device = self.device();
        let remade = self.inputs.batch(batches, &device, frames)?;
        let frames_id = frames.map(DeviceFrames::id);
        if remade || frames_id != self.frames_id {
            self.graphs[UPDATE].recapture();
            self.frames_id = frames_id;
        }
        if !self.initialized {
            let stacked = self.inputs.current()?.stacked(frames)?;
            self.initialize_once(&stacked, batches)?;
        }
        self.make_constants()?;
        let metrics = match self.plan_step()? {
            Plan::Host => {
                let stacked = self.inputs.current()?.stacked(frames)?;
                let metrics = self.host_update(&stacked)?;
                self.online.project()?;
                metrics
            }
            #[cfg(feature = "cuda")]
            Plan::Device(c) => self.run_device_update(frames, c)?,
        };
        self.updates += 1;
        self.online.after_optimizer_step(self.updates)?;
        match self.config.target_update.after(self.updates) {
            TargetSync::Copy => self.target.copy_from(&self.online)?,
            TargetSync::Average(tau) => self.target.soft_update_from(&self.online, tau)?,
            TargetSync::Keep => {}
        }
        Ok(PopulationInfo { metrics })
    }

    /// The optimizer's host half of the step: on CUDA's fused kernels, its count and
    /// the coefficients that change from step to step, written to the device.
    fn plan_step(&mut self) -> Result<Plan> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.optimizer.prepare_device_step(self.max_grad_norm)? {
            return Ok(Plan::Device(c));
        }
        Ok(Plan::Host)
    }

    /// An update where the optimizer steps on the host's fused loop (the CPU), or by
    /// tensor ops: each agent's TD loss, mean taken Q and gradient norm `[3, P]`.
    fn host_update(&mut self, stacked: &Stacked) -> Result<Tensor> {
        let (stats, mut grads) = self.gradients(stacked)?;
        let (agents, max) = (self.online.agents(), self.max_grad_norm);
        let ratios = self.lr_ratios.as_deref();
        // On the CPU one fused loop clips and steps every agent in place; elsewhere,
        // tensor ops.
        let grad_norm = match self.optimizer.step_agents(&grads, agents, max, ratios)? {
            Some(norms) => {
                let norms = norms.into_iter().map(|n| n as f32).collect();
                Tensor::from_vec(norms, (1, agents), &self.device())?
            }
            None => {
                let norm = self.clip_per_agent(&mut grads)?;
                self.optimizer_step(&grads)?;
                norm.unsqueeze(0)?
            }
        };
        with_grad_norms(&stats, &grad_norm)
    }

    /// Each agent's TD loss and mean taken Q `[2, P]` (a distributional loss's with its
    /// mean entropy, `[3, P]`), and the gradients: by the fused ops' explicit backward
    /// where the network has one, else candle's.
    fn gradients(&self, stacked: &Stacked) -> Result<(Tensor, GradStore)> {
        if let Some(found) = self.explicit_gradients(stacked)? {
            return Ok(found);
        }
        if self.distributional() {
            // The mean Q and the entropy `[2, P]` after the loss.
            let (per_agent, rest) = self.distribution_losses(stacked)?;
            let grads = per_agent.sum_all()?.backward()?;
            return Ok((
                Tensor::cat(&[&per_agent.detach().unsqueeze(0)?, &rest], 0)?,
                grads,
            ));
        }
        let (per_agent, q_mean) = self.losses(stacked)?;
        let grads = per_agent.sum_all()?.backward()?;
        Ok((Tensor::stack(&[per_agent.detach(), q_mean], 0)?, grads))
    }

    /// The update's device work on CUDA's fused kernels, through the update's graph:
    /// its metrics are written to the fixed output, and returned as a copy (the next
    /// step writes the output again).
    #[cfg(feature = "cuda")]
    fn run_device_update(
        &mut self,
        frames: Option<&DeviceFrames>,
        c: crate::kernels::cuda::optimizer::StepCoefficients,
    ) -> Result<Tensor> {
        let (p, device) = (self.online.agents(), self.device());
        // A distributional loss's entropy is a fourth row.
        let metrics = 3 + usize::from(self.distributional());
        let out = inputs::output(
            &mut self.outputs[UPDATE],
            (&[metrics, p], DType::F32),
            &device,
        )?;
        let mut graph = self.take_graph(UPDATE);
        let region = || -> Result<()> {
            let stacked = self.inputs.current()?.stacked(frames)?;
            let (stats, grads) = self.gradients(&stacked)?;
            let ratios = self.constants.as_ref().and_then(|k| k.lr_ratios.as_ref());
            let norms = self.optimizer.device_step(&grads, p, ratios, c)?;
            self.online.project()?;
            out.slice_set(&with_grad_norms(&stats, &norms.unsqueeze(0)?)?, 0, 0)
        };
        let ran = self.run_graph(&mut graph, &out, &region);
        self.graphs[UPDATE] = graph;
        ran?;
        self.optimizer.changed();
        out.copy()
    }

    /// The device's fixed inputs of every step, made at the first (nothing on the
    /// CPU, whose fused ops take them from the host).
    fn make_constants(&mut self) -> Result<()> {
        let device = self.device();
        if self.constants.is_some() || device.is_cpu() {
            return Ok(());
        }
        let p = self.online.agents();
        let gammas = match &self.gammas {
            Some(g) => g.clone(),
            None => Tensor::from_vec(vec![self.config.gamma as f32; p], (p, 1), &device)?,
        };
        let lr_ratios = match &self.lr_ratios {
            Some(r) => Some(inputs::constant(r.clone(), &device)?),
            None => None,
        };
        self.constants = Some(DeviceConstants { gammas, lr_ratios });
        Ok(())
    }

    /// As a single agent's first update: weight norm's data-dependent init on each
    /// agent's init batch (`Batch::init_obs`, where the trainer gave them, else its
    /// first batch), then the target sync.
    fn initialize_once<B: Borrow<Batch>>(
        &mut self,
        stacked: &Stacked,
        batches: &[B],
    ) -> Result<()> {
        if self.initialized {
            return Ok(());
        }
        if self.online.wants_data_dependent_init() {
            match init_observations(batches, &stacked.obs)? {
                Some(obs) => self.online.data_dependent_init(&obs)?,
                None => self.online.data_dependent_init(&stacked.obs)?,
            }
        }
        self.target.copy_from(&self.online)?;
        self.initialized = true;
        Ok(())
    }

    /// Each agent's TD loss and the mean Q-value of its taken actions `[2, P]`, and the
    /// gradients, by the fused ops' explicit backward ([`PopulationNet::backward`]),
    /// where the online network has one here; `None` elsewhere (a device, CrossQ's
    /// joint forward, the tensor forms).
    fn explicit_gradients(&self, stacked: &Stacked) -> Result<Option<(Tensor, GradStore)>> {
        if self.config.joint_forward {
            return Ok(None);
        }
        if self.distributional() {
            return self.distribution_gradients(stacked);
        }
        let stats = self.config.online_bn_mode;
        // The targets first, as the graph's path: a target-free agent's running
        // statistics then see the next observations before the observations.
        let targets = self.targets(stacked)?;
        let Some((q, tape)) = self.online.forward_with_tape(&stacked.obs, stats)? else {
            return Ok(None);
        };
        let (actions, loss) = (&stacked.actions, self.regression());
        let metrics = population_td(&q, actions, &targets, loss, TdOutput::Stats)?;
        let dq = population_td(&q, actions, &targets, loss, TdOutput::Gradient)?;
        let grads = self.online.backward(tape, &dq)?;
        Ok(Some((metrics, grads)))
    }

    /// Each agent's TD loss on its batch, `[P]`, through candle's graph, and the mean
    /// Q-value of its taken actions (detached).
    fn losses(&self, stacked: &Stacked) -> Result<(Tensor, Tensor)> {
        if self.distributional() {
            let (per_agent, rest) = self.distribution_losses(stacked)?;
            return Ok((per_agent, rest.get(0)?));
        }
        let (q, targets) = match self.config.joint_forward {
            false => {
                let targets = self.targets(stacked)?;
                let stats = self.config.online_bn_mode;
                (self.online.forward_in_graph(&stacked.obs, stats)?, targets)
            }
            true => self.joint_forward(stacked)?,
        };
        // Each agent's mean over its own batch: `[P]`.
        let (actions, fused, loss) = (&stacked.actions, self.online.is_fused(), self.regression());
        let losses = match fused {
            true => population_td_loss(&q, actions, &targets, loss)?,
            false => population_td_loss_tensor_ops(&q, actions, &targets, loss)?,
        };
        let q_mean = match fused {
            true => population_mean_taken(&q, actions)?,
            false => q.detach().gather(actions, 2)?.squeeze(2)?.mean(1)?,
        };
        Ok((losses, q_mean))
    }

    /// The operations the backward of an update on `batches` goes through: the nodes of
    /// the loss's graph. Independent of the population's size (one batched operation
    /// per step of the network, whatever P).
    pub fn loss_graph_nodes<B: Borrow<Batch>>(&self, batches: &[B]) -> Result<usize> {
        let mut inputs = Inputs::new(false);
        inputs.batch(batches, &self.device(), None)?;
        let stacked = inputs.current()?.stacked(None)?;
        Ok(self.losses(&stacked)?.0.sum_all()?.sorted_nodes().len())
    }

    fn device(&self) -> Device {
        self.online.device().clone()
    }

    /// `r + gamma (1 - terminated) Q_target(s', a*)`, `[P, B]`, `a*` the target's
    /// argmax or (Double DQN) the online network's.
    fn targets(&self, b: &Stacked) -> Result<Tensor> {
        // Target-free TD (`target_update = "none"`) bootstraps from the online network.
        let target = match self.config.target_update.bootstraps_from_online() {
            true => &self.online,
            false => &self.target,
        };
        let next_q = target.forward(&b.next_obs, self.config.target_bn_mode)?;
        if self.online.is_fused() && !self.config.double_dqn {
            // One op: each agent's best next value, discounted, plus its reward.
            return td::population_targets(&next_q, &b.rewards, &b.terminated, self.discount());
        }
        let online_q = match self.config.double_dqn {
            true => Some(self.online.forward(&b.next_obs, BnStats::Running)?),
            false => None,
        };
        self.bootstrap(b, td::best_next(&next_q, online_q.as_ref())?)
    }

    /// CrossQ's joint forward: the observations' Q-values, and the targets from the
    /// next observations' ([`Self::joint_outputs`]).
    fn joint_forward(&self, b: &Stacked) -> Result<(Tensor, Tensor)> {
        let (q, next) = self.joint_outputs(b)?;
        let best = td::best_next(&next.next, next.chooser.as_ref())?;
        Ok((q, self.bootstrap(b, best)?))
    }

    /// The joint forward (CrossQ's, XQC's): one training forward of each agent's
    /// observations and next observations together (`2B` rows, so batch statistics
    /// come from both), the first half's outputs for the loss. The targets come from
    /// the second half's, detached, or with a target network from the target network's
    /// forward of the same `2B` rows, the online second half choosing the next action
    /// under Double DQN (as a single agent's).
    fn joint_outputs(&self, b: &Stacked) -> Result<(Tensor, NextOutputs)> {
        let rows = b.obs.dim(1)?;
        let both = Tensor::cat(&[&b.obs, &b.next_obs], 1)?;
        let all = self
            .online
            .forward_in_graph(&both, self.config.online_bn_mode)?;
        let (out, online_next) = td::split_joint(&all, 1, rows)?;
        let next = match self.config.target_update.bootstraps_from_online() {
            true => NextOutputs {
                next: online_next,
                chooser: None,
            },
            false => {
                let t = self.target.forward(&both, self.config.target_bn_mode)?;
                NextOutputs {
                    next: t.narrow(1, rows, rows)?.contiguous()?,
                    chooser: self.config.double_dqn.then_some(online_next),
                }
            }
        };
        Ok((out, next))
    }

    /// `r + gamma (1 - terminated) best`, each agent with its own gamma, detached.
    fn bootstrap(&self, b: &Stacked, best: Tensor) -> Result<Tensor> {
        td::bootstrap(&b.rewards, &b.terminated, &best, self.discount())
    }

    /// Every agent's discount.
    fn discount(&self) -> td::Discount<'_> {
        if let Some(k) = &self.constants {
            // On a device, always a tensor made once: no upload inside the step.
            return td::Discount::PerAgent(&k.gammas);
        }
        match &self.gammas {
            None => td::Discount::All(self.config.gamma),
            Some(gammas) => td::Discount::PerAgent(gammas),
        }
    }

    /// The optimizer's step, each agent's scaled to its own learning rate: Adam's and
    /// RMSprop's step is the learning rate times a function of the moments alone, so
    /// `old + (new - old) * lr_i / lr` is agent `i`'s step (to rounding of the
    /// parameter, 1e-7 of it). Three operations per variable, whatever P.
    fn optimizer_step(&mut self, grads: &GradStore) -> Result<()> {
        let Some(ratios) = &self.lr_ratios else {
            self.optimizer.step(grads)?;
            return Ok(());
        };
        let ratios: Vec<f32> = ratios.iter().map(|&r| r as f32).collect();
        let ratios = Tensor::from_vec(ratios, self.online.agents(), &self.device())?;
        let vars: Vec<Var> = self
            .online
            .vars()
            .into_iter()
            .map(|(_, v)| v.clone())
            .collect();
        let before = vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<Result<Vec<_>>>()?;
        self.optimizer.step(grads)?;
        for (var, old) in vars.iter().zip(before) {
            let mut shape = vec![1; old.rank()];
            shape[0] = ratios.dim(0)?;
            let step = (var.as_tensor() - &old)?.broadcast_mul(&ratios.reshape(shape)?)?;
            var.set(&(old + step)?)?;
        }
        Ok(())
    }

    /// Scales each agent's gradients so that their global norm is at most
    /// `max_grad_norm` (the single optimizer's rule, per agent); each agent's norm
    /// before clipping, `[P]`.
    fn clip_per_agent(&self, grads: &mut GradStore) -> Result<Tensor> {
        let max = self.max_grad_norm;
        let p = self.online.agents();
        let vars = self.online.vars();
        let mut sum = Tensor::zeros(p, DType::F32, &self.device())?;
        for (_, var) in &vars {
            if let Some(g) = grads.get(var.as_tensor()) {
                sum = (sum + g.sqr()?.flatten_from(1)?.sum(1)?)?;
            }
        }
        let norm = sum.sqrt()?;
        let Some(scale) = crate::optim::clip::scale_tensor(&norm, max)? else {
            return Ok(norm);
        };
        for (_, var) in &vars {
            if let Some(g) = grads.remove(var.as_tensor()) {
                let mut shape = vec![1; g.rank()];
                shape[0] = p;
                grads.insert(var.as_tensor(), g.broadcast_mul(&scale.reshape(shape)?)?);
            }
        }
        Ok(norm)
    }
}

/// Every agent's init batch `[P, N, ..]` on `obs`'s device, shaped as `obs` `[P, B,
/// ..]` but for its rows; `None` where the batches carry none. Made once, at the first
/// update (an upload, which no captured graph holds).
fn init_observations<B: Borrow<Batch>>(batches: &[B], obs: &Tensor) -> Result<Option<Tensor>> {
    let first = batches
        .first()
        .map(|b| b.borrow().init_obs.len())
        .unwrap_or(0);
    if first == 0 {
        return Ok(None);
    }
    if batches.iter().any(|b| b.borrow().init_obs.len() != first) {
        candle_core::bail!("a population's init batches differ in size");
    }
    let mut dims = obs.dims().to_vec();
    let row: usize = dims[2..].iter().product();
    dims[1] = first / row.max(1);
    let all: Vec<f32> = batches
        .iter()
        .flat_map(|b| b.borrow().init_obs.iter().copied())
        .collect();
    Tensor::from_vec(all, dims, obs.device()).map(Some)
}

/// An update's metrics with each agent's gradient norm `[1, P]` after the loss and the
/// mean taken Q (`stats` `[2, P]`); a distributional loss's entropy (`stats`' third
/// row) comes last.
fn with_grad_norms(stats: &Tensor, norms: &Tensor) -> Result<Tensor> {
    match stats.dim(0)? {
        2 => Tensor::cat(&[stats, norms], 0),
        _ => Tensor::cat(
            &[&stats.narrow(0, 0, 2)?, norms, &stats.narrow(0, 2, 1)?],
            0,
        ),
    }
}

/// `online`'s trainable variables as a store, for the optimizer.
fn trainables(online: &PopulationNet) -> ParamStore {
    let device = online.device().clone();
    let mut store = ParamStore::sharing_version(device, online.version_counter());
    for ((name, var), role) in online.vars().into_iter().zip(online.roles()) {
        store.insert(name, var.clone(), role);
    }
    store
}

/// What one population update reports, on the device (no wait for it).
pub struct PopulationInfo {
    /// `[3, P]`: each agent's TD loss, mean Q of its taken actions, and gradient norm
    /// before clipping; with a distributional loss `[4, P]`, the taken actions' value
    /// distributions' mean entropy last.
    pub metrics: Tensor,
}

impl PopulationInfo {
    /// Each agent's TD loss, read to the host.
    #[cfg(any(test, feature = "test-support"))]
    pub fn td_losses(&self) -> Result<Vec<f32>> {
        read_to_host(&self.metrics.get(0)?)
    }

    /// Each agent's gradient norm before clipping, read to the host.
    #[cfg(any(test, feature = "test-support"))]
    pub fn grad_norms(&self) -> Result<Vec<f32>> {
        read_to_host(&self.metrics.get(2)?)
    }

    /// Each agent's mean value entropy of its taken actions (a distributional loss's),
    /// read to the host.
    #[cfg(any(test, feature = "test-support"))]
    pub fn value_entropies(&self) -> Result<Vec<f32>> {
        read_to_host(&self.metrics.get(3)?)
    }
}
