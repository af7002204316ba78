//! The training loop of a single run and a population alike ([`train_to`] over
//! [`Steps`]), when its periodic work is due, and its clock: the run's time, the speed
//! between logs, the progress bar.

use std::time::Instant;

use anyhow::Result;

use crate::config::TrainConfig;
use crate::run::interrupt::{self, Interrupted};

/// What the training loop drives: a single run (`Trainer`), or a population of runs in
/// lockstep (`Population`); each gives the loop these steps, and the loop is written once.
pub(crate) trait Steps {
    /// The config of the run (of every member: the population's key makes them alike in
    /// all the loop reads).
    fn config(&self) -> &TrainConfig;

    /// Environment steps taken.
    fn step(&self) -> u64;

    /// Whether anything still trains: not a diverged run, not a population whose every
    /// member diverged.
    fn training(&self) -> bool;

    /// One environment step (of every member).
    fn take_step(&mut self) -> Result<()>;

    /// `task`, due after the step just taken.
    fn periodic(&mut self, task: Periodic, clock: &mut Clock) -> Result<()>;

    /// A stop request (`signal`) at this step: a checkpoint to resume from.
    fn stop(&mut self, signal: i32, clock: &Clock) -> Result<Interrupted>;

    /// After a whole step, its periodic work included, begun at `started`.
    fn step_done(&mut self, _started: Instant) {}
}

/// Steps to `end` while anything trains, each step followed by the periodic work due
/// after it. A stop request checkpoints and returns [`Interrupted`] as the error.
pub(crate) fn train_to(steps: &mut impl Steps, end: u64, clock: &mut Clock) -> Result<()> {
    while steps.step() < end && steps.training() {
        if let Some(signal) = interrupt::requested() {
            return Err(steps.stop(signal, clock)?.into());
        }
        let started = Instant::now();
        steps.take_step()?;
        for task in Periodic::ALL {
            // A run that diverged evaluates and checkpoints nothing more.
            if steps.training() && task.due(steps.config(), steps.step()) {
                steps.periodic(task, clock)?;
            }
        }
        steps.step_done(started);
    }
    Ok(())
}

/// The work done every so many environment steps, in this order after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Periodic {
    /// Gradient steps, every `replay.train_frequency` once learning has started.
    Train,
    /// Speed, epsilon, the updates' means and the progress bar.
    Log,
    /// Weight norms, gains, BN statistics (and singular values for SVB).
    LayerStats,
    /// An evaluation before the last step (the final one runs after the loop).
    Evaluate,
    /// A checkpoint before the last step (the final one runs after the loop).
    Checkpoint,
}

impl Periodic {
    pub(crate) const ALL: [Periodic; 5] = [
        Periodic::Train,
        Periodic::Log,
        Periodic::LayerStats,
        Periodic::Evaluate,
        Periodic::Checkpoint,
    ];

    /// Due after environment step `step`.
    pub(crate) fn due(self, cfg: &TrainConfig, step: u64) -> bool {
        let before_end = step < cfg.run.total_steps;
        match self {
            Periodic::Train => {
                step > cfg.replay.learning_starts && every(step, cfg.replay.train_frequency)
            }
            Periodic::Log => every(step, cfg.logging.interval.max(1)),
            Periodic::LayerStats => every(step, cfg.logging.layer_stats_interval),
            Periodic::Evaluate => before_end && every(step, cfg.eval.interval),
            Periodic::Checkpoint => before_end && every(step, cfg.checkpoint.interval),
        }
    }
}

/// Time since this process started training, the speed between logs, the progress bar.
pub(crate) struct Clock {
    start: Instant,
    pub(crate) start_step: u64,
    lap: (Instant, u64),
    pub(crate) progress: crate::logging::progress::Progress,
}

impl Clock {
    pub(crate) fn new(cfg: &TrainConfig, step: u64) -> Self {
        Self::with_progress(cfg.logging.progress, cfg, step)
    }

    /// A clock with a progress bar only if `progress` (a population shows one bar).
    pub(crate) fn with_progress(progress: bool, cfg: &TrainConfig, step: u64) -> Self {
        let progress = crate::logging::progress::Progress::new(progress, cfg.run.total_steps, step);
        Self {
            start: Instant::now(),
            start_step: step,
            lap: (Instant::now(), step),
            progress,
        }
    }

    pub(crate) fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Steps per second since the last lap.
    pub(crate) fn lap(&mut self, step: u64) -> f64 {
        let (t0, s0) = self.lap;
        self.lap = (Instant::now(), step);
        (step - s0) as f64 / t0.elapsed().as_secs_f64().max(1e-9)
    }
}

/// True on every `interval`-th step; never when `interval` is 0 (disabled).
fn every(step: u64, interval: u64) -> bool {
    interval > 0 && step.is_multiple_of(interval)
}

/// The mean of `values`; `None` when there are none.
pub(crate) fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}
