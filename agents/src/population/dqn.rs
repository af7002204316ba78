//! One DQN update for a whole population, each step one operation over all agents: TD
//! targets, the TD loss (each agent's mean over its batch, summed over agents, so that
//! each agent's gradient is its own) and its gradient (on the CPU by the fused ops'
//! explicit backward, elsewhere candle's), gradient clipping per agent, and the single
//! agents' optimizer over the stacked variables (elementwise, so each agent's moments
//! are its own). Agents train exactly as they would alone.

use std::borrow::Borrow;
use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var, D};
use rand::Rng;

use super::count::{read_rows_to_host, read_to_host};
use super::{DeviceFrames, PopulationNet};
use crate::dqn::td::{self, TargetSync};
use crate::dqn::{epsilon_greedy, Dqn, DqnConfig};
use crate::dqn::{population_mean_taken, population_td_gradient, population_td_stats};
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

    fn with_target(
        online: PopulationNet,
        target: PopulationNet,
        config: DqnConfig,
        optimizer: OptimizerConfig,
    ) -> Result<Self> {
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
    /// actions (on a GPU, the step's only wait for the device).
    pub fn greedy_actions(&self, obs: &[f32]) -> Result<Vec<u32>> {
        let p = self.online.agents();
        let x = Tensor::from_slice(obs, (p, 1, obs.len() / p.max(1)), &self.device())?;
        let q = self.online.forward(&x, self.config.acting_bn_mode)?;
        // `[P, 1]`, read as rows: a flatten would be one more operation.
        let rows = read_rows_to_host::<u32>(&q.argmax(D::Minus1)?)?;
        Ok(rows.into_iter().flatten().collect())
    }

    /// Epsilon-greedy for every agent with its own epsilon and generator, each drawing
    /// as a single agent's `act` does (one uniform draw decides, a second picks the
    /// random action).
    pub fn act<R: Rng>(&self, obs: &[f32], epsilons: &[f64], rngs: &mut [R]) -> Result<Vec<usize>> {
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
    pub fn update_with_frames<B: Borrow<Batch>>(
        &mut self,
        batches: &[B],
        frames: Option<&DeviceFrames>,
    ) -> Result<PopulationInfo> {
        let stacked = Stacked::of(batches, &self.device(), frames)?;
        self.initialize_once(&stacked)?;
        let (stats, mut grads) = match self.explicit_gradients(&stacked)? {
            Some(found) => found,
            None => {
                let (per_agent, q_mean) = self.losses(&stacked)?;
                let grads = per_agent.sum_all()?.backward()?;
                (Tensor::stack(&[per_agent.detach(), q_mean], 0)?, grads)
            }
        };
        let (agents, max) = (self.online.agents(), self.max_grad_norm);
        let ratios = self.lr_ratios.as_deref();
        // On the CPU one fused loop clips and steps every agent in place; on a device,
        // tensor ops.
        let grad_norm = match self.optimizer.step_agents(&grads, agents, max, ratios)? {
            Some(norms) => {
                let norms = norms.into_iter().map(|n| n as f32).collect();
                Tensor::from_vec(norms, (1, agents), &self.device())?
            }
            None => self.device_optimizer_step(&mut grads)?,
        };
        self.updates += 1;
        self.online.after_optimizer_step(self.updates)?;
        match self.config.target_update.after(self.updates) {
            TargetSync::Copy => self.target.copy_from(&self.online)?,
            TargetSync::Average(tau) => self.target.soft_update_from(&self.online, tau)?,
            TargetSync::Keep => {}
        }
        let metrics = Tensor::cat(&[stats, grad_norm], 0)?;
        Ok(PopulationInfo { metrics })
    }

    /// The optimizer's step where the variables live on a device, each agent's gradient
    /// norm before clipping `[1, P]`: on CUDA the fused step's two kernels, elsewhere
    /// (and with the tensor optimizer) tensor ops.
    fn device_optimizer_step(&mut self, grads: &mut GradStore) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        {
            let (agents, max, ratios) = (self.online.agents(), self.max_grad_norm, &self.lr_ratios);
            let ratios = ratios.as_deref();
            let fused = self
                .optimizer
                .step_agents_on_device(grads, agents, max, ratios)?;
            if let Some(norms) = fused {
                return norms.unsqueeze(0);
            }
        }
        let norm = self.clip_per_agent(grads)?;
        self.optimizer_step(grads)?;
        norm.unsqueeze(0)
    }

    /// As a single agent's first update: weight norm's data-dependent init on each
    /// agent's first batch, then the target sync.
    fn initialize_once(&mut self, stacked: &Stacked) -> Result<()> {
        if self.initialized {
            return Ok(());
        }
        if self.online.wants_data_dependent_init() {
            self.online.data_dependent_init(&stacked.obs)?;
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
        let stats = self.config.online_bn_mode;
        // The targets first, as the graph's path: a target-free agent's running
        // statistics then see the next observations before the observations.
        let targets = self.targets(stacked)?;
        let Some((q, tape)) = self.online.forward_with_tape(&stacked.obs, stats)? else {
            return Ok(None);
        };
        let (actions, loss) = (&stacked.actions, self.config.loss);
        let metrics = population_td_stats(&q, actions, &targets, loss)?;
        let dq = population_td_gradient(&q, actions, &targets, loss)?;
        let grads = self.online.backward(tape, &dq)?;
        Ok(Some((metrics, grads)))
    }

    /// Each agent's TD loss on its batch, `[P]`, through candle's graph, and the mean
    /// Q-value of its taken actions (detached).
    fn losses(&self, stacked: &Stacked) -> Result<(Tensor, Tensor)> {
        let (q, targets) = match self.config.joint_forward {
            false => {
                let targets = self.targets(stacked)?;
                let stats = self.config.online_bn_mode;
                (self.online.forward_in_graph(&stacked.obs, stats)?, targets)
            }
            true => self.joint_forward(stacked)?,
        };
        // Each agent's mean over its own batch: `[P]`.
        let (actions, fused) = (&stacked.actions, self.online.is_fused());
        let losses = match fused {
            true => population_td_loss(&q, actions, &targets, self.config.loss)?,
            false => population_td_loss_tensor_ops(&q, actions, &targets, self.config.loss)?,
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
        let stacked = Stacked::of(batches, &self.device(), None)?;
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

    /// CrossQ's joint forward: one training forward of each agent's observations and
    /// next observations together (`2B` rows, so batch statistics come from both); the
    /// second half's Q-values, detached, make the targets (as a single agent's).
    fn joint_forward(&self, b: &Stacked) -> Result<(Tensor, Tensor)> {
        let rows = b.obs.dim(1)?;
        let both = Tensor::cat(&[&b.obs, &b.next_obs], 1)?;
        let q_all = self
            .online
            .forward_in_graph(&both, self.config.online_bn_mode)?;
        let (q, next_q) = td::split_joint(&q_all, 1, rows)?;
        let targets = self.bootstrap(b, td::best_next(&next_q, None)?)?;
        Ok((q, targets))
    }

    /// `r + gamma (1 - terminated) best`, each agent with its own gamma, detached.
    fn bootstrap(&self, b: &Stacked, best: Tensor) -> Result<Tensor> {
        td::bootstrap(&b.rewards, &b.terminated, &best, self.discount())
    }

    /// Every agent's discount.
    fn discount(&self) -> td::Discount<'_> {
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
    /// before clipping.
    pub metrics: Tensor,
}

impl PopulationInfo {
    /// Each agent's TD loss, read to the host.
    pub fn td_losses(&self) -> Result<Vec<f32>> {
        read_to_host(&self.metrics.get(0)?)
    }

    /// Each agent's gradient norm before clipping, read to the host.
    pub fn grad_norms(&self) -> Result<Vec<f32>> {
        read_to_host(&self.metrics.get(2)?)
    }
}

/// The agents' batches as `[P, B, ...]` tensors.
struct Stacked {
    obs: Tensor,
    next_obs: Tensor,
    actions: Tensor,
    rewards: Tensor,
    terminated: Tensor,
}

impl Stacked {
    fn of<B: Borrow<Batch>>(
        batches: &[B],
        device: &Device,
        frames: Option<&DeviceFrames>,
    ) -> Result<Self> {
        let gathered = frames.map(|f| f.gather(batches)).transpose()?;
        let batches: Vec<&Batch> = batches.iter().map(Borrow::borrow).collect();
        let (p, b) = (batches.len(), batches.first().map_or(0, |x| x.size));
        if batches.iter().any(|x| x.size != b) {
            candle_core::bail!("a population's batches must have one size");
        }
        let obs_len = batches[0].obs.len() / b.max(1);
        let gather = |f: fn(&Batch) -> &[f32]| -> Vec<f32> {
            batches.iter().flat_map(|x| f(x).iter().copied()).collect()
        };
        let actions: Vec<u32> = batches
            .iter()
            .flat_map(|x| x.actions.iter().copied())
            .collect();
        let (obs, next_obs) = match gathered {
            Some(both) => both,
            None => (
                Tensor::from_vec(gather(|x| &x.obs), (p, b, obs_len), device)?,
                Tensor::from_vec(gather(|x| &x.next_obs), (p, b, obs_len), device)?,
            ),
        };
        Ok(Self {
            obs,
            next_obs,
            actions: Tensor::from_vec(actions, (p, b, 1), device)?,
            rewards: Tensor::from_vec(gather(|x| &x.rewards), (p, b), device)?,
            terminated: Tensor::from_vec(gather(|x| &x.terminated), (p, b), device)?,
        })
    }
}
