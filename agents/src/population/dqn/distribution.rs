//! A population's distributional loss (`dqn.loss = "c51"` or `"hl_gauss"`). On the
//! CPU's fused path each agent's target distributions and loss are the single agent's
//! host functions (`dqn::distribution`) on its own rows, with its own discount, so that
//! a member trains as it would alone; the head's logits `[P, B, A K]` come from the
//! population's one forward, and their gradient, `(p - m) / B` on each taken action's,
//! goes back through the fused ops' explicit backward. Elsewhere (a device, the tensor
//! forms, XQC's joint forward) the targets are the tensor forms of the same functions
//! (`dqn::distribution_targets`, nothing read back to the host) and the loss goes
//! through candle's graph.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, WithDType, D};

use super::{NextOutputs, PopulationDqn};
use crate::count::read_to_host;
use crate::dqn::distribution::{host_distribution_loss, target_distributions, Bootstrap};
use crate::dqn::distribution_targets::{SupportTensors, TensorBootstrap};
use crate::dqn::td::first_argmax;
use crate::nn::{expectations, BnStats};
use crate::population::inputs::Stacked;
use crate::population::net::Path;

/// A tensor's values on the host, flattened, counted as one read (`crate::count`).
fn host<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    read_to_host(&t.flatten_all()?)
}

impl PopulationDqn {
    /// Whether the agents learn a distribution of the value.
    pub(super) fn distributional(&self) -> bool {
        self.config.loss.is_distributional()
    }

    /// Whether the targets are the single agents' host functions (the CPU's fused
    /// path), not their tensor forms.
    pub(super) fn host_distributions(&self) -> bool {
        self.online.path(false) == Path::CpuOps
    }

    /// The head's values `[K]` (C51's atoms, HL-Gauss's bin centres).
    fn values(&self) -> &[f32] {
        self.online.support()
    }

    /// The support's constants on the device.
    fn forms(&self) -> Result<&SupportTensors> {
        match &self.support_tensors {
            Some(forms) => Ok(forms),
            None => candle_core::bail!("a distributional loss without its support's tensors"),
        }
    }

    /// The Q-values `[P, B, A]` of the network's output: the expectations of a
    /// distributional head's logits, a regression head's values as they are.
    pub(super) fn q_of(&self, out: Tensor) -> Result<Tensor> {
        match &self.support_tensors {
            Some(forms) => forms.q_values(&out),
            None => Ok(out),
        }
    }

    /// Each agent's greedy action on its observation `x` `[P, 1, obs]` on the host: the
    /// largest expected value, as a single agent's.
    pub(super) fn distribution_greedy(&self, x: &Tensor) -> Result<Vec<u32>> {
        let logits = self.online.forward(x, self.config.acting_bn_mode)?;
        let q = expectations(&host(&logits)?, self.values());
        let a = self.online.actions();
        Ok(q.chunks_exact(a).map(|q| first_argmax(q) as u32).collect())
    }

    /// The next observations' logits (the targets first, as a single agent's: a
    /// target-free agent's running statistics then see the next observations before
    /// the observations).
    fn next_logits(&self, b: &Stacked) -> Result<NextOutputs> {
        let target = match self.config.target_update.bootstraps_from_online() {
            true => &self.online,
            false => &self.target,
        };
        let next = target.forward(&b.next_obs, self.config.target_bn_mode)?;
        let chooser = match self.config.double_dqn {
            true => Some(self.online.forward(&b.next_obs, BnStats::Running)?),
            false => None,
        };
        Ok(NextOutputs { next, chooser })
    }

    /// Each agent's target distributions `[P, B, K]` from `logits`: the host functions'
    /// on the CPU's fused path, else their tensor forms.
    fn targets_of(&self, b: &Stacked, logits: &NextOutputs) -> Result<Tensor> {
        let (p, rows) = b.rewards.dims2()?;
        if self.host_distributions() {
            let targets = self.host_targets(b, logits)?;
            let k = self.values().len();
            return Tensor::from_vec(targets, (p, rows, k), b.rewards.device());
        }
        let forms = self.forms()?;
        let chooser = match &logits.chooser {
            Some(c) => Some(forms.q_values(c)?),
            None => None,
        };
        let bootstrap = TensorBootstrap {
            rewards: &b.rewards,
            terminated: &b.terminated,
            gamma: self.discount(),
        };
        forms.targets(&logits.next, chooser.as_ref(), &bootstrap)
    }

    /// Each agent's target distributions `[P, B, K]` (host values, row-major): a
    /// single agent's function on each agent's rows, with its own discount.
    fn host_targets(&self, b: &Stacked, logits: &NextOutputs) -> Result<Vec<f32>> {
        let next: Vec<f32> = host(&logits.next)?;
        let chooser = match &logits.chooser {
            Some(c) => Some(expectations(&host(c)?, self.values())),
            None => None,
        };
        let chooser = chooser.as_deref();
        let (rewards, terminated) = (host(&b.rewards)?, host(&b.terminated)?);
        let (p, rows) = b.rewards.dims2()?;
        let gammas = match &self.gammas {
            Some(g) => host(g)?,
            None => vec![self.config.gamma as f32; p],
        };
        let (loss, support, values) = (self.config.loss, &self.config.support, self.values());
        let (a, k) = (self.online.actions(), values.len());
        let mut out = Vec::with_capacity(p * rows * k);
        for (i, &gamma) in gammas.iter().enumerate() {
            let at = i * rows;
            let bootstrap = Bootstrap {
                rewards: &rewards[at..at + rows],
                terminated: &terminated[at..at + rows],
                gamma,
            };
            let next = &next[at * a * k..(at + rows) * a * k];
            let chooser = chooser.map(|c| &c[at * a..(at + rows) * a]);
            out.extend(target_distributions(
                loss, support, values, next, chooser, &bootstrap,
            ));
        }
        Ok(out)
    }

    /// The joint forward (XQC's, [`Self::joint_outputs`]): the observations' logits and
    /// the targets from the next observations'.
    fn joint_distributions(&self, b: &Stacked) -> Result<(Tensor, Tensor)> {
        let (logits, next) = self.joint_outputs(b)?;
        Ok((logits, self.targets_of(b, &next)?))
    }

    /// Each agent's loss, mean expected Q of its taken actions and their mean entropy
    /// `[3, P]`, and the gradients, by the fused ops' explicit backward where the online
    /// network has one (`None` elsewhere).
    pub(super) fn distribution_gradients(
        &self,
        stacked: &Stacked,
    ) -> Result<Option<(Tensor, GradStore)>> {
        if !self.host_distributions() {
            return Ok(None);
        }
        // The targets first, as the graph's path and a single agent's.
        let targets = self.host_targets(stacked, &self.next_logits(stacked)?)?;
        let stats = self.config.online_bn_mode;
        let Some((logits, tape)) = self.online.forward_with_tape(&stacked.obs, stats)? else {
            return Ok(None);
        };
        let (metrics, dlogits) = self.host_losses(&logits, &stacked.actions, &targets)?;
        let grads = self.online.backward(tape, &dlogits)?;
        Ok(Some((metrics, grads)))
    }

    /// Each agent's [`host_distribution_loss`] on its rows: the metrics `[3, P]` (the
    /// loss, the mean expected Q of the taken actions, their distributions' mean
    /// entropy) and the gradient with respect to the logits `[P, B, A K]`.
    fn host_losses(
        &self,
        logits: &Tensor,
        actions: &Tensor,
        targets: &[f32],
    ) -> Result<(Tensor, Tensor)> {
        let (p, rows, width) = logits.dims3()?;
        let (values, device) = (self.values(), logits.device());
        let k = values.len();
        let shape = (rows, width / k, k);
        let all: Vec<f32> = host(logits)?;
        let actions: Vec<u32> = host(actions)?;
        let (mut metrics, mut q_means) = (Vec::with_capacity(3 * p), Vec::with_capacity(p));
        let mut entropies = Vec::with_capacity(p);
        let mut gradient = Vec::with_capacity(all.len());
        for i in 0..p {
            let logits = &all[i * rows * width..(i + 1) * rows * width];
            let actions = &actions[i * rows..(i + 1) * rows];
            let targets = &targets[i * rows * k..(i + 1) * rows * k];
            let (info, g) = host_distribution_loss(logits, shape, values, actions, targets)?;
            metrics.push(info.value.value()? as f32);
            q_means.push(info.q_mean.value()? as f32);
            entropies.push(info.entropy.unwrap_or(f64::NAN) as f32);
            gradient.extend(g);
        }
        metrics.extend(q_means);
        metrics.extend(entropies);
        Ok((
            Tensor::from_vec(metrics, (3, p), device)?,
            Tensor::from_vec(gradient, (p, rows, width), device)?,
        ))
    }

    /// Each agent's loss on its batch `[P]` through candle's graph (the tensor forms'
    /// path), and (detached) the mean expected Q of its taken actions and their
    /// distributions' mean entropy `[2, P]`.
    pub(super) fn distribution_losses(&self, stacked: &Stacked) -> Result<(Tensor, Tensor)> {
        let (logits, targets) = match self.config.joint_forward {
            true => self.joint_distributions(stacked)?,
            false => {
                let targets = self.targets_of(stacked, &self.next_logits(stacked)?)?;
                let stats = self.config.online_bn_mode;
                (self.online.forward_in_graph(&stacked.obs, stats)?, targets)
            }
        };
        let (p, rows, width) = logits.dims3()?;
        let k = self.values().len();
        let logits = logits.reshape((p, rows, width / k, k))?;
        let taken = stacked.actions.reshape((p, rows, 1, 1))?;
        let taken = taken.broadcast_as((p, rows, 1, k))?.contiguous()?;
        let log_p = candle_nn::ops::log_softmax(&logits.gather(&taken, 2)?.squeeze(2)?, D::Minus1)?;
        let losses = (targets * &log_p)?.sum(D::Minus1)?.neg()?.mean(1)?;
        let (log_p, p_taken) = (log_p.detach(), log_p.detach().exp()?);
        let values = self.forms()?.values();
        let q = p_taken.broadcast_mul(values)?.sum(D::Minus1)?.mean(1)?;
        let entropy = (p_taken * log_p)?.sum(D::Minus1)?.neg()?.mean(1)?;
        Ok((losses, Tensor::stack(&[q, entropy], 0)?))
    }
}
