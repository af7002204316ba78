//! One DQN update for a whole population, each step one tensor operation over all
//! agents: TD targets, the TD loss (each agent's mean over its batch, summed over
//! agents, so that each agent's gradient is its own), gradient clipping per agent, and
//! Adam with each agent's moments. Agents train exactly as they would alone.

use candle_core::{Device, Result, Tensor, Var, D};

use super::PopulationNet;
use crate::dqn::{DqnConfig, Loss, TargetUpdate};
use crate::nn::BnStats;
use crate::optim::{OptimizerConfig, OptimizerKind};
use crate::replay::Batch;

/// Adam's moments of one variable, `[P, ...]` like it.
struct Moments {
    m: Tensor,
    v: Tensor,
}

pub struct PopulationDqn {
    online: PopulationNet,
    target: PopulationNet,
    config: DqnConfig,
    optimizer: OptimizerConfig,
    moments: Vec<Moments>,
    updates: u64,
}

impl PopulationDqn {
    /// Trains `online` (its target starts as a copy, as a single agent's does at its
    /// first update). Adam only so far; no Polyak or target-free updates yet.
    pub fn new(
        online: PopulationNet,
        config: DqnConfig,
        optimizer: OptimizerConfig,
    ) -> Result<Self> {
        if optimizer.kind != OptimizerKind::Adam
            || !matches!(config.target_update, TargetUpdate::Hard { .. })
            || config.joint_forward
        {
            candle_core::bail!("populations support Adam with hard target updates so far");
        }
        let moments = online
            .vars()
            .iter()
            .map(|(_, v)| {
                let zeros = v.as_tensor().zeros_like()?;
                Ok(Moments {
                    m: zeros.clone(),
                    v: zeros,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let target = online.duplicate()?;
        Ok(Self {
            online,
            target,
            config,
            optimizer,
            moments,
            updates: 0,
        })
    }

    pub fn online(&self) -> &PopulationNet {
        &self.online
    }

    /// One update of every agent on its own batch (`batches[i]` is agent `i`'s, all of
    /// one size); each agent's mean TD loss.
    pub fn update(&mut self, batches: &[Batch]) -> Result<Vec<f32>> {
        let per_agent = self.losses(batches)?;
        let grads = per_agent.sum_all()?.backward()?;
        let scale = self.clipping_scales(&grads)?;
        self.adam_step(&grads, &scale)?;
        self.updates += 1;
        if let TargetUpdate::Hard { every } = self.config.target_update {
            if self.updates.is_multiple_of(every) {
                self.target.copy_from(&self.online)?;
            }
        }
        per_agent.to_vec1()
    }

    /// Each agent's TD loss on its batch, `[P]`, through candle's graph.
    fn losses(&self, batches: &[Batch]) -> Result<Tensor> {
        let stacked = Stacked::of(batches, &self.device())?;
        let targets = self.targets(&stacked)?;
        let q = self
            .online
            .forward(&stacked.obs, self.config.online_bn_mode)?;
        let taken = q.gather(&stacked.actions, 2)?.squeeze(2)?;
        td_loss(&(taken - targets)?, self.config.loss)
    }

    /// The operations the backward of an update on `batches` goes through: the nodes of
    /// the loss's graph. Independent of the population's size (one batched operation
    /// per step of the network, whatever P).
    pub fn loss_graph_nodes(&self, batches: &[Batch]) -> Result<usize> {
        Ok(self.losses(batches)?.sum_all()?.sorted_nodes().len())
    }

    fn device(&self) -> Device {
        self.online.vars()[0].1.device().clone()
    }

    /// `r + gamma (1 - terminated) Q_target(s', a*)`, `[P, B]`, `a*` the target's
    /// argmax or (Double DQN) the online network's.
    fn targets(&self, b: &Stacked) -> Result<Tensor> {
        let next_q = self
            .target
            .forward(&b.next_obs, self.config.target_bn_mode)?;
        let best = match self.config.double_dqn {
            false => next_q.max(D::Minus1)?,
            true => {
                let online = self.online.forward(&b.next_obs, BnStats::Running)?;
                let a = online.argmax_keepdim(D::Minus1)?;
                next_q.gather(&a, 2)?.squeeze(2)?
            }
        };
        let keep = (b.terminated.affine(-1.0, 1.0)? * self.config.gamma)?;
        (&b.rewards + (best * keep)?)?.detach().contiguous()
    }

    /// Per agent, the factor that clips its gradients' global norm to `max_grad_norm`
    /// (1 below it), `[P]`.
    fn clipping_scales(&self, grads: &candle_core::backprop::GradStore) -> Result<Tensor> {
        let p = self.online.agents();
        let mut sum = Tensor::zeros(p, candle_core::DType::F32, &self.device())?;
        for (_, var) in self.online.vars() {
            if let Some(g) = grads.get(var.as_tensor()) {
                sum = (sum + g.sqr()?.flatten_from(1)?.sum(1)?)?;
            }
        }
        let max = self.optimizer.max_grad_norm;
        let ones = Tensor::ones(p, candle_core::DType::F32, &self.device())?;
        if max <= 0.0 {
            return Ok(ones);
        }
        let norm = sum.sqrt()?;
        let clipped = norm.affine(1.0, 1e-6)?.recip()?.affine(max, 0.0)?;
        norm.gt(max)?.where_cond(&clipped, &ones)
    }

    /// Adam with the single optimizer's arithmetic, each agent's gradients scaled by
    /// its clipping factor.
    fn adam_step(
        &mut self,
        grads: &candle_core::backprop::GradStore,
        scale: &Tensor,
    ) -> Result<()> {
        let c = &self.optimizer;
        let t = (self.updates + 1) as i32;
        let (b1, b2) = c.betas;
        let step = c.lr as f32 / (1.0 - b1.powi(t)) as f32;
        let inv_bias2_sqrt = 1.0 / ((1.0 - b2.powi(t)).sqrt() as f32);
        let vars: Vec<Var> = self
            .online
            .vars()
            .iter()
            .map(|(_, v)| (*v).clone())
            .collect();
        for (var, moments) in vars.iter().zip(&mut self.moments) {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let mut shape = vec![1; g.rank()];
            shape[0] = scale.dim(0)?;
            let g = g.broadcast_mul(&scale.reshape(shape)?)?;
            moments.m = ((&moments.m * b1)? + (&g * (1.0 - b1))?)?;
            moments.v = ((&moments.v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let denominator = ((moments.v.sqrt()? * f64::from(inv_bias2_sqrt))? + c.adam_eps)?;
            let delta = ((&moments.m * f64::from(step))? / denominator)?;
            var.set(&(var.as_tensor() - delta)?)?;
        }
        Ok(())
    }
}

/// Each agent's mean loss over its batch, `[P]`, of TD errors `[P, B]`.
fn td_loss(diff: &Tensor, loss: Loss) -> Result<Tensor> {
    let per_value = match loss {
        Loss::Mse => diff.sqr()?,
        Loss::Huber => {
            let abs = diff.abs()?;
            let quadratic = abs.clamp(0.0, 1.0)?;
            ((quadratic.sqr()? * 0.5)? + (abs - &quadratic)?)?
        }
    };
    per_value.mean(1)
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
    fn of(batches: &[Batch], device: &Device) -> Result<Self> {
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
        Ok(Self {
            obs: Tensor::from_vec(gather(|x| &x.obs), (p, b, obs_len), device)?,
            next_obs: Tensor::from_vec(gather(|x| &x.next_obs), (p, b, obs_len), device)?,
            actions: Tensor::from_vec(actions, (p, b, 1), device)?,
            rewards: Tensor::from_vec(gather(|x| &x.rewards), (p, b), device)?,
            terminated: Tensor::from_vec(gather(|x| &x.terminated), (p, b), device)?,
        })
    }
}
