//! A population in shards: its agents split into consecutive groups, each a
//! [`PopulationDqn`] of its own, stepped one after another.
//!
//! On a device a population is one shard, one sequence of launches for all agents. On
//! the CPU each op of a whole population's step streams every agent's values through
//! memory before the next op starts, and at P = 64 a MinAtar population's agents
//! updated 1.8x slower than at P = 1 (separate runs, each with a working set of one
//! agent, slowed 1.5x). A shard holds as many agents as keep its step's values within
//! the core's cache ([`cpu_shard_size`]). Each agent's arithmetic is its own in any
//! shard (per-agent loops), so a sharded population trains exactly as one shard
//! (`agents/tests/population.rs`).

use std::borrow::Borrow;

use candle_core::{Device, Result, Tensor};

use super::{DeviceFrames, PopulationDqn, PopulationInfo};
use crate::dqn::Dqn;
use crate::replay::Batch;

/// The working set a shard of CPU agents aims at: about a core's second-level cache.
const CPU_SHARD_BYTES: usize = 2 << 20;

pub struct ShardedPopulation {
    shards: Vec<PopulationDqn>,
    /// Agents per shard; the last holds the rest.
    size: usize,
}

impl ShardedPopulation {
    /// The single agents `agents` as one population, where each stands (as
    /// [`PopulationDqn::from_agents`]), in shards sized for their device and batches
    /// of `batch` rows: on the CPU as many agents as fit [`cpu_shard_size`], elsewhere
    /// all in one.
    pub fn from_agents(agents: &[&Dqn], batch: usize) -> Result<Self> {
        let Some(first) = agents.first() else {
            candle_core::bail!("a population needs at least one agent");
        };
        let size = match first.online().store().device().is_cpu() {
            true => cpu_shard_size(first, batch),
            false => agents.len(),
        };
        Self::with_shard_size(agents, size)
    }

    /// [`Self::from_agents`] with shards of `size` agents.
    pub fn with_shard_size(agents: &[&Dqn], size: usize) -> Result<Self> {
        PopulationDqn::check_alike(agents)?;
        let size = size.clamp(1, agents.len().max(1));
        let shards = agents
            .chunks(size)
            .map(PopulationDqn::from_agents)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { shards, size })
    }

    /// Each shard with CUDA graphs on or off ([`PopulationDqn::with_cuda_graphs`]).
    pub fn with_cuda_graphs(mut self, enabled: bool) -> Self {
        self.shards = self
            .shards
            .into_iter()
            .map(|s| s.with_cuda_graphs(enabled))
            .collect();
        self
    }

    pub fn agents(&self) -> usize {
        self.shards.iter().map(|s| s.online().agents()).sum()
    }

    /// Agents per shard (the last may hold fewer).
    pub fn shard_size(&self) -> usize {
        self.size
    }

    pub fn shards(&self) -> &[PopulationDqn] {
        &self.shards
    }

    pub fn device(&self) -> Device {
        self.shards[0].online().device().clone()
    }

    /// Each agent's greedy action on its own observation (`obs`: one row per agent):
    /// one forward and one read per shard.
    pub fn greedy_actions(&mut self, obs: &[f32]) -> Result<Vec<u32>> {
        let row = obs.len() / self.agents().max(1);
        let mut actions = Vec::with_capacity(self.agents());
        for (shard, rows) in self.shards.iter_mut().zip(obs.chunks(self.size * row)) {
            actions.extend(shard.greedy_actions(rows)?);
        }
        Ok(actions)
    }

    /// One update of every agent on its own batch (`batches[i]` is agent `i`'s), its
    /// observations gathered from `frames` when given: each agent's TD loss, mean Q
    /// of its taken actions and gradient norm `[3, P]`, still on the device.
    pub fn update_with_frames<B: Borrow<Batch> + Sync>(
        &mut self,
        batches: &[B],
        frames: Option<&DeviceFrames>,
    ) -> Result<PopulationInfo> {
        self.update_on(batches, frames, None)
    }

    /// [`Self::update_with_frames`] with the shards spread over `pool`'s threads where
    /// given (each shard's arithmetic is its own, so the results do not depend on the
    /// threads).
    pub fn update_on<B: Borrow<Batch> + Sync>(
        &mut self,
        batches: &[B],
        frames: Option<&DeviceFrames>,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<PopulationInfo> {
        use rayon::prelude::*;
        let agents = self.agents();
        if batches.len() != agents {
            candle_core::bail!("{} batches for {agents} agents", batches.len());
        }
        let (size, several) = (self.size, self.shards.len() > 1);
        let step = |(i, (shard, batches)): (usize, (&mut PopulationDqn, &[B]))| {
            let frames = frames.map(|f| f.members_from(i * size));
            Ok(shard.update_with_frames(batches, frames.as_ref())?.metrics)
        };
        let shards = self.shards.iter_mut().zip(batches.chunks(size)).enumerate();
        let mut metrics: Vec<Tensor> = match pool {
            Some(pool) if several => pool.install(|| {
                let shards: Vec<_> = shards.collect();
                shards.into_par_iter().map(step).collect::<Result<_>>()
            })?,
            _ => shards.map(step).collect::<Result<_>>()?,
        };
        let metrics = match metrics.len() {
            1 => metrics.remove(0),
            _ => Tensor::cat(&metrics, 1)?,
        };
        Ok(PopulationInfo { metrics })
    }

    /// [`Self::update_with_frames`] with the observations in the batches.
    pub fn update<B: Borrow<Batch> + Sync>(&mut self, batches: &[B]) -> Result<PopulationInfo> {
        self.update_with_frames(batches, None)
    }

    /// Writes agent `i` where it stands into the single agent `agent`
    /// ([`PopulationDqn::export_agent`]).
    pub fn export_agent(&self, i: usize, agent: &mut Dqn) -> Result<()> {
        self.export_agents(&mut [(i, agent)])
    }

    /// [`Self::export_agent`] for several agents, `(i, agent)` each, one export per
    /// shard.
    pub fn export_agents(&self, agents: &mut [(usize, &mut Dqn)]) -> Result<()> {
        let p = self.agents();
        if let Some((i, _)) = agents.iter().find(|(i, _)| *i >= p) {
            candle_core::bail!("no agent {i} in a population of {p}");
        }
        for (s, shard) in self.shards.iter().enumerate() {
            let mut mine: Vec<(usize, &mut Dqn)> = agents
                .iter_mut()
                .filter(|(i, _)| *i / self.size == s)
                .map(|(i, a)| (*i - s * self.size, &mut **a))
                .collect();
            if !mine.is_empty() {
                shard.export_agents(&mut mine)?;
            }
        }
        Ok(())
    }
}

/// How many of `agent`'s kind fit one CPU shard: [`CPU_SHARD_BYTES`] over what an
/// agent's step touches, its variables (the weights, their gradients, the optimizer's
/// two moments and the target's copy) and a batch's (`batch` rows) activations forward
/// and back.
pub fn cpu_shard_size(agent: &Dqn, batch: usize) -> usize {
    let net = agent.online();
    let params: usize = net
        .store()
        .params()
        .iter()
        .map(|p| p.var.elem_count())
        .sum();
    let mut shape = net.obs_shape().to_vec();
    let mut units = shape.iter().product::<usize>();
    for layer in net.layers() {
        shape = layer.kernel().output_shape(&shape);
        units += shape.iter().product::<usize>();
    }
    // A layer's product, its output and the gradients of both, each a batch's rows.
    let activations = 4 * units * batch;
    let bytes = 4 * (5 * params + activations);
    (CPU_SHARD_BYTES / bytes.max(1)).max(1)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::nn::{NormConfig, QNetworkConfig};

    fn agent(network: QNetworkConfig, obs: &[usize]) -> Dqn {
        let norm = NormConfig::default();
        Dqn::with_defaults((&network, &norm), obs, 3, 0).unwrap()
    }

    /// A MinAtar CNN agent's step (about 2.7 MB of variables with their gradients and
    /// moments) fills a shard alone; CartPole's small MLP shares one with a dozen or
    /// more; a shard is never empty.
    #[test]
    fn shards_hold_what_fits_the_cache() {
        let cnn = agent(QNetworkConfig::minatar_cnn(), &[4, 10, 10]);
        assert_eq!(cpu_shard_size(&cnn, 32), 1);
        let mlp = agent(QNetworkConfig::mlp(vec![64, 64]), &[4]);
        let (small, large) = (cpu_shard_size(&mlp, 4), cpu_shard_size(&mlp, 256));
        assert!((12..=40).contains(&small), "{small}");
        assert!(large >= 1 && large < small, "{large} against {small}");
    }
}
