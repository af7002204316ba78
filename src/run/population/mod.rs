//! Populations in the trainer: runs alike but for their seed (and per-agent
//! hyperparameters: exploration schedule, gamma, learning rate) trained in lockstep as
//! one batched network (`normrl_agents::population`). Each member is a whole [`Trainer`], with its
//! own environment, replay, generators, run directory and files, so that reports,
//! `status` and TensorBoard cannot tell a member from a single run; the population
//! replaces only its acting (one forward and one read for all members) and its
//! updates (one for all). Before anything reads a member's agent (evaluations,
//! diagnostics, layer statistics, checkpoints) the population writes that member's
//! agent into the member's single [`Dqn`], so a member's checkpoint is a single run's
//! and resumes either way.
//!
//! Checkpoints are written in two phases: every member writes its new one keeping the
//! old, then the old go. A population killed in between resumes from the newest step
//! all members hold; members that share none (killed before the first checkpoint was
//! complete everywhere) resume in groups, one after the other.
//!
//! The folder: the population and its loop (here), its members and how they are grouped
//! and started (`members.rs`), which checkpoint step each resumes from (`resume.rs`),
//! stepping the members on threads (`threads.rs`), and where a step's time goes
//! (`times.rs`).

mod members;
mod resume;
mod threads;
mod times;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use candle_core::Tensor;
use normrl_agents::dqn::Dqn;
use normrl_agents::population::count::read_rows_to_host;
use normrl_agents::population::{DeviceFrames, ShardedPopulation};
use normrl_agents::replay::{Batch, ReplayBuffer};

use crate::config::TrainConfig;
use crate::run::checkpoint;
use crate::run::interrupt::Interrupted;
use crate::run::periodic::{mean, train_to, Clock, Periodic, Steps};
use crate::run::train::{RunSummary, Trainer};

pub use members::{
    population_key, population_members, population_root, train_members, Member, SingleRun,
};
use threads::Threading;
pub use times::HostTimes;

/// P members trained as one population.
pub struct Population {
    members: Vec<Trainer>,
    /// Each member's clock (its speed and wall time); none shows a progress bar.
    clocks: Vec<Clock>,
    agents: ShardedPopulation,
    step: u64,
    /// `[3, P]`: each member's sums of TD loss, mean Q and gradient norm since the last
    /// log (and a distributional loss's value entropy, `[4, P]`), on the device (read
    /// once per log for all members).
    sums: Option<Tensor>,
    updates_since_log: u64,
    /// Members whose run ended early (diverged): their summary is written, their
    /// environment no longer steps, nothing more is written for them.
    ended: Vec<bool>,
    /// Each member's summary once it has one (a diverged member's, during the run).
    summaries: Vec<Option<RunSummary>>,
    /// Steps the members' environments on `run.threads` threads, when more than one.
    pool: Option<rayon::ThreadPool>,
    /// The members' replay frames on the device (an accelerator's, or on request), so
    /// that an update uploads slot indices instead of observations.
    frames: Option<DeviceFrames>,
    /// Where a step's time goes (`bench population-host`).
    times: HostTimes,
    threading: Threading,
    /// No throughput line at the end of a `run` (a measurement that prints its own).
    quiet: bool,
}

impl Population {
    /// `members`, all at the same step and alike but for what [`population_key`]
    /// leaves out, as one population.
    pub fn new(mut members: Vec<Trainer>) -> Result<Self> {
        let Some(first) = members.first() else {
            bail!("a population needs at least one member");
        };
        let (key, step) = (population_key(first.config()), first.step());
        for m in &members {
            if population_key(m.config()) != key || m.step() != step {
                bail!(
                    "{} cannot train in one population with {}: their configs or steps differ",
                    m.run_dir().display(),
                    first.run_dir().display()
                );
            }
        }
        let agents = {
            let singles: Vec<&Dqn> = members.iter().map(Trainer::agent).collect();
            let batch = first.config().replay.batch_size;
            let graphs = first.config().run.cuda_graphs;
            ShardedPopulation::from_agents(&singles, batch)?.with_cuda_graphs(graphs)
        };
        for m in &mut members {
            m.defer_pruning();
        }
        let clocks = members
            .iter()
            .map(|m| Clock::with_progress(false, m.config(), step))
            .collect();
        let ended = vec![false; members.len()];
        // One value for all members: it is part of the population's key.
        let threads = members[0].config().run.threads;
        let pool = match threads > 1 {
            true => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()?,
            ),
            false => None,
        };
        let threading = match pool {
            Some(_) => Threading::Probing {
                steps: 0,
                spent: Duration::ZERO,
            },
            None => Threading::Off,
        };
        Self {
            members,
            clocks,
            agents,
            step,
            sums: None,
            updates_since_log: 0,
            ended,
            summaries: vec![],
            pool,
            frames: None,
            times: HostTimes::default(),
            threading,
            quiet: false,
        }
        .with_device_frames(false)
    }

    /// The population without its throughput line (`compare --dry-run` times it in
    /// pieces and states its own rate: a line per piece would read as the rates).
    pub fn quietly(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Mirrors the members' replay frames on the population's device when it is an
    /// accelerator (or whatever it is, with `always`: for tests and benchmarks on the
    /// CPU); frames of floats stay on the host.
    pub fn with_device_frames(mut self, always: bool) -> Result<Self> {
        let device = self.agents.device();
        if self.frames.is_none() && (always || !device.is_cpu()) {
            let replays: Vec<&ReplayBuffer> = self.members.iter().map(Trainer::replay).collect();
            self.frames = DeviceFrames::mirror(&replays, &device)?;
            if self.frames.is_some() {
                // The updates read the frames from the mirror: the members' batches
                // take only the slots.
                for m in &mut self.members {
                    m.sample_without_frames();
                }
            }
        }
        Ok(self)
    }

    /// Whether the replay frames live on the device.
    #[cfg(any(test, feature = "test-support"))]
    pub fn frames_on_device(&self) -> bool {
        self.frames.is_some()
    }

    /// Trains every member to its `total_steps` (or `stop_at`, for tests of resuming);
    /// each member's summary, `None` for those stopped early.
    pub fn run(&mut self, stop_at: Option<u64>) -> Result<Vec<Option<RunSummary>>> {
        let config = self.members[0].config().clone();
        let total = config.run.total_steps;
        let end = stop_at.unwrap_or(total).min(total);
        for m in &mut self.members {
            m.begin();
        }
        self.summaries = vec![None; self.members.len()];
        let mut clock = Clock::new(&config, self.step);
        train_to(self, end, &mut clock)?;
        self.say_throughput();
        self.log_updates()?;
        self.export()?;
        for i in self.live() {
            self.summaries[i] = self.members[i].conclude(&mut self.clocks[i])?;
        }
        self.prune();
        clock.progress.finish();
        Ok(std::mem::take(&mut self.summaries))
    }

    /// The indices of the members still training.
    fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| !self.ended[i])
            .collect()
    }

    /// Every live member's single agent set to where the population's stands, as
    /// before an evaluation or a checkpoint (the end of a population's run).
    pub fn export_members(&mut self) -> Result<()> {
        self.export()
    }

    /// The frames the members' replays appended this step (the step's observation,
    /// and after an episode's end the next one's first), into the device mirror.
    fn mirror_new_frames(&mut self, written_before: &[u64]) -> Result<()> {
        let Some(frames) = &mut self.frames else {
            return Ok(());
        };
        let (mut rows, mut bytes) = (Vec::with_capacity(self.members.len()), vec![]);
        for (i, (member, &before)) in self.members.iter().zip(written_before).enumerate() {
            let replay = member.replay();
            let appended = (replay.written() - before) as usize;
            let capacity = replay.capacity();
            for back in (0..appended.min(capacity)).rev() {
                let slot = (replay.head() + capacity - back) % capacity;
                rows.push(frames.row(i, slot));
                replay.append_frame_bytes(slot, &mut bytes);
            }
        }
        Ok(frames.write(&rows, &bytes)?)
    }

    fn run_task(&mut self, task: Periodic, clock: &mut Clock) -> Result<()> {
        if task == Periodic::Train {
            return self.train();
        }
        self.export()?;
        if task == Periodic::Log {
            self.log_updates()?;
        }
        for i in self.live() {
            let epsilon = self.members[i].config().exploration.at(self.step);
            self.members[i].run_task(task, epsilon, &mut self.clocks[i])?;
        }
        match task {
            Periodic::Checkpoint => self.prune(),
            Periodic::Log => {
                let sps = clock.lap(self.step);
                let recent = mean(self.members.iter().filter_map(Trainer::recent_return));
                clock.progress.update(self.step, sps, recent);
            }
            _ => {}
        }
        Ok(())
    }

    /// `replay.gradient_steps` population updates, each member on a batch from its own
    /// replay; the diagnostics that wait for an update get it.
    fn train(&mut self) -> Result<()> {
        for _ in 0..self.members[0].config().replay.gradient_steps {
            let start = Instant::now();
            for m in &mut self.members {
                m.sample()?;
            }
            let sampled = Instant::now();
            let batches: Vec<&Batch> = self.members.iter().map(Trainer::batch).collect();
            // The shards of a CPU population update on the run's threads (each shard's
            // arithmetic is its own: the same results on any number of threads).
            let (frames, pool) = (self.frames.as_ref(), self.pool.as_ref());
            let info = self.agents.update_on(&batches, frames, pool)?;
            self.times.sample += sampled - start;
            self.times.update += sampled.elapsed();
            self.sums = Some(match self.sums.take() {
                None => info.metrics,
                Some(sums) => (sums + info.metrics)?,
            });
            self.updates_since_log += 1;
            for i in self.export_where(Trainer::awaits_update)? {
                self.members[i].after_update()?;
            }
        }
        Ok(())
    }

    /// Each member's means since the last log, from one read of all members' sums.
    fn log_updates(&mut self) -> Result<()> {
        let Some(sums) = self.sums.take() else {
            return Ok(());
        };
        let n = self.updates_since_log.max(1) as f64;
        self.updates_since_log = 0;
        let rows: Vec<Vec<f32>> = read_rows_to_host(&sums)?;
        for i in self.live() {
            let mean = |row: usize| f64::from(rows[row][i]) / n;
            // A distributional loss's mean entropy comes last.
            let entropy = (rows.len() > 3).then(|| mean(3));
            self.members[i].log_update_means([mean(0), mean(1), mean(2)], entropy);
        }
        Ok(())
    }

    /// Every live member's agent where the population's stands.
    fn export(&mut self) -> Result<()> {
        self.export_where(|_| true).map(|_| ())
    }

    /// The agents of the live members that `wanted` picks where the population's
    /// stand, in one export (which reads the optimizer's state once for all of them);
    /// their indices.
    fn export_where(&mut self, wanted: impl Fn(&Trainer) -> bool) -> Result<Vec<usize>> {
        let ended = &self.ended;
        let mut picked: Vec<(usize, &mut Dqn)> = self
            .members
            .iter_mut()
            .enumerate()
            .filter(|(i, m)| !ended[*i] && wanted(m))
            .map(|(i, m)| (i, m.agent_mut()))
            .collect();
        self.agents.export_agents(&mut picked)?;
        Ok(picked.into_iter().map(|(i, _)| i).collect())
    }

    /// Members that diverged end here, with the summary a single run writes.
    fn end_diverged(&mut self) -> Result<()> {
        for i in self.live() {
            if self.members[i].is_diverged() {
                self.agents.export_agent(i, self.members[i].agent_mut())?;
                self.summaries[i] = self.members[i].conclude(&mut self.clocks[i])?;
                self.ended[i] = true;
            }
        }
        Ok(())
    }

    /// A stop request: every live member checkpoints at this step.
    fn interrupt(&mut self, signal: i32) -> Result<Interrupted> {
        self.export()?;
        for i in self.live() {
            self.members[i].interrupt(signal, &self.clocks[i])?;
        }
        self.prune();
        Ok(Interrupted {
            signal,
            step: self.step,
        })
    }

    /// The second phase of a checkpoint: once every member has written its new one,
    /// the older ones go, as `checkpoint.keep` says.
    fn prune(&self) {
        for m in &self.members {
            if let Some(keep) = m.config().checkpoint.keep.while_training() {
                checkpoint::prune(m.run_dir(), keep);
            }
        }
    }
}

/// The population's steps for the loop: every member's step at once, the periodic work
/// for the live members (those that diverge end there), and each step's wall time.
impl Steps for Population {
    fn config(&self) -> &TrainConfig {
        self.members[0].config()
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn training(&self) -> bool {
        self.ended.contains(&false)
    }

    fn take_step(&mut self) -> Result<()> {
        self.act()?;
        self.step += 1;
        Ok(())
    }

    fn periodic(&mut self, task: Periodic, clock: &mut Clock) -> Result<()> {
        self.run_task(task, clock)?;
        self.end_diverged()
    }

    fn stop(&mut self, signal: i32, _clock: &Clock) -> Result<Interrupted> {
        self.interrupt(signal)
    }

    fn step_done(&mut self, started: Instant) {
        let learning_starts = self.config().replay.learning_starts;
        // The step taken was step `self.step - 1`, an updating one from
        // `learning_starts` on.
        let updating = usize::from(self.step > learning_starts);
        self.times.wall[updating] += started.elapsed();
        self.times.wall_steps[updating] += 1;
    }
}
