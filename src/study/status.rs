//! `normrl status runs/<experiment>`: where each run of a comparison's plan stands,
//! read from the files runs leave (on a shared file system, a cluster's too): done
//! (`summary.json`), running (its lock held by a process, or on a file system whose
//! locks this machine cannot see, a heartbeat younger than `--stale-after`), failed (an
//! `error.txt`, with its last lines), interrupted (a checkpoint and no fresh heartbeat:
//! it resumes when its task runs again), not started.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::run::files::unix_seconds;
use crate::run::files::ERROR_FILE;
use crate::run::files::{Heartbeat, HEARTBEAT_FILE, RESULT_FILE, SUMMARY_FILE};
use crate::study::plan::Plan;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The experiment directory (with the plan.json that `normrl compare` writes), or
    /// a training population's directory (`run.population`).
    pub dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds after which a heartbeat no longer counts as running (a training run
    /// writes one every 5 seconds or so, at its logs).
    #[arg(long, default_value_t = 600.0)]
    pub stale_after: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RunState {
    Done,
    Running { host: String, pid: u32, step: u64 },
    Failed { error: Vec<String> },
    Interrupted,
    NotStarted,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunStatus {
    pub dir: PathBuf,
    pub variant: String,
    #[serde(flatten)]
    pub state: RunState,
}

/// Per variant: done, running, failed, interrupted, not started.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub done: usize,
    pub running: usize,
    pub failed: usize,
    pub interrupted: usize,
    pub not_started: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub experiment: String,
    pub variants: BTreeMap<String, Counts>,
    pub runs: Vec<RunStatus>,
}

/// Whether the run in `dir` has finished, read without touching it. A run merged from an
/// archive holds only its result.json: finished as well.
pub fn has_finished(dir: &Path) -> bool {
    dir.join(SUMMARY_FILE).exists() || dir.join(RESULT_FILE).exists()
}

/// The state of the run in `dir` now.
fn state_of(dir: &Path, stale_after: f64) -> Result<RunState> {
    if has_finished(dir) {
        return Ok(RunState::Done);
    }
    let beat = std::fs::read_to_string(dir.join(HEARTBEAT_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<Heartbeat>(&text).ok());
    if let Some(holder) = crate::storage::lock::holder(dir) {
        // The heartbeat knows the step; the lock knows the run is alive.
        let step = beat
            .as_ref()
            .filter(|b| b.pid == holder.pid)
            .map_or(0, |b| b.step);
        let (host, pid) = (holder.host, holder.pid);
        return Ok(RunState::Running { host, pid, step });
    }
    if let Some(beat) = beat.filter(|b| unix_seconds() - b.unix_seconds < stale_after) {
        let (host, pid, step) = (beat.host, beat.pid, beat.step);
        return Ok(RunState::Running { host, pid, step });
    }
    if let Ok(text) = std::fs::read_to_string(dir.join(ERROR_FILE)) {
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let error = lines[lines.len().saturating_sub(5)..].to_vec();
        return Ok(RunState::Failed { error });
    }
    if crate::run::checkpoint::latest(dir)?.is_some() {
        return Ok(RunState::Interrupted);
    }
    Ok(RunState::NotStarted)
}

/// The runs under `root`, `(directory below root, variant)`, and the experiment's
/// name: a comparison's plan, or a training population's members (`run.population`).
fn planned_runs(root: &Path) -> Result<(String, Vec<(PathBuf, String)>)> {
    if let Some(plan) = Plan::load(root)? {
        let runs = plan.runs.iter().map(|e| (e.dir.clone(), e.variant.clone()));
        return Ok((plan.name.clone(), runs.collect()));
    }
    let Some(config) = crate::run::population::population_root(root)? else {
        anyhow::bail!(
            "{} has no plan.json: give the directory of a comparison that `normrl compare` has started, or of a training population",
            root.display()
        );
    };
    let variant = config.norm.name();
    let members = crate::run::population::population_members(&config, root);
    let runs = members.iter().filter_map(|m| {
        let dir = m.dir.strip_prefix(root).ok()?.to_path_buf();
        Some((dir, variant.clone()))
    });
    Ok((config.run.name.clone(), runs.collect()))
}

pub fn status_of(root: &Path, stale_after: f64) -> Result<Status> {
    let (name, planned) = planned_runs(root)?;
    let mut variants: BTreeMap<String, Counts> = BTreeMap::new();
    let mut runs = vec![];
    for (dir, variant) in planned {
        let state = state_of(&root.join(&dir), stale_after)?;
        let counts = variants.entry(variant.clone()).or_default();
        *match state {
            RunState::Done => &mut counts.done,
            RunState::Running { .. } => &mut counts.running,
            RunState::Failed { .. } => &mut counts.failed,
            RunState::Interrupted => &mut counts.interrupted,
            RunState::NotStarted => &mut counts.not_started,
        } += 1;
        runs.push(RunStatus {
            dir,
            variant,
            state,
        });
    }
    Ok(Status {
        experiment: name,
        variants,
        runs,
    })
}

/// The table: a row per variant, then the failed runs' last error lines.
pub fn table(status: &Status) -> String {
    let mut out = format!(
        "{}\n\n| variant | done | running | failed | interrupted | not started |\n|---|---|---|---|---|---|\n",
        status.experiment
    );
    let mut total = Counts::default();
    for (variant, c) in &status.variants {
        out.push_str(&format!(
            "| {variant} | {} | {} | {} | {} | {} |\n",
            c.done, c.running, c.failed, c.interrupted, c.not_started
        ));
        total.done += c.done;
        total.running += c.running;
        total.failed += c.failed;
        total.interrupted += c.interrupted;
        total.not_started += c.not_started;
    }
    out.push_str(&format!(
        "| all | {} | {} | {} | {} | {} |\n",
        total.done, total.running, total.failed, total.interrupted, total.not_started
    ));
    for run in &status.runs {
        match &run.state {
            RunState::Failed { error } => {
                out.push_str(&format!("\nfailed: {}\n", run.dir.display()));
                for line in error {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            RunState::Running { host, pid, step } => out.push_str(&format!(
                "\nrunning: {} (host {host}, pid {pid}, step {step})\n",
                run.dir.display()
            )),
            _ => {}
        }
    }
    out
}

pub fn status(args: &StatusArgs) -> Result<()> {
    // NaN compares false with every age: no run would ever count as running.
    if !(args.stale_after.is_finite() && args.stale_after > 0.0) {
        anyhow::bail!(
            "--stale-after = {} must be a positive number of seconds",
            args.stale_after
        );
    }
    let status = status_of(&args.dir, args.stale_after)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", table(&status));
    }
    Ok(())
}
