//! A population's members: what they may differ in, a config's members, and how a
//! comparison's members are started or resumed together (`train_members`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use normrl_agents::dqn::{DqnConfig, LinearSchedule};
use normrl_agents::optim::OptimizerConfig;

use super::resume::{checkpoint_dir, resume_groups};
use super::Population;
use crate::config::TrainConfig;
use crate::run::train::{finished_summary, RunSummary, Trainer};

/// What may differ between the members of one population: their seed and name, and
/// the hyperparameters a population holds per agent (exploration, gamma, learning
/// rate). Configs with the same key train together.
pub fn population_key(config: &TrainConfig) -> String {
    let mut c = config.clone();
    c.run.seed = 0;
    c.run.name = String::new();
    c.run.population = 1;
    c.exploration = LinearSchedule::default();
    c.dqn.gamma = DqnConfig::default().gamma;
    c.optimizer.lr = OptimizerConfig::default().lr;
    c.to_toml()
}

/// A single run on its device's engine: on the CPU the trainer's own loop (the fused
/// host path), on an accelerator a population of one, so that a device has one engine
/// (the population's batched update, its frames mirror, its one read per step).
pub enum SingleRun {
    Host(Box<Trainer>),
    Device(Box<Population>),
}

impl SingleRun {
    pub fn new(trainer: Trainer) -> Result<Self> {
        if trainer.agent().online().store().device().is_cpu() {
            return Ok(Self::Host(Box::new(trainer)));
        }
        // `Population::new` mirrors the frames on an accelerator.
        Ok(Self::Device(Box::new(Population::new(vec![trainer])?)))
    }

    /// Trains to `stop_at` (or the end); the summary once the run is finished.
    pub fn run(&mut self, stop_at: Option<u64>) -> Result<Option<RunSummary>> {
        match self {
            Self::Host(trainer) => trainer.run(stop_at),
            Self::Device(population) => Ok(population.run(stop_at)?.pop().flatten()),
        }
    }
}

/// The config at `dir`'s root when it is a population's (`run.population > 1`): what
/// `train --resume` and `status` take for a population, and a fresh run refuses.
pub fn population_root(dir: &Path) -> Result<Option<TrainConfig>> {
    let path = dir.join("config.toml");
    if !path.exists() {
        return Ok(None);
    }
    let config = TrainConfig::load(&path, &[])?;
    Ok((config.run.population > 1).then_some(config))
}

/// The members of a population config: seeds `seed`, `seed + 1`, ..., each a single
/// run's config in `run_dir/seed-<seed>`.
pub fn population_members(config: &TrainConfig, run_dir: &Path) -> Vec<Member> {
    (0..config.run.population as u64)
        .map(|i| {
            let mut member = config.clone();
            member.run.seed = config.run.seed.wrapping_add(i);
            member.run.population = 1;
            Member {
                dir: run_dir.join(format!("seed-{}", member.run.seed)),
                config: member,
                variant: None,
            }
        })
        .collect()
}

/// One run of a population: its directory, its config (used when it starts fresh;
/// a resumed member reads its own `config.toml`) and its comparison label.
pub struct Member {
    pub dir: PathBuf,
    pub config: TrainConfig,
    pub variant: Option<String>,
}

/// Trains `members` together: finished ones are skipped; the others start or resume
/// as one population at the newest checkpoint step they all hold, or, when they hold
/// none in common, in groups of those at the same step. A population of one member
/// trains as a single run; a member left alone in a larger one, as a population of
/// one. Each member's summary (`None` if it stopped early).
pub fn train_members(members: &[Member], stop_at: Option<u64>) -> Result<Vec<Option<RunSummary>>> {
    let mut summaries = vec![None; members.len()];
    let mut pending = vec![];
    for (i, m) in members.iter().enumerate() {
        match finished_summary(&m.dir)? {
            Some(summary) => summaries[i] = Some(summary),
            None => pending.push(i),
        }
    }
    let dirs: Vec<&Path> = members.iter().map(|m| m.dir.as_path()).collect();
    for (step, group) in resume_groups(&dirs, &pending)? {
        let mut trainers: Vec<Trainer> = group
            .iter()
            .map(|&i| {
                let m = &members[i];
                let mut t = match step {
                    0 => Trainer::new(m.config.clone(), &m.dir)?,
                    s => Trainer::resume_at(&m.dir, &checkpoint_dir(&m.dir, s))?,
                };
                if let Some(v) = &m.variant {
                    t.set_variant(v);
                }
                Ok(t)
            })
            .collect::<Result<Vec<_>>>()?;
        // A member of a population keeps the population's arithmetic when it trains
        // on alone (the others finished, or hold other checkpoints): as a single run,
        // weight norm's host kernels would part its weights from the uninterrupted
        // run's by rounding. A population of one equals a member bit for bit.
        let done = match members.len() {
            1 => vec![SingleRun::new(trainers.remove(0))?.run(stop_at)?],
            _ => Population::new(trainers)?.run(stop_at)?,
        };
        for (&i, summary) in group.iter().zip(done) {
            summaries[i] = summary;
        }
    }
    Ok(summaries)
}
