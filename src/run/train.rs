//! The training loop: acting, replay, updates, evaluation, logging and checkpoints.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use normrl_agents::dqn::distribution::ReturnScale;
use normrl_agents::dqn::{epsilon_greedy, Dqn, RewardScale};
use normrl_agents::replay::{Batch, FrameEncoding, ReplayBuffer, INIT_OBSERVATIONS};
use normrl_envs::{make, Env};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};

use crate::config::validate::MemoryEstimate;
use crate::config::{parse_device_spec, select_device, TrainConfig};
use crate::logging::video::{check_renders, Video, TENSORBOARD_VIDEO};
use crate::run::checkpoint::{self, CheckpointFiles};
use crate::run::diagnostics::{Diagnostics, Evaluation};
use crate::run::evaluate::EvalEnv;
pub use crate::run::evaluate::{evaluate, evaluate_in};
use crate::run::files::SUMMARY_FILE;
pub use crate::run::files::{Divergence, RunSummary};
use crate::run::interrupt::Interrupted;
use crate::run::periodic::{train_to, Clock, Periodic, Steps};
use crate::run::record::Recorder;
use crate::storage::lock::RunLock;

/// Everything besides the networks that a checkpoint must hold to resume exactly.
#[derive(Serialize, Deserialize)]
struct LoopState<'a> {
    config_toml: String,
    step: u64,
    episodes: u64,
    updates: u64,
    initialized: bool,
    act_rng: Xoshiro256PlusPlus,
    replay_rng: Xoshiro256PlusPlus,
    env_state: String,
    obs: Vec<f32>,
    /// Borrowed when saving: the buffer is serialized where it lies.
    replay: Option<Cow<'a, ReplayBuffer>>,
    eval_curve: Vec<(u64, f64)>,
    train_curve: Vec<(u64, f64)>,
    wall_seconds: f64,
    diagnostics: Cow<'a, Diagnostics>,
}

pub struct Trainer {
    config: TrainConfig,
    run_dir: PathBuf,
    env: Box<dyn Env>,
    agent: Dqn,
    replay: ReplayBuffer,
    batch: Batch,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    act_rng: Xoshiro256PlusPlus,
    replay_rng: Xoshiro256PlusPlus,
    step: u64,
    /// Seconds the run trained before this process (a resumed run's earlier sessions).
    wall_before: f64,
    /// TensorBoard, curves, divergence, heartbeat and the files written at the end.
    record: Recorder,
    eval_env: Option<EvalEnv>,
    diagnostics: Diagnostics,
    /// The running return that `dqn.reward_scale = "running_return"` divides the
    /// batches' rewards by.
    return_scale: Option<ReturnScale>,
    /// A population member keeps its older checkpoints until every member has written
    /// its new one (see `population/`).
    defer_pruning: bool,
    /// One writer per run directory, for as long as this trainer lives.
    _lock: RunLock,
}

/// A checkpoint's loop state and, where the run scales its rewards, its running return
/// (written after the state, so that checkpoints from before it was kept still read).
fn read_state(dir: &Path) -> Result<(LoopState<'static>, Option<ReturnScale>)> {
    let path = dir.join("state.bin");
    let bytes = std::fs::read(&path)?;
    let corrupt = || format!("checkpoint {} is corrupt", path.display());
    let (state, rest): (LoopState, _) = postcard::take_from_bytes(&bytes).with_context(corrupt)?;
    let return_scale = match rest.is_empty() {
        true => None,
        false => Some(postcard::from_bytes(rest).with_context(corrupt)?),
    };
    // A zeroed or truncated file can still decode: its config is then no TOML.
    if toml::from_str::<toml::Table>(&state.config_toml).map_or(true, |t| t.is_empty()) {
        bail!("{}", corrupt());
    }
    Ok((state, return_scale))
}

/// The summary of a finished run in `run_dir`, if it has one.
pub fn finished_summary(run_dir: &Path) -> Result<Option<RunSummary>> {
    crate::storage::read_json(&run_dir.join(SUMMARY_FILE), "a run summary")
}

/// Checked before a resume changes anything: a replay of other slots or observations
/// (an older checkpoint, without checksums, damaged) failed an assertion later.
fn replay_fits(state: &LoopState, config: &TrainConfig, dir: &Path) -> Result<()> {
    let Some(r) = &state.replay else {
        return Ok(());
    };
    let slots = config.replay.capacity.max(2);
    if r.obs_len() != state.obs.len() || r.capacity() != slots {
        bail!(
            "checkpoint {} is corrupt: its replay holds {} slots of {} values, the run {slots} slots of {}",
            dir.display(),
            r.capacity(),
            r.obs_len(),
            state.obs.len()
        );
    }
    Ok(())
}

/// An error unless `run_dir` is free for a new run.
fn check_fresh(run_dir: &Path) -> Result<()> {
    if run_dir.join(SUMMARY_FILE).exists() {
        bail!(
            "{} holds a finished run (its summary.json): a finished run is final, nothing resumes it; choose another --run-dir",
            run_dir.display()
        );
    }
    if checkpoint::latest(run_dir)?.is_some() {
        bail!(
            "{} already holds a run; resume it with --resume {} or choose another --run-dir",
            run_dir.display(),
            run_dir.display()
        );
    }
    Ok(())
}

/// Sets the tensor thread count before candle first runs (candle otherwise reads
/// /proc/cpuinfo on every matmul).
pub fn set_threads(threads: usize) {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
}

impl Trainer {
    /// A fresh run in `run_dir`, which must not hold a run already.
    pub fn new(config: TrainConfig, run_dir: &Path) -> Result<Self> {
        check_fresh(run_dir)?;
        let trainer = Self::build(config, run_dir, None)?;
        crate::storage::write_atomic(
            &run_dir.join("config.toml"),
            trainer.config.to_toml().as_bytes(),
        )?;
        Ok(trainer)
    }

    /// Everything a run needs, built only after the memory estimate fits; the run
    /// directory and its TensorBoard file are created last.
    fn build(config: TrainConfig, run_dir: &Path, lock: Option<RunLock>) -> Result<Self> {
        set_threads(config.run.threads);
        let device = select_device(parse_device_spec(&config.run.device)?)?;
        // cuBLAS's switch is the process's; a run sets it either way.
        candle_core::cuda::set_gemm_reduced_precision_f32(device.is_cuda() && config.run.tf32);
        let mut env = make(&config.env.id)?;
        let space = env.observation_space();
        let n_actions = env.action_space().n;
        if let Some(available) = crate::config::validate::machine_memory() {
            MemoryEstimate::of(&config, &space, n_actions).check(&config, available)?;
        }
        let seed = config.run.seed;
        let agent = Dqn::new(config.agent(), &space.shape, n_actions, seed, &device)
            .context("cannot build the Q-network")?;
        let mut replay = ReplayBuffer::with_encoding(
            config.replay.capacity,
            space.len(),
            FrameEncoding::of(&space),
        );
        let mut obs = vec![0.0; space.len()];
        env.reset(Some(seed), &mut obs)?;
        replay.start_episode(&obs);
        // Before the run directory exists: a video that cannot be made fails the run
        // at its start, not at its first evaluation.
        let eval_env = match config.eval.video {
            true => {
                let mut eval_env = EvalEnv::make(&config.env.id)?;
                check_renders(eval_env.fresh()?).context("eval.video = true")?;
                Some(eval_env)
            }
            false => None,
        };
        // A fresh run takes its lock once the config has passed every check (a refused
        // config leaves nothing behind), and checks the directory again under it.
        let lock = match lock {
            Some(lock) => lock,
            None => {
                let lock = RunLock::acquire(run_dir)?;
                check_fresh(run_dir)?;
                lock
            }
        };
        let record = Recorder::new(run_dir)?;
        let return_scale = (config.dqn.reward_scale != RewardScale::None)
            .then(|| ReturnScale::new(config.dqn.gamma));
        Ok(Self {
            batch: Batch::new(config.replay.batch_size, space.len()),
            next_obs: obs.clone(),
            obs,
            act_rng: Xoshiro256PlusPlus::seed_from_u64(seed.wrapping_add(1)),
            replay_rng: Xoshiro256PlusPlus::seed_from_u64(seed.wrapping_add(2)),
            step: 0,
            wall_before: 0.0,
            run_dir: run_dir.to_path_buf(),
            config,
            env,
            agent,
            replay,
            record,
            eval_env,
            diagnostics: Diagnostics::default(),
            return_scale,
            defer_pruning: false,
            _lock: lock,
        })
    }

    /// Reopens a run from its directory and newest checkpoint whose checksums hold
    /// (falling back to an older one, said on stderr). The checkpoint's state is read
    /// and checked before anything is built or written.
    pub fn resume(run_dir: &Path) -> Result<Self> {
        let lock = RunLock::acquire(run_dir)?;
        let Some(dir) = checkpoint::newest_valid(run_dir)? else {
            bail!("{} has no checkpoint to resume from", run_dir.display());
        };
        Self::resume_locked(run_dir, &dir, lock)
    }

    /// Reopens a run from its checkpoint in `dir` (one of `run_dir/checkpoints/`,
    /// verified by the caller).
    pub fn resume_at(run_dir: &Path, dir: &Path) -> Result<Self> {
        Self::resume_locked(run_dir, dir, RunLock::acquire(run_dir)?)
    }

    fn resume_locked(run_dir: &Path, dir: &Path, lock: RunLock) -> Result<Self> {
        let config_path = run_dir.join("config.toml");
        let config = TrainConfig::load(&config_path, &[])?;
        let (state, return_scale) = read_state(dir)?;
        if TrainConfig::canonical_toml(&state.config_toml) != Some(config.to_toml()) {
            bail!(
                "{} changed since the checkpoint was written",
                config_path.display()
            );
        }
        replay_fits(&state, &config, dir)?;
        // Every file of the checkpoint is read before anything in the run directory
        // changes (its TensorBoard events, a new events file): a resume that fails
        // leaves the directory as it was.
        let cpu = candle_core::Device::Cpu;
        let [online, target, optimizer] =
            ["online", "target", "optimizer"].map(|name| checkpoint::load_tensors(dir, name, &cpu));
        let (online, target, optimizer) = (online?, target?, optimizer?);
        crate::logging::tensorboard::truncate_after(run_dir, state.step)?;
        let mut t = Self::build(config, run_dir, Some(lock))?;
        let device = t.agent.online().store().device().clone();
        let on_device = |map: HashMap<String, candle_core::Tensor>| {
            map.into_iter()
                .map(|(k, v)| Ok((k, v.to_device(&device)?)))
                .collect::<candle_core::Result<HashMap<_, _>>>()
        };
        t.agent.online().store().load_map(&on_device(online)?)?;
        t.agent.target().store().load_map(&on_device(target)?)?;
        t.agent
            .optimizer_mut()
            .load_state_tensors(&on_device(optimizer)?)?;
        t.agent.restore_counters(state.updates, state.initialized);
        let env_state: serde_json::Value = serde_json::from_str(&state.env_state)?;
        let exact = !env_state.is_null();
        if exact {
            t.env.load_state(&env_state)?;
        }
        t.step = state.step;
        t.record.episodes = state.episodes;
        t.act_rng = state.act_rng;
        t.replay_rng = state.replay_rng;
        t.obs = state.obs;
        if !exact {
            eprintln!(
                "note: {} cannot save its state; the resumed run starts a new episode at step {}",
                t.env.id(),
                t.step
            );
            let seed = t
                .config
                .run
                .seed
                .wrapping_add(t.step.wrapping_mul(0x9e37_79b9));
            t.env.reset(Some(seed), &mut t.obs)?;
        }
        t.record.eval_curve = state.eval_curve;
        t.record.train_curve = state.train_curve;
        t.wall_before = state.wall_seconds;
        t.diagnostics = state.diagnostics.into_owned();
        if t.return_scale.is_some() {
            let lost = || format!("checkpoint {} holds no running return", dir.display());
            t.return_scale = Some(return_scale.with_context(lost)?);
        }
        match state.replay {
            Some(r) => t.replay = r.into_owned(),
            None => bail!("the checkpoint holds no replay buffer (checkpoint.replay = false): cannot resume exactly"),
        }
        if !exact {
            t.replay.start_episode(&t.obs);
        }
        Ok(t)
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    pub fn agent(&self) -> &Dqn {
        &self.agent
    }

    /// The evaluations so far, `(step, mean return)`.
    pub fn eval_curve(&self) -> &[(u64, f64)] {
        &self.record.eval_curve
    }

    /// Episodes ended so far.
    pub fn episodes(&self) -> u64 {
        self.record.episodes
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    fn save_checkpoint(&self, elapsed: f64) -> Result<()> {
        let state = LoopState {
            config_toml: self.config.to_toml(),
            step: self.step,
            episodes: self.record.episodes,
            updates: self.agent.updates(),
            initialized: self.agent.is_initialized(),
            act_rng: self.act_rng.clone(),
            replay_rng: self.replay_rng.clone(),
            // Outside environments (a Python worker) cannot save theirs: `null`, and a
            // resumed run starts a new episode.
            env_state: self
                .env
                .save_state()
                .unwrap_or(serde_json::Value::Null)
                .to_string(),
            obs: self.obs.clone(),
            replay: self
                .config
                .checkpoint
                .replay
                .then_some(Cow::Borrowed(&self.replay)),
            eval_curve: self.record.eval_curve.clone(),
            train_curve: self.record.train_curve.clone(),
            wall_seconds: self.wall_before + elapsed,
            diagnostics: Cow::Borrowed(&self.diagnostics),
        };
        let return_scale = self.return_scale.clone();
        let files = CheckpointFiles {
            tensors: vec![
                ("online", self.agent.online().store().to_map()?),
                ("target", self.agent.target().store().to_map()?),
                ("optimizer", self.agent.optimizer().state_tensors()?),
            ],
            state: Box::new(move |out: &mut dyn std::io::Write| {
                postcard::to_io(&state, &mut *out)?;
                if let Some(scale) = &return_scale {
                    postcard::to_io(&scale, out)?;
                }
                Ok(())
            }),
        };
        let keep = match self.defer_pruning {
            true => None,
            false => self.config.checkpoint.keep.while_training(),
        };
        checkpoint::save(&self.run_dir, self.step, &files, keep)?;
        Ok(())
    }

    /// Mean return of `episodes` evaluation episodes at the configured epsilon, on a
    /// separate environment seeded from the run seed and `index`; a video records what
    /// it wants of them.
    pub fn evaluate(&mut self, index: u64, video: Option<&mut Video>) -> Result<Evaluation> {
        let env = match &mut self.eval_env {
            Some(env) => env,
            None => self.eval_env.insert(EvalEnv::make(&self.config.env.id)?),
        };
        evaluate_in(env.fresh()?, &self.agent, &self.config, index, video)
    }

    /// Diverges on the first non-finite trainable value of the online network.
    fn check_parameters(&mut self) -> Result<()> {
        let mut bad = None;
        for p in self.agent.online().store().trainable() {
            let values: Vec<f32> = p.var.as_tensor().flatten_all()?.to_vec1()?;
            if values.iter().any(|v| !v.is_finite()) {
                bad = Some(format!("parameter {} is not finite", p.name));
                break;
            }
        }
        if let Some(what) = bad {
            self.record.diverge(self.step, what);
        }
        Ok(())
    }

    /// The layers' statistics, and the diagnostics once learning has started.
    fn log_layer_stats(&mut self) -> Result<()> {
        let svd = self.config.norm.weight == normrl_agents::nn::WeightRule::Svb;
        for stats in self.agent.online().stats(svd)? {
            for (name, value) in stats.values {
                let tag = format!("layers/{}/{name}", stats.layer);
                self.record.tb.scalar(&tag, value, self.step);
            }
        }
        if self.step > self.config.replay.learning_starts {
            let seed = self.config.run.seed;
            self.diagnostics.at_interval(
                &self.agent,
                &self.replay,
                seed,
                self.step,
                &mut self.record.tb,
            )?;
        }
        Ok(())
    }

    /// Trains until `total_steps` (or `stop_at`, for tests of resuming), then
    /// evaluates, checkpoints and writes `summary.json`.
    pub fn run(&mut self, stop_at: Option<u64>) -> Result<Option<RunSummary>> {
        let total = self.config.run.total_steps;
        let end = stop_at.unwrap_or(total).min(total);
        self.begin();
        let mut clock = Clock::new(&self.config, self.step);
        train_to(self, end, &mut clock)?;
        self.conclude(&mut clock)
    }

    /// The session's start in TensorBoard, or where a resumed run picks it up.
    pub(crate) fn begin(&mut self) {
        self.record.begin(&self.config, self.step);
    }

    /// After the loop: a diverged run's summary; a checkpoint when stopped early
    /// (`None`); else the final evaluation, checkpoint and summary.
    pub(crate) fn conclude(&mut self, clock: &mut Clock) -> Result<Option<RunSummary>> {
        let total = self.config.run.total_steps;
        if let Some(divergence) = self.record.divergence().cloned() {
            return self.finish_diverged(clock, divergence).map(Some);
        }
        if self.step < total {
            // Stopped early on request: leave a checkpoint to resume from.
            self.save_checkpoint(clock.elapsed())?;
            clock.progress.finish();
            return Ok(None);
        }
        self.finish(clock).map(Some)
    }

    /// A stop request: a checkpoint at this step, the logs flushed.
    pub(crate) fn interrupt(&mut self, signal: i32, clock: &Clock) -> Result<Interrupted> {
        self.save_checkpoint(clock.elapsed())?;
        self.record.tb.flush()?;
        clock.progress.finish();
        // Not running any more: `normrl status` says interrupted.
        self.record.stop_beating();
        Ok(Interrupted {
            signal,
            step: self.step,
        })
    }

    /// One environment step with an epsilon-greedy action, into the replay.
    fn env_step(&mut self, epsilon: f64) -> Result<()> {
        let action = self.agent.act(&self.obs, epsilon, &mut self.act_rng)?;
        self.apply_action(action)
    }

    /// Epsilon-greedy at this step, the greedy action given (a population's, computed
    /// for all its agents at once): the same draws as [`Dqn::act`].
    pub(crate) fn explore_or(&mut self, greedy: usize) -> Result<usize> {
        let epsilon = self.config.exploration.at(self.step);
        let n = self.agent.online().n_actions();
        epsilon_greedy(&mut self.act_rng, epsilon, n, || Ok(greedy)).map_err(Into::into)
    }

    /// One environment step with `action`, into the replay.
    pub(crate) fn apply_action(&mut self, action: usize) -> Result<()> {
        // An environment that fails (a bridged worker that died) stops the run, saying
        // so the same way whether it failed stepping or resetting.
        let stopped = |step: u64| {
            format!(
                "training stopped at step {step}; the last checkpoint is intact (resume with --resume)"
            )
        };
        let (outcome, game_over) = self
            .env
            .step_game(action, &mut self.next_obs)
            .with_context(|| stopped(self.step))?;
        self.replay.push(
            action,
            outcome.reward,
            outcome.terminated,
            outcome.truncated,
            &self.next_obs,
        );
        if let Some(scale) = &mut self.return_scale {
            scale.push(f64::from(outcome.reward), outcome.done());
        }
        self.step += 1;
        // With a lost life as the end of an episode (Atari) the learner's episode ends
        // but the game goes on: only whole games are logged.
        if game_over {
            self.log_game();
        }
        if outcome.done() {
            let step = self.step;
            self.env
                .reset(None, &mut self.obs)
                .with_context(|| stopped(step))?;
            self.replay.start_episode(&self.obs);
        } else {
            std::mem::swap(&mut self.obs, &mut self.next_obs);
        }
        Ok(())
    }

    /// Logs a finished game's return and length.
    fn log_game(&mut self) {
        let stats = self.env.episode_stats().unwrap_or_default();
        let ret = stats.last_return.unwrap_or(0.0);
        let length = stats.last_length.unwrap_or(0) as f64;
        self.record.game(self.step, ret, length);
    }

    pub(crate) fn run_task(
        &mut self,
        task: Periodic,
        epsilon: f64,
        clock: &mut Clock,
    ) -> Result<()> {
        match task {
            Periodic::Train => self.train(),
            Periodic::Log => {
                self.check_parameters()?;
                self.record.beat(self.step)?;
                let sps = clock.lap(self.step);
                self.record.tb.scalar("charts/SPS", sps, self.step);
                self.record.tb.scalar("charts/epsilon", epsilon, self.step);
                self.record.log_updates(self.step)?;
                clock
                    .progress
                    .update(self.step, sps, self.record.recent_return());
                Ok(())
            }
            Periodic::LayerStats => self.log_layer_stats(),
            Periodic::Evaluate => self.evaluate_and_log().map(|_| ()),
            Periodic::Checkpoint => {
                self.save_checkpoint(clock.elapsed())?;
                self.record.tb.flush()
            }
        }
    }

    /// `replay.gradient_steps` updates on batches from the replay.
    fn train(&mut self) -> Result<()> {
        for _ in 0..self.config.replay.gradient_steps {
            self.sample()?;
            let info = self.agent.update(&self.batch)?;
            self.record.update(self.step, &info)?;
            self.after_update()?;
        }
        Ok(())
    }

    /// An evaluation, added to the curve and logged.
    fn evaluate_and_log(&mut self) -> Result<f64> {
        let mut video = self
            .config
            .eval
            .video
            .then(|| Video::new(TENSORBOARD_VIDEO));
        let eval = self.evaluate(self.record.evaluations(), video.as_mut())?;
        let ret = eval.mean_return;
        self.record.evaluation(self.step, ret);
        if let Some(video) = video {
            self.record.episode_video(self.step, video)?;
        }
        self.diagnostics
            .at_evaluation(&eval, self.step, &mut self.record.tb);
        Ok(ret)
    }

    /// A diverged run's end: no evaluation (its policy is not finite), a summary that
    /// says where it diverged and holds the curves so far, no checkpoint to resume.
    fn finish_diverged(&mut self, clock: &Clock, divergence: Divergence) -> Result<RunSummary> {
        self.record.diverged_at(self.step, &divergence);
        clock.progress.finish();
        let last = self.record.eval_curve.last().map_or(f64::NAN, |(_, r)| *r);
        let summary = self.summary(clock, last, Some(divergence));
        self.write_summary(&summary)?;
        Ok(summary)
    }

    /// The final evaluation, checkpoint and `summary.json`. A run resumed from its
    /// final checkpoint (killed before `summary.json`) has its final evaluation
    /// already: it only writes what is missing, with the saved results.
    fn finish(&mut self, clock: &Clock) -> Result<RunSummary> {
        let step = self.step;
        let saved_final = self
            .record
            .eval_curve
            .last()
            .filter(|(s, _)| *s == step)
            .copied();
        let final_return = match saved_final {
            Some((_, ret)) => ret,
            None => {
                let ret = self.evaluate_and_log()?;
                self.record.log_updates(self.step)?;
                self.save_checkpoint(clock.elapsed())?;
                ret
            }
        };
        clock.progress.finish();
        let summary = self.summary(clock, final_return, None);
        self.write_summary(&summary)?;
        Ok(summary)
    }
}

impl Trainer {
    fn summary(
        &self,
        clock: &Clock,
        final_return: f64,
        diverged: Option<Divergence>,
    ) -> RunSummary {
        let cfg = &self.config;
        RunSummary {
            env: cfg.env.id.clone(),
            norm: cfg.norm.name(),
            seed: cfg.run.seed,
            steps: self.step,
            episodes: self.record.episodes,
            updates: self.agent.updates(),
            eval_curve: self.record.eval_curve.clone(),
            train_curve: self.record.train_curve.clone(),
            // JSON has no NaN: a diverged run without evaluations reports 0, and
            // reports never average a diverged run in.
            final_eval_return: if final_return.is_finite() {
                final_return
            } else {
                0.0
            },
            wall_seconds: self.wall_before + clock.elapsed(),
            steps_per_second: (self.step - clock.start_step) as f64 / clock.elapsed().max(1e-9),
            diverged,
            diagnostics: self.diagnostics.curves.clone(),
            diagnostics_seconds: self.diagnostics.seconds,
        }
    }

    fn write_summary(&mut self, summary: &RunSummary) -> Result<()> {
        self.record.write_end(&self.config, summary, self.step)
    }

    /// Names the run's variant in its `result.json` (a comparison's label).
    pub fn set_variant(&mut self, variant: &str) {
        self.record.set_variant(variant);
    }
}

/// What a population (`run/population/`) asks of its members: their observations and
/// replays, each step's action from outside, the update's numbers from outside, and
/// their single agent, into which the population writes the member's agent before
/// anything reads it (evaluations, diagnostics, checkpoints).
impl Trainer {
    pub(crate) fn obs(&self) -> &[f32] {
        &self.obs
    }

    pub(crate) fn agent_mut(&mut self) -> &mut Dqn {
        &mut self.agent
    }

    pub(crate) fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub(crate) fn is_diverged(&self) -> bool {
        self.record.divergence().is_some()
    }

    /// Keeps older checkpoints when writing a new one; the population prunes them once
    /// every member has written its own.
    pub(crate) fn defer_pruning(&mut self) {
        self.defer_pruning = true;
    }

    /// Draws the next batch (into [`Self::batch`]) from the replay with the run's
    /// generator, its rewards scaled as `dqn.reward_scale` says (here, so that a
    /// population's member scales its batch as a single run does).
    pub(crate) fn sample(&mut self) -> Result<()> {
        let sampler = self.config.replay.sampler;
        self.replay
            .sample(sampler, &mut self.batch, &mut self.replay_rng)?;
        self.scale_rewards();
        // The first update's init batch, once (a population's member stays
        // uninitialized until its population's state is written back to it).
        let agent = &self.agent;
        if !agent.is_initialized()
            && agent.online().wants_data_dependent_init()
            && self.batch.init_obs.is_empty()
        {
            // As many rows in every member of a population (one config): no more than
            // the replay holds at the first update, whatever the episodes' lengths.
            let replay = &self.config.replay;
            let starts = usize::try_from(replay.learning_starts).unwrap_or(usize::MAX);
            let rows = INIT_OBSERVATIONS.min(starts.max(1)).min(replay.capacity);
            let obs = &mut self.batch.init_obs;
            self.replay.spread_observations(rows, obs);
        }
        Ok(())
    }

    /// The batch's rewards divided by the running return's spread, SimbaV2's or XQC's
    /// (`dqn.reward_scale`).
    fn scale_rewards(&mut self) {
        if let Some(scale) = &self.return_scale {
            let divisor = match self.config.dqn.reward_scale {
                RewardScale::ReturnStd => scale.xqc_divisor(),
                _ => scale.simbav2_divisor(self.config.dqn.support.v_max),
            } as f32;
            for r in &mut self.batch.rewards {
                *r /= divisor;
            }
        }
    }

    /// From now on, batches take only their transitions' slots (a population reads
    /// their frames from its device mirror).
    pub(crate) fn sample_without_frames(&mut self) {
        self.batch = Batch::without_frames(self.batch.size);
    }

    pub(crate) fn batch(&self) -> &Batch {
        &self.batch
    }

    pub(crate) fn replay(&self) -> &ReplayBuffer {
        &self.replay
    }

    /// Whether the diagnostics wait for the next update (its effective step).
    pub(crate) fn awaits_update(&self) -> bool {
        self.diagnostics.awaits_update()
    }

    /// The diagnostics after an update, the agent written in.
    pub(crate) fn after_update(&mut self) -> Result<()> {
        self.diagnostics
            .after_update(&self.agent, self.step, &mut self.record.tb)
    }

    pub(crate) fn recent_return(&self) -> Option<f64> {
        self.record.recent_return()
    }

    /// The updates' mean TD loss, Q-value and gradient norm since the last log, and a
    /// distributional head's mean value entropy.
    pub(crate) fn log_update_means(&mut self, means: [f64; 3], entropy: Option<f64>) {
        self.record.log_update_means(self.step, means, entropy);
    }
}

/// A single run's steps for the loop: an epsilon-greedy environment step, and the
/// periodic work with that step's epsilon.
impl Steps for Trainer {
    fn config(&self) -> &TrainConfig {
        &self.config
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn training(&self) -> bool {
        !self.is_diverged()
    }

    fn take_step(&mut self) -> Result<()> {
        self.env_step(self.config.exploration.at(self.step))
    }

    fn periodic(&mut self, task: Periodic, clock: &mut Clock) -> Result<()> {
        // The epsilon the step just taken acted with.
        let epsilon = self.config.exploration.at(self.step - 1);
        self.run_task(task, epsilon, clock)
    }

    fn stop(&mut self, signal: i32, clock: &Clock) -> Result<Interrupted> {
        self.interrupt(signal, clock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint without checksums (an older normrl's) whose replay holds other
    /// observations than the run's is refused as corrupt before anything changes; it
    /// read back and then failed an assertion at the first append.
    #[test]
    fn a_replay_that_does_not_fit_the_run_is_refused() {
        let dir = std::env::temp_dir().join(format!("normrl-fit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let overrides: Vec<String> = [
            "run.total_steps=400",
            "replay.learning_starts=100",
            "eval.interval=0",
            "checkpoint.interval=200",
            "logging.progress=false",
        ]
        .map(String::from)
        .to_vec();
        let text = std::fs::read_to_string("configs/cartpole.toml").unwrap();
        let config = TrainConfig::from_toml_str(&text, &overrides).unwrap();
        let capacity = config.replay.capacity;
        let mut trainer = Trainer::new(config, &dir).unwrap();
        trainer.run(Some(200)).unwrap();
        drop(trainer);
        let ckpt = checkpoint::latest(&dir).unwrap().unwrap();
        let path = ckpt.join("state.bin");
        let bytes = std::fs::read(&path).unwrap();
        let (mut state, rest): (LoopState, _) = postcard::take_from_bytes(&bytes).unwrap();
        // CartPole's observations are 4 values; a valid, empty replay of 5.
        let other = ReplayBuffer::new(capacity, 5, false);
        state.replay = Some(Cow::Owned(other));
        let mut damaged = postcard::to_allocvec(&state).unwrap();
        damaged.extend_from_slice(rest);
        std::fs::write(&path, damaged).unwrap();
        std::fs::remove_file(ckpt.join("manifest.json")).unwrap();
        let err = format!("{:#}", Trainer::resume(&dir).err().unwrap());
        assert!(
            err.contains("is corrupt: its replay holds") && err.contains("slots of 5 values"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
