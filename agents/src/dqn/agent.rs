//! The DQN learner: online and target Q-networks, the TD update and epsilon-greedy
//! acting.
//!
//! ```
//! use candle_core::Device;
//! use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig};
//! use normrl_agents::replay::Batch;
//! use normrl_agents::nn::{NormConfig, QNetworkConfig};
//! use normrl_agents::optim::OptimizerConfig;
//!
//! let config = AgentConfig {
//!     network: &QNetworkConfig::mlp(vec![16]),
//!     norm: &NormConfig::default(),
//!     optimizer: &OptimizerConfig::default(),
//!     dqn: &DqnConfig::default(),
//! };
//! let mut dqn = Dqn::new(config, &[4], 2, 0, &Device::Cpu).unwrap();
//! let mut batch = Batch::new(8, 4);
//! batch.actions.fill(1);
//! let info = dqn.update(&batch).unwrap();
//! assert!(info.td_loss.value().unwrap().is_finite());
//! assert!(dqn.greedy_action(&[0.0; 4]).unwrap() < 2);
//! ```

use candle_core::{Device, Result, Tensor};
use rand::Rng;

use super::distribution::{
    distribution_loss, host_distribution_loss, target_distributions, Bootstrap,
};
use super::td::{self, TargetSync};
use super::td_loss::{device_loss, graph_loss, host_loss, LossInfo};
use super::{AgentConfig, DqnConfig, Loss};
use crate::nn::{expectations, BnStats, HostTape, Pass, QNetwork};
use crate::optim::{Gradients, Optimizer};
use crate::replay::Batch;
use crate::Metric;

/// What one update measured.
#[derive(Debug, Clone)]
pub struct UpdateInfo {
    pub td_loss: Metric,
    /// Mean Q-value of the taken actions.
    pub q_mean: Metric,
    /// Gradient norm before clipping.
    pub grad_norm: Metric,
    /// SVB/BBN projected the weights after this update.
    pub projected: bool,
    /// A distributional head's mean entropy (nats) of the taken actions' value
    /// distributions; `None` for a regression loss.
    pub value_entropy: Option<f64>,
    /// The target network was synced after this update.
    pub synced: bool,
}

pub struct Dqn {
    online: QNetwork,
    target: QNetwork,
    optimizer: Optimizer,
    config: DqnConfig,
    device: Device,
    updates: u64,
    /// Data-dependent init and the first target sync have run.
    initialized: bool,
    /// Where the networks run, chosen when the agent is built.
    engine: Engine,
}

/// Where an agent's forwards, losses and gradients are computed, chosen when the agent
/// is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// MLPs on the CPU: host buffers and a tape, no graph ([`QNetwork::host_forward`]).
    Host,
    /// Candle's graph on the CPU; TD targets and losses are read on the host, where
    /// reading is free.
    CpuGraph,
    /// Candle's graph on an accelerator: targets and losses stay on the device, since
    /// reading them back would wait for it (but a distributional loss's, whose targets
    /// are the host functions here: `normrl train` runs a device as a population of
    /// one, whose targets are tensor ops).
    Device,
}

impl Engine {
    fn of(online: &QNetwork) -> Self {
        if !online.store().device().is_cpu() {
            Engine::Device
        } else if online.runs_on_host() {
            Engine::Host
        } else {
            Engine::CpuGraph
        }
    }
}

/// The online network's Q-values of a batch, kept for the backward.
enum UpdateForward {
    /// `q` holds `rows` rows for the loss (then, for a joint forward, the next
    /// observations' rows).
    Host {
        q: Vec<f32>,
        rows: usize,
        tape: HostTape,
    },
    Graph(Tensor),
    /// A distributional head's logits `[B, A, K]`.
    Logits(Tensor),
    /// The same on the host path: `rows` rows for the loss (then, for a joint forward,
    /// the next observations' rows), row-major.
    HostLogits {
        logits: Vec<f32>,
        rows: usize,
        tape: HostTape,
    },
}

/// TD targets where the loss reads them.
enum Targets {
    Host(Vec<f32>),
    Device(Tensor),
    /// Target distributions over the support, `[B, K]` row-major.
    Distribution(Vec<f32>),
}

impl Dqn {
    /// A CPU agent of `network` and `norm` with the default optimizer and DQN settings
    /// (tests' agents).
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_defaults(
        (network, norm): (&crate::nn::QNetworkConfig, &crate::nn::NormConfig),
        obs_shape: &[usize],
        n_actions: usize,
        seed: u64,
    ) -> Result<Self> {
        let (optimizer, dqn) = (Default::default(), Default::default());
        let config = AgentConfig {
            network,
            norm,
            optimizer: &optimizer,
            dqn: &dqn,
        };
        Self::new(config, obs_shape, n_actions, seed, &Device::Cpu)
    }

    /// An agent of `config` for observations of `obs_shape` and `n_actions` actions,
    /// its networks initialized from `seed`.
    pub fn new(
        config: AgentConfig,
        obs_shape: &[usize],
        n_actions: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        let AgentConfig {
            network,
            norm,
            optimizer,
            dqn: config,
        } = config;
        let (online, target) = match config.loss.is_distributional() {
            false => (
                QNetwork::new(network, norm, obs_shape, n_actions, seed, device)?,
                QNetwork::new(network, norm, obs_shape, n_actions, seed, device)?,
            ),
            true => {
                let values = config.support_values();
                let net = || {
                    let shape = (obs_shape, n_actions);
                    QNetwork::distributional(network, norm, shape, &values, seed, device)
                };
                (net()?, net()?)
            }
        };
        target.copy_from(&online)?;
        let optimizer = Optimizer::new(online.store(), optimizer, norm.g_lr_scale);
        let engine = Engine::of(&online);
        Ok(Self {
            online,
            target,
            optimizer,
            config: config.clone(),
            device: device.clone(),
            updates: 0,
            initialized: false,
            engine,
        })
    }

    /// The agent with its forwards and gradients computed by `engine` instead of the
    /// one chosen for its device and network: the graph is the reference the host path
    /// is tested against, and [`Engine::Device`] runs an accelerator's path (targets and
    /// losses as tensor ops) on the CPU for tests.
    #[cfg(any(test, feature = "test-support"))]
    pub fn with_engine(mut self, engine: Engine) -> Result<Self> {
        let cpu = self.device.is_cpu();
        match engine {
            Engine::Host if !(cpu && self.online.runs_on_host()) => {
                candle_core::bail!("the host path runs MLPs on the CPU only")
            }
            Engine::Host | Engine::CpuGraph if !cpu => {
                candle_core::bail!("an accelerator's networks run on its device")
            }
            _ => {}
        }
        self.engine = engine;
        Ok(self)
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// True when this agent's networks run on host values.
    pub fn runs_on_host(&self) -> bool {
        self.engine == Engine::Host
    }

    pub fn online(&self) -> &QNetwork {
        &self.online
    }

    pub fn target(&self) -> &QNetwork {
        &self.target
    }

    pub fn config(&self) -> &DqnConfig {
        &self.config
    }

    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        &mut self.optimizer
    }

    pub fn updates(&self) -> u64 {
        self.updates
    }

    pub fn is_initialized(&self) -> bool {
        self.initialized
    }

    /// Restores the counters saved with a checkpoint.
    pub fn restore_counters(&mut self, updates: u64, initialized: bool) {
        self.updates = updates;
        self.initialized = initialized;
    }

    fn batch_tensor(&self, data: &[f32], rows: usize) -> Result<Tensor> {
        let mut shape = vec![rows];
        shape.extend_from_slice(self.online.obs_shape());
        Tensor::from_slice(data, shape, &self.device)
    }

    /// Q-values of one observation, as used for acting.
    pub fn q_values(&self, obs: &[f32]) -> Result<Vec<f32>> {
        self.q_of(&self.online, obs, 1, self.config.acting_bn_mode)
    }

    /// Gradient-free Q-values `[rows, n_actions]` (row-major) of `net` on host
    /// observations.
    #[inline]
    fn q_of(&self, net: &QNetwork, obs: &[f32], rows: usize, stats: BnStats) -> Result<Vec<f32>> {
        self.outputs_of(net, (obs, rows), stats, false)
    }

    /// Gradient-free Q-values, or with `logits` a distributional head's logits
    /// `[rows, A, K]`, of `net` on host observations, row-major.
    fn outputs_of(
        &self,
        net: &QNetwork,
        (obs, rows): (&[f32], usize),
        stats: BnStats,
        logits: bool,
    ) -> Result<Vec<f32>> {
        match self.engine {
            Engine::Host if logits => net.host_head(obs, rows, stats, None),
            Engine::Host => net.host_forward(obs, rows, stats, None),
            Engine::CpuGraph | Engine::Device => {
                let (x, pass) = (self.batch_tensor(obs, rows)?, Pass::gradient_free(stats));
                let out = match logits {
                    true => net.forward_logits(&x, pass)?,
                    false => net.forward(&x, pass)?,
                };
                out.flatten_all()?.to_vec1()
            }
        }
    }

    pub fn greedy_action(&self, obs: &[f32]) -> Result<usize> {
        Ok(td::first_argmax(&self.q_values(obs)?))
    }

    /// Epsilon-greedy (see [`epsilon_greedy`]).
    pub fn act<R: Rng>(&self, obs: &[f32], epsilon: f64, rng: &mut R) -> Result<usize> {
        let n = self.online.n_actions();
        epsilon_greedy(rng, epsilon, n, || self.greedy_action(obs))
    }

    /// One gradient step on `batch`, as CleanRL's DQN writes it: TD targets from the
    /// target network, the online network's Q-values, the TD loss, its gradients, an
    /// optimizer step, then SVB's projection and the target sync when due. On the first
    /// call, weight norm's data-dependent init runs on this batch and the target
    /// network is synced from the result.
    pub fn update(&mut self, batch: &Batch) -> Result<UpdateInfo> {
        self.initialize_once(batch)?;
        let (q, targets) = match self.config.joint_forward {
            false => {
                let targets = self.targets(batch)?;
                (self.q_for_update(batch)?, targets)
            }
            true => self.joint_forward(batch)?,
        };
        let (loss, gradients) = self.loss_and_gradients(q, batch, &targets)?;
        let grad_norm = self.optimizer.apply(&gradients)?;
        self.finish_update(loss, grad_norm)
    }

    /// Weight norm's data-dependent init on the first batch, and the first target sync.
    fn initialize_once(&mut self, batch: &Batch) -> Result<()> {
        if self.initialized {
            return Ok(());
        }
        if self.online.wants_data_dependent_init() {
            // The init batch where the trainer gave one (see `Batch::init_obs`).
            let (data, rows) = match batch.init_obs.is_empty() {
                true => (&batch.obs, batch.size),
                false => {
                    let len: usize = self.online.obs_shape().iter().product();
                    (&batch.init_obs, batch.init_obs.len() / len.max(1))
                }
            };
            let obs = self.batch_tensor(data, rows)?;
            self.online.data_dependent_init(&obs)?;
        }
        self.target.copy_from(&self.online)?;
        self.initialized = true;
        Ok(())
    }

    /// `r + gamma * (1 - terminated) * Q_target(s', a*)`, with `a*` the target's
    /// argmax, or the online network's with Double DQN. Truncated transitions
    /// bootstrap from their final observation like any other.
    pub fn td_targets(&self, batch: &Batch) -> Result<Vec<f32>> {
        match self.regression_targets(batch)? {
            Targets::Host(values) => Ok(values),
            Targets::Device(t) => t.to_vec1(),
            Targets::Distribution(_) => candle_core::bail!("scalar targets were asked"),
        }
    }

    /// The network the TD targets come from: the target network, or the online one
    /// with `target_update = "none"`.
    fn target_network(&self) -> &QNetwork {
        match self.config.target_update.bootstraps_from_online() {
            true => &self.online,
            false => &self.target,
        }
    }

    /// The targets the loss reads: scalar TD targets for a regression, target
    /// distributions for a distributional loss.
    fn targets(&self, batch: &Batch) -> Result<Targets> {
        match self.config.loss.is_distributional() {
            true => self.distribution_targets(batch).map(Targets::Distribution),
            false => self.regression_targets(batch),
        }
    }

    /// The target distributions `[B, K]` from the target network's logits of the next
    /// observations (the online network's without a target network), the online
    /// network's Q-values choosing the next action with Double DQN.
    fn distribution_targets(&self, batch: &Batch) -> Result<Vec<f32>> {
        let (b, stats) = (batch.size, self.config.target_bn_mode);
        let next_obs = (&batch.next_obs[..], b);
        let next_logits = self.outputs_of(self.target_network(), next_obs, stats, true)?;
        let chooser = match self.config.double_dqn {
            true => Some(self.q_of(&self.online, &batch.next_obs, b, BnStats::Running)?),
            false => None,
        };
        self.distributions_from(batch, &next_logits, chooser.as_deref())
    }

    /// C51's projections of the next distributions (`next_logits` `[B, A, K]`, at the
    /// action of the largest expected value or `chooser`'s), or HL-Gauss's histograms
    /// of the scalar TD targets whose next Q-values are their expectations.
    fn distributions_from(
        &self,
        batch: &Batch,
        next_logits: &[f32],
        chooser: Option<&[f32]>,
    ) -> Result<Vec<f32>> {
        let rows = Bootstrap {
            rewards: &batch.rewards,
            terminated: &batch.terminated,
            gamma: self.config.gamma as f32,
        };
        let (loss, support) = (self.config.loss, &self.config.support);
        let values = self.online.support_values();
        Ok(target_distributions(
            loss,
            support,
            values,
            next_logits,
            chooser,
            &rows,
        ))
    }

    /// [`Self::joint_forward`] of a distributional head: the online logits of both
    /// halves, the first half's for the loss, the targets from the target network's
    /// logits over the same rows (or the online second half's, detached).
    fn joint_distributions(&self, batch: &Batch) -> Result<(UpdateForward, Targets)> {
        let b = batch.size;
        let both = [&batch.obs[..], &batch.next_obs[..]].concat();
        // The forward for the loss, and the next observations' logits, detached.
        let (forward, online_next) = match self.engine {
            Engine::Host => {
                let mut tape = HostTape::default();
                let stats = self.config.online_bn_mode;
                let logits = self
                    .online
                    .host_head(&both, 2 * b, stats, Some(&mut tape))?;
                let next = logits[logits.len() / 2..].to_vec();
                let rows = b;
                (UpdateForward::HostLogits { logits, rows, tape }, next)
            }
            _ => {
                let x = self.batch_tensor(&both, 2 * b)?;
                let pass = Pass::differentiable(self.config.online_bn_mode);
                let logits = self.online.forward_logits(&x, pass)?;
                let next = logits.narrow(0, b, b)?.detach().flatten_all()?.to_vec1()?;
                (UpdateForward::Logits(logits.narrow(0, 0, b)?), next)
            }
        };
        let online_next = &online_next[..];
        let targets = match self.config.target_update.bootstraps_from_online() {
            true => self.distributions_from(batch, online_next, None)?,
            false => {
                let stats = self.config.target_bn_mode;
                let t = self.outputs_of(&self.target, (&both, 2 * b), stats, true)?;
                let values = self.online.support_values();
                let chooser = self
                    .config
                    .double_dqn
                    .then(|| expectations(online_next, values));
                self.distributions_from(batch, &t[t.len() / 2..], chooser.as_deref())?
            }
        };
        Ok((forward, Targets::Distribution(targets)))
    }

    /// Scalar TD targets: on the host, or on an accelerator's device.
    fn regression_targets(&self, batch: &Batch) -> Result<Targets> {
        if self.engine == Engine::Device {
            return self.device_targets(batch).map(Targets::Device);
        }
        let b = batch.size;
        let next_obs = &batch.next_obs;
        let target_q = self.q_of(
            self.target_network(),
            next_obs,
            b,
            self.config.target_bn_mode,
        )?;
        let online_q = match self.config.double_dqn {
            true => Some(self.q_of(&self.online, next_obs, b, BnStats::Running)?),
            false => None,
        };
        Ok(Targets::Host(self.bootstrap(
            batch,
            &target_q,
            online_q.as_deref(),
        )))
    }

    /// `r + gamma (1 - terminated) Q(s', a*)` from the next observations' Q-values,
    /// `a*` their argmax or, with Double DQN, `online_q`'s.
    fn bootstrap(&self, batch: &Batch, target_q: &[f32], online_q: Option<&[f32]>) -> Vec<f32> {
        let (rewards, terminated) = (&batch.rewards[..], &batch.terminated[..]);
        let gamma = self.config.gamma as f32;
        let n_actions = self.online.n_actions();
        td::bootstrap_values(target_q, online_q, n_actions, (rewards, terminated), gamma)
    }

    /// [`Self::td_targets`] as tensor ops on an accelerator (no read back).
    fn device_targets(&self, batch: &Batch) -> Result<Tensor> {
        let next_obs = self.batch_tensor(&batch.next_obs, batch.size)?;
        let target_q = self
            .target_network()
            .forward(&next_obs, Pass::gradient_free(self.config.target_bn_mode))?;
        let online_q = match self.config.double_dqn {
            true => Some(self.online.forward(&next_obs, Pass::EVAL)?),
            false => None,
        };
        let best = td::best_next(&target_q, online_q.as_ref())?;
        self.device_bootstrap(batch, &best)
    }

    /// [`Self::bootstrap`] on the device (`td::bootstrap`), from each next
    /// observation's chosen Q-value.
    fn device_bootstrap(&self, batch: &Batch, best: &Tensor) -> Result<Tensor> {
        let b = batch.size;
        let rewards = Tensor::from_slice(&batch.rewards, b, &self.device)?;
        let terminated = Tensor::from_slice(&batch.terminated, b, &self.device)?;
        let gamma = td::Discount::All(self.config.gamma);
        td::bootstrap(&rewards, &terminated, best, gamma)
    }

    /// CrossQ's joint forward: one differentiable forward over the observations and the
    /// next observations (2B rows), so batch statistics come from both halves; the
    /// first half's Q-values enter the loss. The targets come from the second half:
    /// of the online network's forward, detached, without a target network (CrossQ);
    /// with one (CrossQ with weight norm, XQC), of the target network's own forward over
    /// the same 2B rows in `target_bn_mode`, the online half choosing with Double DQN.
    fn joint_forward(&self, batch: &Batch) -> Result<(UpdateForward, Targets)> {
        if self.config.loss.is_distributional() {
            return self.joint_distributions(batch);
        }
        let (b, n_actions) = (batch.size, self.online.n_actions());
        let both = [&batch.obs[..], &batch.next_obs[..]].concat();
        let stats = self.config.online_bn_mode;
        let from_target = !self.config.target_update.bootstraps_from_online();
        let target_stats = self.config.target_bn_mode;
        if self.engine == Engine::Host {
            let mut tape = HostTape::default();
            let q = self
                .online
                .host_forward(&both, 2 * b, stats, Some(&mut tape))?;
            let online_next = &q[b * n_actions..];
            let targets = match from_target {
                false => self.bootstrap(batch, online_next, None),
                true => {
                    let t = self.target.host_forward(&both, 2 * b, target_stats, None)?;
                    let chooser = self.config.double_dqn.then_some(online_next);
                    self.bootstrap(batch, &t[b * n_actions..], chooser)
                }
            };
            let forward = UpdateForward::Host { q, rows: b, tape };
            return Ok((forward, Targets::Host(targets)));
        }
        let x = self.batch_tensor(&both, 2 * b)?;
        let q_all = self.online.forward(&x, Pass::differentiable(stats))?;
        let (q, online_next) = td::split_joint(&q_all, 0, b)?;
        let (next_q, chooser) = match from_target {
            false => (online_next, None),
            true => {
                let t = self.target.forward(&x, Pass::gradient_free(target_stats))?;
                let chooser = self.config.double_dqn.then_some(online_next);
                (t.narrow(0, b, b)?.contiguous()?, chooser)
            }
        };
        let targets = match self.engine {
            Engine::Device => {
                let best = td::best_next(&next_q, chooser.as_ref())?;
                Targets::Device(self.device_bootstrap(batch, &best)?)
            }
            _ => {
                let chooser = chooser.map(|c| c.flatten_all()?.to_vec1()).transpose()?;
                let next = next_q.flatten_all()?.to_vec1()?;
                Targets::Host(self.bootstrap(batch, &next, chooser.as_deref()))
            }
        };
        Ok((UpdateForward::Graph(q), targets))
    }

    /// The online network's Q-values (a distributional head's logits) of the batch's
    /// observations, differentiable, with the batch-norm statistics of
    /// `dqn.online_bn_mode`.
    fn q_for_update(&self, batch: &Batch) -> Result<UpdateForward> {
        let (stats, rows) = (self.config.online_bn_mode, batch.size);
        let distributional = self.config.loss.is_distributional();
        if self.engine == Engine::Host {
            let mut tape = HostTape::default();
            // The head's output: a distributional head's logits, else the Q-values.
            let out = self
                .online
                .host_head(&batch.obs, rows, stats, Some(&mut tape))?;
            return Ok(match distributional {
                true => UpdateForward::HostLogits {
                    logits: out,
                    rows,
                    tape,
                },
                false => UpdateForward::Host { q: out, rows, tape },
            });
        }
        let obs = self.batch_tensor(&batch.obs, rows)?;
        let pass = Pass::differentiable(stats);
        Ok(match distributional {
            true => UpdateForward::Logits(self.online.forward_logits(&obs, pass)?),
            false => UpdateForward::Graph(self.online.forward(&obs, pass)?),
        })
    }

    /// The TD loss (with the mean Q of the taken actions) and every trainable
    /// variable's gradient.
    fn loss_and_gradients(
        &self,
        q: UpdateForward,
        batch: &Batch,
        targets: &Targets,
    ) -> Result<(LossInfo, Gradients)> {
        let actions = &batch.actions;
        // The config's checks keep a distributional loss off these arms.
        let kind = self.config.loss.regression().unwrap_or(Loss::Huber);
        match (q, targets) {
            (UpdateForward::Host { q, rows, tape }, Targets::Host(targets)) => {
                let n_actions = self.online.n_actions();
                let taken = &q[..rows * n_actions];
                let (loss, mut dq) = host_loss(taken, n_actions, actions, targets, kind)?;
                // Rows past the batch (a joint forward's next observations) feed the
                // targets only: no gradient.
                dq.resize(q.len(), 0.0);
                let grads = self.online.host_backward(tape, &dq)?;
                Ok((loss, Gradients::Host(grads)))
            }
            (UpdateForward::Graph(q), Targets::Host(targets)) => {
                let (loss, tensor) = graph_loss(&q, actions, targets, kind)?;
                Ok((loss, Gradients::Graph(tensor.backward()?)))
            }
            (UpdateForward::Graph(q), Targets::Device(targets)) => {
                let (loss, tensor) = device_loss(&q, actions, targets, kind)?;
                Ok((loss, Gradients::Graph(tensor.backward()?)))
            }
            (UpdateForward::HostLogits { logits, rows, tape }, Targets::Distribution(m)) => {
                let values = self.online.support_values();
                let shape = (rows, self.online.n_actions(), values.len());
                let taken = &logits[..rows * shape.1 * shape.2];
                let (loss, mut dl) = host_distribution_loss(taken, shape, values, actions, m)?;
                // A joint forward's next observations feed the targets only.
                dl.resize(logits.len(), 0.0);
                let grads = self.online.host_backward(tape, &dl)?;
                Ok((loss, Gradients::Host(grads)))
            }
            (UpdateForward::Logits(logits), Targets::Distribution(targets)) => {
                let values = self.online.support().expect("a distributional head");
                let (loss, tensor) = distribution_loss(&logits, values, actions, targets)?;
                Ok((loss, Gradients::Graph(tensor.backward()?)))
            }
            _ => candle_core::bail!("the update's forward and its targets do not match"),
        }
    }

    /// Counts the update, then projects (SVB, BBN) and syncs the target when due.
    fn finish_update(&mut self, loss: LossInfo, grad_norm: Metric) -> Result<UpdateInfo> {
        self.updates += 1;
        let projected = self.online.after_optimizer_step(self.updates)?;
        let synced = match self.config.target_update.after(self.updates) {
            TargetSync::Copy => {
                self.target.copy_from(&self.online)?;
                true
            }
            TargetSync::Average(tau) => {
                self.target
                    .store()
                    .soft_update_from(self.online.store(), tau)?;
                true
            }
            TargetSync::Keep => false,
        };
        Ok(UpdateInfo {
            td_loss: loss.value,
            q_mean: loss.q_mean,
            grad_norm,
            projected,
            value_entropy: loss.entropy,
            synced,
        })
    }
}

/// Epsilon-greedy among `n` actions: one uniform draw decides, a second picks the random
/// action; `greedy` runs only when it is chosen. Every agent draws this way, alone or
/// in a population, so that both draw the same numbers.
pub fn epsilon_greedy<R: Rng>(
    rng: &mut R,
    epsilon: f64,
    n: usize,
    greedy: impl FnOnce() -> Result<usize>,
) -> Result<usize> {
    if rng.random::<f64>() < epsilon {
        Ok(rng.random_range(0..n))
    } else {
        greedy()
    }
}
