//! The DQN learner: online and target Q-networks, the TD update and epsilon-greedy
//! acting.
//!
//! ```
//! use candle_core::Device;
//! use normrl_agents::dqn::{Batch, Dqn, DqnConfig};
//! use normrl_agents::nn::{NormConfig, QNetworkConfig};
//! use normrl_agents::optim::OptimizerConfig;
//!
//! let mut dqn = Dqn::new(
//!     &QNetworkConfig::mlp(vec![16]), &NormConfig::default(), &OptimizerConfig::default(),
//!     &DqnConfig::default(), &[4], 2, 0, &Device::Cpu,
//! ).unwrap();
//! let mut batch = Batch::new(8, 4);
//! batch.actions.fill(1);
//! let info = dqn.update(&batch).unwrap();
//! assert!(info.td_loss.value().unwrap().is_finite());
//! assert!(dqn.greedy_action(&[0.0; 4]).unwrap() < 2);
//! ```

use candle_core::{Device, Result, Tensor};
use rand::Rng;

use super::td_loss::{mean_taken, mean_taken_values, td_loss, td_loss_host, td_loss_reference};
use super::{Batch, DqnConfig, TargetUpdate};
use crate::nn::{HostTape, Mode, NormConfig, QNetwork, QNetworkConfig};
use crate::optim::{Optimizer, OptimizerConfig};
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
    /// MLPs on the CPU run without a graph (see [`QNetwork::host_forward`]).
    host_path: bool,
}

impl Dqn {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        network: &QNetworkConfig,
        norm: &NormConfig,
        optimizer: &OptimizerConfig,
        config: &DqnConfig,
        obs_shape: &[usize],
        n_actions: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        let online = QNetwork::new(network, norm, obs_shape, n_actions, seed, device)?;
        let target = QNetwork::new(network, norm, obs_shape, n_actions, seed, device)?;
        target.copy_from(&online)?;
        let optimizer = Optimizer::new(online.store(), optimizer, norm.g_lr_scale);
        Ok(Self {
            online,
            target,
            optimizer,
            config: config.clone(),
            device: device.clone(),
            updates: 0,
            initialized: false,
            host_path: true,
        })
    }

    /// Whether acting, TD targets and updates run on host values where the network
    /// allows it (on by default). Off, they always go through candle's graph: the
    /// reference the host path is tested against.
    pub fn set_host_path(&mut self, on: bool) {
        self.host_path = on;
    }

    /// True when this agent's networks run on host values.
    pub fn runs_on_host(&self) -> bool {
        self.host_path && self.online.runs_on_host()
    }

    pub fn online(&self) -> &QNetwork {
        &self.online
    }

    pub fn target(&self) -> &QNetwork {
        &self.target
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
        if self.runs_on_host() {
            return self
                .online
                .host_forward(obs, 1, self.config.acting_bn_mode, None);
        }
        let x = self.batch_tensor(obs, 1)?;
        self.online
            .forward(&x, self.config.acting_bn_mode)?
            .squeeze(0)?
            .to_vec1()
    }

    pub fn greedy_action(&self, obs: &[f32]) -> Result<usize> {
        Ok(first_argmax(&self.q_values(obs)?))
    }

    /// Epsilon-greedy: one uniform draw decides, a second picks the random action.
    pub fn act<R: Rng>(&self, obs: &[f32], epsilon: f64, rng: &mut R) -> Result<usize> {
        if rng.random::<f64>() < epsilon {
            Ok(rng.random_range(0..self.online.n_actions()))
        } else {
            self.greedy_action(obs)
        }
    }

    /// `r + gamma * (1 - terminated) * Q_target(s', a*)`, with `a*` the target's
    /// argmax, or the online network's with Double DQN. Truncated transitions
    /// bootstrap from their final observation like any other.
    pub fn td_targets(&self, batch: &Batch) -> Result<Tensor> {
        if self.device.is_cpu() {
            return Tensor::from_vec(self.td_target_values(batch)?, batch.size, &self.device);
        }
        self.td_targets_reference(batch)
    }

    /// [`Self::td_targets`] through tensor ops on the networks' device (the path on
    /// accelerators, and the reference the host path is tested against).
    pub fn td_targets_reference(&self, batch: &Batch) -> Result<Tensor> {
        let b = batch.size;
        let next_obs = self.batch_tensor(&batch.next_obs, b)?;
        let rewards = Tensor::from_slice(&batch.rewards, b, &self.device)?;
        let terminated = Tensor::from_slice(&batch.terminated, b, &self.device)?;
        let next_q = if self.config.double_dqn {
            let best = self
                .online
                .forward(&next_obs, Mode::Eval)?
                .argmax_keepdim(1)?;
            self.target
                .forward(&next_obs, self.config.target_bn_mode)?
                .gather(&best, 1)?
                .squeeze(1)?
        } else {
            self.target
                .forward(&next_obs, self.config.target_bn_mode)?
                .max(1)?
        };
        let bootstrap = ((1.0 - terminated)? * self.config.gamma)?;
        (rewards + (next_q.detach() * bootstrap)?)?
            .detach()
            .contiguous()
    }

    /// [`Self::td_targets`] on the host: the networks' Q-values are read back and the
    /// rest is a loop, not a tensor op per term (on the CPU reading back is free).
    fn td_target_values(&self, batch: &Batch) -> Result<Vec<f32>> {
        let (b, n_actions) = (batch.size, self.online.n_actions());
        let q_of = |net: &QNetwork, mode: Mode| -> Result<Vec<f32>> {
            if self.runs_on_host() {
                net.host_forward(&batch.next_obs, b, mode, None)
            } else {
                let next_obs = self.batch_tensor(&batch.next_obs, b)?;
                net.forward(&next_obs, mode)?.flatten_all()?.to_vec1()
            }
        };
        let target_q = q_of(&self.target, self.config.target_bn_mode)?;
        let target_q: Vec<&[f32]> = target_q.chunks_exact(n_actions).collect();
        let chosen: Vec<usize> = if self.config.double_dqn {
            let online_q = q_of(&self.online, Mode::Eval)?;
            online_q.chunks_exact(n_actions).map(first_argmax).collect()
        } else {
            target_q.iter().map(|q| first_argmax(q)).collect()
        };
        let gamma = self.config.gamma as f32;
        Ok(target_q
            .iter()
            .zip(&chosen)
            .zip(batch.rewards.iter().zip(&batch.terminated))
            .map(|((q, &a), (&r, &t))| r + q[a] * ((1.0 - t) * gamma))
            .collect())
    }

    /// One gradient step on `batch`. On the first call, weight norm's data-dependent
    /// init runs on this batch and the target network is synced from the result.
    pub fn update(&mut self, batch: &Batch) -> Result<UpdateInfo> {
        let b = batch.size;
        let obs = self.batch_tensor(&batch.obs, b)?;
        if !self.initialized {
            if self.online.wants_data_dependent_init() {
                self.online.data_dependent_init(&obs)?;
            }
            self.target.copy_from(&self.online)?;
            self.initialized = true;
        }
        if self.runs_on_host() {
            return self.host_update(batch);
        }
        let target = if self.device.is_cpu() {
            Targets::Host(self.td_target_values(batch)?)
        } else {
            Targets::Device(self.td_targets_reference(batch)?)
        };
        let q = self
            .online
            .forward_for_update(&obs, self.config.online_bn_mode)?;
        let (loss, q_mean) = match &target {
            Targets::Host(target) => {
                let loss = td_loss(&q, &batch.actions, target, self.config.loss)?;
                (loss, Metric::Host(mean_taken(&q, &batch.actions)?))
            }
            Targets::Device(target) => {
                let actions = Tensor::from_slice(&batch.actions, (b, 1), &self.device)?;
                let loss = td_loss_reference(&q, &actions, target, self.config.loss)?;
                let q_mean = q.gather(&actions, 1)?.mean_all()?;
                (loss, Metric::of(&q_mean)?)
            }
        };
        let grads = loss.backward()?;
        let grad_norm = self.optimizer.step(&grads)?;
        self.finish_update(Metric::of(&loss)?, q_mean, grad_norm)
    }

    /// [`Self::update`] on host values, for networks that run there.
    fn host_update(&mut self, batch: &Batch) -> Result<UpdateInfo> {
        let targets = self.td_target_values(batch)?;
        let mut tape = HostTape::default();
        let q = self.online.host_forward(
            &batch.obs,
            batch.size,
            self.config.online_bn_mode,
            Some(&mut tape),
        )?;
        let n_actions = self.online.n_actions();
        let (loss, dq) = td_loss_host(&q, n_actions, &batch.actions, &targets, self.config.loss)?;
        let q_mean = Metric::Host(mean_taken_values(&q, n_actions, &batch.actions)?);
        let grads = self.online.host_backward(tape, &dq)?;
        let grad_norm = self.optimizer.step_host(&grads)?;
        self.finish_update(Metric::Host(f64::from(loss)), q_mean, grad_norm)
    }

    /// Counts the update, then projects (SVB, BBN) and syncs the target when due.
    fn finish_update(
        &mut self,
        td_loss: Metric,
        q_mean: Metric,
        grad_norm: Metric,
    ) -> Result<UpdateInfo> {
        self.updates += 1;
        let projected = self.online.after_optimizer_step(self.updates)?;
        let synced = match self.config.target_update {
            TargetUpdate::Hard { every } => {
                let due = self.updates.is_multiple_of(every);
                if due {
                    self.target.copy_from(&self.online)?;
                }
                due
            }
            TargetUpdate::Polyak { tau } => {
                self.target
                    .store()
                    .soft_update_from(self.online.store(), tau)?;
                true
            }
        };
        Ok(UpdateInfo {
            td_loss,
            q_mean,
            grad_norm,
            projected,
            synced,
        })
    }
}

/// TD targets where the loss reads them: the host on the CPU; elsewhere the device,
/// since reading them back would wait for it.
enum Targets {
    Host(Vec<f32>),
    Device(Tensor),
}

/// The index of the first largest value (0 for an empty slice).
fn first_argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}
