//! `normrl train` and `normrl eval`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use normrl_envs::make;

use crate::config::validate::MemoryEstimate;
use crate::config::{parse_device_spec, select_device, TrainConfig};
use crate::logging::video::{check_renders, Video, EVAL_VIDEO};
use crate::run::checkpoint;
use crate::run::files::Diverged;
use crate::run::population::{population_members, population_root, train_members, SingleRun};
use crate::run::train::{
    evaluate, evaluate_in, finished_summary, set_threads, RunSummary, Trainer,
};

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The run's TOML config.
    #[arg(long, required_unless_present = "resume")]
    pub config: Option<PathBuf>,
    /// Override a config value, e.g. `--set replay.batch_size=4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Where the run writes its TensorBoard files, config and checkpoints
    /// (default: runs/<run.name>).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Continue an interrupted run from its latest checkpoint.
    #[arg(long, conflicts_with_all = ["config", "overrides", "run_dir"])]
    pub resume: Option<PathBuf>,
    /// Shortcut for `--set run.device=...`.
    #[arg(long)]
    pub device: Option<String>,
    /// Accept legal values that are almost surely a mistake (`--set run.allow_odd=true`).
    #[arg(long)]
    pub allow_odd: bool,
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A run directory (its latest checkpoint) or a checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub episodes: u64,
    /// Epsilon of the evaluation policy (default: the run's eval.epsilon).
    #[arg(long)]
    pub epsilon: Option<f64>,
    /// Seeds the evaluation episodes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Writes the episodes, one after the other, as an animated GIF (e.g. `out.gif`),
    /// each frame captioned with its episode, step and return.
    #[arg(long, value_name = "FILE.gif")]
    pub video: Option<PathBuf>,
    /// Override a value of the run's config for this evaluation only (repeatable),
    /// e.g. `--set env.id=gym:CartPole-v1?render_mode=rgb_array`; the run's files are
    /// not changed. `--video` adds `render_mode=rgb_array` to a `gym:` id by itself.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

pub fn train(args: &TrainArgs) -> Result<()> {
    let trainer = match (&args.resume, &args.config) {
        (Some(dir), _) => {
            if let Some(config) = population_root(dir)? {
                return train_population(config, dir, false);
            }
            if let Some(summary) = finished_summary(dir)? {
                // Finished is final: nothing trains, evaluates or is rewritten.
                eprintln!("{} holds a finished run; nothing to resume", dir.display());
                print_summary(&summary);
                return Ok(());
            }
            Trainer::resume(dir)?
        }
        (None, Some(path)) => {
            let mut overrides = args.overrides.clone();
            if let Some(d) = &args.device {
                overrides.push(format!("run.device={d}"));
            }
            if args.allow_odd {
                overrides.push("run.allow_odd=true".into());
            }
            let config = TrainConfig::load(path, &overrides)?;
            let run_dir = args
                .run_dir
                .clone()
                .unwrap_or_else(|| Path::new("runs").join(&config.run.name));
            if config.run.population > 1 {
                return train_population(config, &run_dir, true);
            }
            refuse_other_kind(&run_dir, false)?;
            crate::config::device_memory::check(&config, 1)?;
            Trainer::new(config, &run_dir)?
        }
        (None, None) => bail!("give --config FILE or --resume RUN_DIR"),
    };
    let device = trainer.agent().online().store().device().clone();
    let asked = trainer.config().run.device.clone();
    let why = match (asked.as_str(), device.is_cpu()) {
        ("auto", true) if candle_core::utils::cuda_is_available() => {
            ", run.device = auto: no usable CUDA device"
        }
        ("auto", true) => ", run.device = auto: this binary has no CUDA",
        ("auto", false) => ", run.device = auto",
        _ => "",
    };
    eprintln!(
        "training {} on {}{why}",
        trainer.agent().online().norm().name(),
        match (device.is_cpu(), asked.as_str()) {
            (true, _) => "cpu",
            (false, "auto") => "cuda:0",
            (false, spec) => spec,
        },
    );
    let run_dir = trainer.run_dir().to_path_buf();
    let summary = SingleRun::new(trainer)?.run(None);
    if let Some(summary) = summary.map_err(|e| resumable(e, &run_dir))? {
        print_summary(&summary);
        if let Some(d) = summary.diverged {
            return Err(Diverged(d).into());
        }
    }
    Ok(())
}

/// `run.population > 1`: the members train as one population, fresh (`run_dir` then
/// holds no run yet; its `config.toml` is the population's) or resumed.
fn train_population(config: TrainConfig, run_dir: &Path, fresh: bool) -> Result<()> {
    let members = population_members(&config, run_dir);
    if fresh {
        let started = members.iter().any(|m| holds_run(&m.dir));
        if started {
            bail!(
                "{} already holds a population; resume it with --resume {} or choose another --run-dir",
                run_dir.display(),
                run_dir.display()
            );
        }
        refuse_other_kind(run_dir, true)?;
        set_threads(config.run.threads);
        check_population_memory(&config)?;
        crate::config::device_memory::check(&config, members.len())?;
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        crate::storage::write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
    }
    eprintln!(
        "training a population of {} ({}) in {}",
        members.len(),
        config.norm.name(),
        run_dir.display()
    );
    let summaries = train_members(&members, None).map_err(|e| resumable(e, run_dir))?;
    let mut diverged = None;
    for summary in summaries.into_iter().flatten() {
        print_summary(&summary);
        diverged = diverged.or(summary.diverged);
    }
    match diverged {
        Some(d) => Err(Diverged(d).into()),
        None => Ok(()),
    }
}

/// A run's error after it started (a device that ran out of memory, a failed write):
/// its checkpoints are written atomically, so the last one is intact, and the error
/// says how to go on from it. An interruption keeps its type and gains the command
/// that resumes; a run another process holds passes as it is.
fn resumable(error: anyhow::Error, run_dir: &Path) -> anyhow::Error {
    let dir = run_dir.display();
    if error
        .downcast_ref::<crate::run::interrupt::Interrupted>()
        .is_some()
    {
        return error.context(format!("resume with normrl train --resume {dir}"));
    }
    if error
        .downcast_ref::<crate::storage::lock::Locked>()
        .is_some()
    {
        return error;
    }
    error.context(format!(
        "training stopped; the last checkpoint in {dir} is intact: continue from it with normrl train --resume {dir}"
    ))
}

/// Whether a single run has started in `dir`: it finished, or wrote a checkpoint.
fn holds_run(dir: &Path) -> bool {
    dir.join(crate::run::files::SUMMARY_FILE).exists() || dir.join("checkpoints").exists()
}

/// A fresh run never takes a directory that holds the other kind: its `config.toml`
/// would replace the other's, and a later `--resume` would train the wrong kind (a
/// population's members beside a single run's files, or one agent at a population's
/// root). An unreadable `config.toml` is no population's (a fresh run replaces it).
fn refuse_other_kind(run_dir: &Path, population: bool) -> Result<()> {
    let holds_population = population_root(run_dir).ok().flatten().is_some();
    let other = match (population, holds_population, holds_run(run_dir)) {
        (false, true, _) => "a population (run.population > 1)",
        (true, _, true) => "a single run",
        _ => return Ok(()),
    };
    bail!(
        "{} holds {other}: resume it with --resume {}, or choose another --run-dir",
        run_dir.display(),
        run_dir.display()
    )
}

/// All members' replays and networks must fit together.
fn check_population_memory(config: &TrainConfig) -> Result<()> {
    let Some(available) = crate::config::validate::machine_memory() else {
        return Ok(());
    };
    let env = make(&config.env.id)?;
    let one = MemoryEstimate::of(config, &env.observation_space(), env.action_space().n);
    let p = config.run.population as u128;
    let all = MemoryEstimate {
        replay_bytes: one.replay_bytes * p,
        network_bytes: one.network_bytes * p,
    };
    all.check(config, available)
        .with_context(|| format!("run.population = {p} members together"))
}

fn print_summary(summary: &RunSummary) {
    println!(
        "{} {} seed {}: {} steps, {} episodes, final eval return {:.2}, {:.0} steps/s",
        summary.env,
        summary.norm,
        summary.seed,
        summary.steps,
        summary.episodes,
        summary.final_eval_return,
        summary.steps_per_second
    );
}

pub fn eval(args: &EvalArgs) -> Result<()> {
    if args.episodes == 0 {
        bail!("--episodes must be a positive integer");
    }
    let (run_dir, ckpt) = if args.checkpoint.join("checkpoints").exists() {
        let latest = checkpoint::newest_valid(&args.checkpoint)?
            .with_context(|| format!("{} has no checkpoint", args.checkpoint.display()))?;
        (args.checkpoint.clone(), latest)
    } else if args.checkpoint.join("online.safetensors").exists() {
        let run = args
            .checkpoint
            .parent()
            .and_then(Path::parent)
            .context("a checkpoint directory lies in RUN_DIR/checkpoints/")?;
        let how = checkpoint::verify(&args.checkpoint)?;
        checkpoint::note_unverified(&args.checkpoint, how);
        (run.to_path_buf(), args.checkpoint.clone())
    } else {
        bail!(
            "{} is neither a run directory nor a checkpoint directory",
            args.checkpoint.display()
        );
    };
    if let Some(path) = &args.video {
        check_video_path(path)?;
    }
    let mut config = TrainConfig::load(&run_dir.join("config.toml"), &args.overrides)?;
    if args.video.is_some() {
        config.env.id = with_frames(&config.env.id);
    }
    config.eval.episodes = args.episodes;
    config.run.seed = args.seed;
    if let Some(e) = args.epsilon {
        if !(0.0..=1.0).contains(&e) {
            bail!("--epsilon must be in [0, 1]");
        }
        config.eval.epsilon = e;
    }
    set_threads(config.run.threads);
    let device = select_device(parse_device_spec(&config.run.device)?)?;
    let agent = checkpoint::agent_from_checkpoint(&config, &ckpt, &device)?;
    let eval = match &args.video {
        None => evaluate(&agent, &config, 0, None)?,
        Some(path) => evaluate_on_video(&agent, &config, path)?,
    };
    println!(
        "{} over {} episodes (epsilon {}): mean return {:.2}; max Q at the first \
         observation {:.3} against a discounted return of {:.3}",
        config.env.id,
        args.episodes,
        config.eval.epsilon,
        eval.mean_return,
        eval.q_start,
        eval.discounted_return
    );
    Ok(())
}

/// A Gymnasium id that renders frames: `render_mode=rgb_array` added to a `gym:` id's
/// options where it names no render mode (a run trained without frames can still be
/// filmed). Other ids are returned as they are.
fn with_frames(id: &str) -> String {
    if !id.starts_with("gym:") || id.contains("render_mode=") {
        return id.to_string();
    }
    let joint = if id.contains('?') { '&' } else { '?' };
    format!("{id}{joint}render_mode=rgb_array")
}

/// Checks `--video`'s path: a `.gif` file in a directory that exists.
fn check_video_path(path: &Path) -> Result<()> {
    let is_gif = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gif"));
    if !is_gif {
        bail!(
            "--video {}: the video is written as an animated GIF; name a .gif file",
            path.display()
        );
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "--video {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The evaluation, with its episodes written to `path` as a GIF once all are played
/// (atomically: an error leaves no file). An environment that cannot draw itself is
/// refused before any episode.
fn evaluate_on_video(
    agent: &normrl_agents::dqn::Dqn,
    config: &TrainConfig,
    path: &Path,
) -> Result<crate::run::diagnostics::Evaluation> {
    let mut env = make(&config.env.id)?;
    check_renders(env.as_mut()).context("--video")?;
    let mut video = Video::new(EVAL_VIDEO);
    let eval = evaluate_in(env.as_mut(), agent, config, 0, Some(&mut video))?;
    let frames = video.frames();
    if let Some((gif, width, height)) = video.finish()? {
        crate::storage::write_atomic(path, &gif)?;
        eprintln!(
            "wrote {}: {frames} frames of {width} x {height}, {} KiB",
            path.display(),
            gif.len().div_ceil(1024)
        );
    }
    Ok(eval)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device error after training started says the checkpoint is intact and how to
    /// resume; an interruption keeps its type and gains the command that resumes.
    #[test]
    fn an_error_mid_run_says_how_to_resume() {
        let dir = Path::new("runs/pop");
        let e = resumable(
            anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY)"),
            dir,
        );
        let text = format!("{e:#}");
        assert!(text.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
        assert!(
            text.contains("the last checkpoint in runs/pop is intact"),
            "{text}"
        );
        assert!(text.contains("normrl train --resume runs/pop"), "{text}");
        let stop = crate::run::interrupt::Interrupted {
            signal: 15,
            step: 7,
        };
        let e = resumable(stop.into(), dir);
        assert!(e
            .downcast_ref::<crate::run::interrupt::Interrupted>()
            .is_some());
        assert_eq!(
            crate::run::interrupt::resume_hint(&e),
            "resume with normrl train --resume runs/pop"
        );
    }
}
