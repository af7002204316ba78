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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use candle_core::Tensor;
use normrl_agents::dqn::{Dqn, DqnConfig, LinearSchedule};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::population::count::read_rows_to_host;
use normrl_agents::population::{DeviceFrames, ShardedPopulation};
use normrl_agents::replay::{Batch, ReplayBuffer};

use crate::config::TrainConfig;
use crate::run::checkpoint;
use crate::run::interrupt::{self, Interrupted};
use crate::run::periodic::{mean, Clock, Periodic};
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

/// P members trained as one population.
pub struct Population {
    members: Vec<Trainer>,
    /// Each member's clock (its speed and wall time); none shows a progress bar.
    clocks: Vec<Clock>,
    agents: ShardedPopulation,
    step: u64,
    /// `[3, P]`: each member's sums of TD loss, mean Q and gradient norm since the last
    /// log, on the device (read once per log for all members).
    sums: Option<Tensor>,
    updates_since_log: u64,
    /// Members whose run ended early (diverged): their summary is written, their
    /// environment no longer steps, nothing more is written for them.
    ended: Vec<bool>,
    /// Steps the members' environments on `run.threads` threads, when more than one.
    pool: Option<rayon::ThreadPool>,
    /// The members' replay frames on the device (an accelerator's, or on request), so
    /// that an update uploads slot indices instead of observations.
    frames: Option<DeviceFrames>,
    /// Where a step's time goes (`bench population-host`).
    times: HostTimes,
    threading: Threading,
}

/// Steps timed on one thread before a population with `run.threads > 1` decides
/// whether its members' work is worth threads.
const PROBE_STEPS: u32 = 64;

/// The members' work per step from which threads pay (their hand-off costs tens of
/// microseconds, more on busy cores).
const WORTH_THREADS: Duration = Duration::from_micros(200);

/// Whether a population steps its members on threads.
#[derive(Clone, Copy, Debug)]
enum Threading {
    /// One thread (`run.threads = 1`, or too little work to share).
    Off,
    /// Timing the first steps on one thread.
    Probing {
        steps: u32,
        spent: Duration,
    },
    On,
}

/// Wall time a population spent in each part of its steps since it started (or since
/// [`Population::reset_times`]): what `bench population-host` reports per member.
#[derive(Clone, Debug, Default)]
pub struct HostTimes {
    /// Steps taken.
    pub steps: u64,
    /// The batched greedy forward and its one read, for all members.
    pub forward: Duration,
    /// The members' own work: exploration draw, environment step, replay push.
    pub members: Duration,
    /// The new frames' writes into the device mirror.
    pub mirror: Duration,
    /// Drawing the members' batches from their replays.
    pub sample: Duration,
    /// The population's updates (on an accelerator: mostly launching them).
    pub update: Duration,
    /// Wall time of whole steps (everything a step did, its logs, evaluations and
    /// checkpoints included) before learning starts and after, and their counts.
    pub wall: [Duration; 2],
    pub wall_steps: [u64; 2],
}

impl HostTimes {
    /// Agent-steps per second of `members` members over whole steps, acting only and
    /// with updates (`None` where no such step ran).
    pub fn throughput(&self, members: usize) -> [Option<f64>; 2] {
        [0, 1].map(|k| {
            let seconds = self.wall[k].as_secs_f64();
            (self.wall_steps[k] > 0 && seconds > 0.0)
                .then(|| (self.wall_steps[k] * members as u64) as f64 / seconds)
        })
    }
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
            pool,
            frames: None,
            times: HostTimes::default(),
            threading,
        }
        .with_device_frames(false)
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
        let mut summaries = vec![None; self.members.len()];
        let mut clock = Clock::new(&config, self.step);
        let learning_starts = config.replay.learning_starts;
        while self.step < end && self.ended.contains(&false) {
            if let Some(signal) = interrupt::requested() {
                return Err(self.interrupt(signal)?.into());
            }
            let started = Instant::now();
            let updating = usize::from(self.step >= learning_starts);
            self.act()?;
            self.step += 1;
            for task in Periodic::ALL {
                if task.due(&config, self.step) {
                    self.run_task(task, &mut clock)?;
                }
                self.end_diverged(&mut summaries)?;
            }
            self.times.wall[updating] += started.elapsed();
            self.times.wall_steps[updating] += 1;
        }
        self.say_throughput();
        self.log_updates()?;
        self.export()?;
        for i in self.live() {
            summaries[i] = self.members[i].conclude(&mut self.clocks[i])?;
        }
        self.prune();
        clock.progress.finish();
        Ok(summaries)
    }

    /// The indices of the members still training.
    fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| !self.ended[i])
            .collect()
    }

    /// One step of every member: the greedy actions of all in one forward, then each
    /// member's own epsilon-greedy draw and environment step (on `run.threads` threads:
    /// each member's environment, replay and generator are its own, so the threads
    /// change nothing but the time).
    fn act(&mut self) -> Result<()> {
        let obs: Vec<f32> = self
            .members
            .iter()
            .flat_map(|m| m.obs().iter().copied())
            .collect();
        let start = Instant::now();
        let greedy = self.agents.greedy_actions(&obs)?;
        let forward_done = Instant::now();
        // Frames written so far, to find this step's new ones for the device mirror.
        let written: Option<Vec<u64>> = self.frames.as_ref().map(|_| {
            let replays = self.members.iter().map(Trainer::replay);
            replays.map(ReplayBuffer::written).collect()
        });
        let ended = &self.ended;
        let step = |(i, member): (usize, &mut Trainer)| -> Result<()> {
            if ended[i] {
                return Ok(());
            }
            let action = member.explore_or(greedy[i] as usize)?;
            member.apply_action(action)
        };
        match (&self.pool, self.threading) {
            (Some(pool), Threading::On) => {
                // One contiguous chunk of members per thread: one task each, so the
                // threads' hand-offs cost the same whatever P.
                use rayon::prelude::*;
                let chunk = self.members.len().div_ceil(pool.current_num_threads());
                let members = &mut self.members;
                pool.install(|| {
                    members
                        .par_chunks_mut(chunk)
                        .enumerate()
                        .try_for_each(|(c, part)| {
                            let first = c * chunk;
                            part.iter_mut()
                                .enumerate()
                                .try_for_each(|(j, m)| step((first + j, m)))
                        })
                })?
            }
            _ => self.members.iter_mut().enumerate().try_for_each(step)?,
        }
        let members_done = Instant::now();
        self.decide_threading(members_done - forward_done);
        if let Some(written) = written {
            self.mirror_new_frames(&written)?;
        }
        let t = &mut self.times;
        t.steps += 1;
        t.forward += forward_done - start;
        t.members += members_done - forward_done;
        t.mirror += members_done.elapsed();
        Ok(())
    }

    /// With `run.threads > 1`: after the first [`PROBE_STEPS`] steps on one thread,
    /// threads step the members only if their work takes at least [`WORTH_THREADS`] a
    /// step. Below that the hand-off to other threads costs more than it saves, and on
    /// a machine whose cores are busy it costs far more (measured: a CartPole
    /// population of 256 on a busy 2-core machine, 5x slower on two threads).
    fn decide_threading(&mut self, members_took: Duration) {
        let Threading::Probing { steps, spent } = &mut self.threading else {
            return;
        };
        *steps += 1;
        *spent += members_took;
        if *steps < PROBE_STEPS {
            return;
        }
        let per_step = *spent / *steps;
        self.threading = match per_step >= WORTH_THREADS {
            true => Threading::On,
            false => {
                eprintln!(
                    "run.threads = {}: the members' environments take {} us a step, too little to share; stepping them on one thread",
                    self.members[0].config().run.threads,
                    per_step.as_micros()
                );
                Threading::Off
            }
        };
    }

    /// Steps the members on `run.threads` threads from the first step, whatever their
    /// work (for tests: that threads change nothing in a run).
    #[cfg(any(test, feature = "test-support"))]
    pub fn always_threaded(mut self) -> Self {
        if self.pool.is_some() {
            self.threading = Threading::On;
        }
        self
    }

    /// One line of what the population trained per second, on standard error: the
    /// number a user compares with other trainers (`scripts/gpu-check.sh` reads it).
    fn say_throughput(&self) {
        let members = self.members.len();
        let [acting, updating] = self.times.throughput(members);
        let part = |rate: Option<f64>, steps: u64, what: &str| {
            rate.map(|r| format!("{r:.0} agent-steps/s {what} ({steps} steps)"))
        };
        let parts: Vec<String> = [
            part(updating, self.times.wall_steps[1], "with updates"),
            part(acting, self.times.wall_steps[0], "acting only"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !parts.is_empty() {
            let device = self.agents.device();
            let on = if device.is_cpu() { "cpu" } else { "cuda" };
            eprintln!("population of {members} on {on}: {}", parts.join(", "));
        }
    }

    /// Whether the members' environments step on threads now.
    #[cfg(any(test, feature = "test-support"))]
    pub fn steps_on_threads(&self) -> bool {
        matches!(self.threading, Threading::On)
    }

    /// Where the steps' time went since the start or the last [`Self::reset_times`].
    pub fn times(&self) -> &HostTimes {
        &self.times
    }

    pub fn reset_times(&mut self) {
        self.times = HostTimes::default();
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
            self.members[i].log_update_means([mean(0), mean(1), mean(2)]);
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
    fn end_diverged(&mut self, summaries: &mut [Option<RunSummary>]) -> Result<()> {
        for i in self.live() {
            if self.members[i].is_diverged() {
                self.agents.export_agent(i, self.members[i].agent_mut())?;
                summaries[i] = self.members[i].conclude(&mut self.clocks[i])?;
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
/// none in common, in groups of those at the same step. One member alone trains as a
/// single run. Each member's summary (`None` if it stopped early).
pub fn train_members(members: &[Member], stop_at: Option<u64>) -> Result<Vec<Option<RunSummary>>> {
    let mut summaries = vec![None; members.len()];
    let mut pending = vec![];
    for (i, m) in members.iter().enumerate() {
        match finished_summary(&m.dir)? {
            Some(summary) => summaries[i] = Some(summary),
            None => pending.push(i),
        }
    }
    for (step, group) in resume_groups(members, &pending)? {
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
        let done = match trainers.len() {
            1 => vec![SingleRun::new(trainers.remove(0))?.run(stop_at)?],
            _ => Population::new(trainers)?.run(stop_at)?,
        };
        for (&i, summary) in group.iter().zip(done) {
            summaries[i] = summary;
        }
    }
    Ok(summaries)
}

fn checkpoint_dir(run_dir: &std::path::Path, step: u64) -> PathBuf {
    checkpoint::complete(run_dir)
        .into_iter()
        .find(|(s, _)| *s == step)
        .map(|(_, dir)| dir)
        .expect("a step listed among the run's complete checkpoints")
}

/// The pending members by the step each resumes from (0: fresh): all at the newest
/// step they share, else grouped by their own newest. Each chosen checkpoint is
/// verified first; a damaged one is set aside (said on stderr) and the choice made
/// again without it.
fn resume_groups(members: &[Member], pending: &[usize]) -> Result<Vec<(u64, Vec<usize>)>> {
    let mut points: Vec<BTreeSet<u64>> = pending
        .iter()
        .map(|&i| {
            let steps: BTreeSet<u64> = checkpoint::complete(&members[i].dir)
                .into_iter()
                .map(|(s, _)| s)
                .collect();
            if steps.is_empty() {
                BTreeSet::from([0])
            } else {
                steps
            }
        })
        .collect();
    let mut verified = BTreeSet::new();
    'choose: loop {
        let groups = group_by_steps(pending, &points);
        for (step, group) in groups.iter().filter(|(s, _)| *s > 0) {
            for &i in group {
                let k = pending
                    .iter()
                    .position(|&p| p == i)
                    .expect("a pending member");
                if !verified.insert((i, *step)) {
                    continue;
                }
                let dir = checkpoint_dir(&members[i].dir, *step);
                match checkpoint::verify(&dir) {
                    Ok(how) => checkpoint::note_unverified(&dir, how),
                    Err(e) => {
                        points[k].remove(step);
                        let instead = points[k].iter().next_back().copied();
                        checkpoint::warn_damaged(*step, &e, instead);
                        if instead.is_none() {
                            bail!(
                                "{} has no valid checkpoint to resume from: {e:#}",
                                members[i].dir.display()
                            );
                        }
                        continue 'choose;
                    }
                }
            }
        }
        return Ok(groups);
    }
}

/// [`resume_groups`]' choice on the steps each member holds.
fn group_by_steps(pending: &[usize], points: &[BTreeSet<u64>]) -> Vec<(u64, Vec<usize>)> {
    let common = points
        .iter()
        .skip(1)
        .fold(points.first().cloned().unwrap_or_default(), |a, b| {
            a.intersection(b).copied().collect()
        });
    if let Some(&step) = common.last() {
        return vec![(step, pending.to_vec())];
    }
    let mut groups: Vec<(u64, Vec<usize>)> = vec![];
    for (&i, p) in pending.iter().zip(points) {
        let newest = *p.last().expect("never empty");
        match groups.iter_mut().find(|(s, _)| *s == newest) {
            Some((_, g)) => g.push(i),
            None => groups.push((newest, vec![i])),
        }
    }
    groups
}
