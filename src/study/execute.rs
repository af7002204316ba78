//! A comparison's runs executed: parallel workers, each unit of work (one run or a
//! population) started or resumed, finished runs and runs held by another process
//! skipped, a failure recorded in the run's `error.txt`, a stop request passed on.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::run::files::ERROR_FILE;
use crate::run::interrupt::Interrupted;
use crate::run::population::{train_members, Member};
use crate::run::train::{set_threads, Trainer};
use crate::storage::lock::Locked;
use crate::study::compare::{population_units, CompareConfig, PlannedRun};
use crate::study::finished::{self, Finish};

/// The HParams dashboard's experiment (axes, values, metrics) at the root of the runs,
/// in an event file of its own, written once per invocation.
fn write_experiment(config: &CompareConfig, runs: &[PlannedRun], root: &Path) -> Result<()> {
    let configs = runs
        .iter()
        .map(|r| config.config_for(r))
        .collect::<Result<Vec<_>>>()?;
    let content = crate::logging::hparams::experiment(
        &config.name,
        &configs,
        crate::run::files::unix_seconds(),
    );
    let mut tb = crate::logging::tensorboard::TensorBoard::new(root)?;
    tb.plugin_summary(
        crate::logging::hparams::EXPERIMENT_TAG,
        "hparams",
        content,
        0,
    );
    tb.flush()
}

/// What [`execute`] left to others: runs finished before it started, and runs another
/// process was training (their lock held), both skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    pub finished_before: usize,
    pub held_elsewhere: usize,
}

/// What the workers found, shared between them.
#[derive(Default)]
struct Tally {
    errors: Mutex<Vec<String>>,
    interrupted: Mutex<Option<Interrupted>>,
    done: AtomicUsize,
    skipped: AtomicUsize,
    held: AtomicUsize,
}

impl Tally {
    fn failed(&self, run: &PlannedRun, e: impl std::fmt::Display) {
        let line = format!("{}: {e}", run.rel_dir.display());
        self.errors.lock().expect("error list").push(line);
    }

    /// The invocation's result: the failures, else the stop request, else the counts.
    fn finish(self) -> Result<Executed> {
        let errors = self.errors.into_inner().expect("error list");
        if !errors.is_empty() {
            bail!("{} runs failed:\n{}", errors.len(), errors.join("\n"));
        }
        if let Some(stop) = self.interrupted.into_inner().expect("interruption") {
            return Err(stop.into());
        }
        Ok(Executed {
            finished_before: self.skipped.into_inner(),
            held_elsewhere: self.held.into_inner(),
        })
    }
}

/// Runs `runs` with `jobs` workers, each single-threaded: finished runs (with a
/// readable `summary.json` or `result.json`; a damaged one is repaired or the run
/// retrained, see [`finished::check`]) are skipped, and so are runs another process
/// holds (two invocations over one study share its work); interrupted ones resume from
/// their checkpoint. On a stop request (SIGTERM, SIGUSR1) every worker checkpoints its
/// run and starts no other, and the result is that [`Interrupted`].
pub fn execute(
    config: &CompareConfig,
    runs: &[PlannedRun],
    root: &Path,
    jobs: usize,
) -> Result<Executed> {
    set_threads(1);
    write_experiment(config, runs, root)?;
    let units = population_units(config, runs)?;
    let next = AtomicUsize::new(0);
    let tally = Tally::default();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(unit) = units.get(i) else { break };
                if crate::run::interrupt::requested().is_some() {
                    break;
                }
                let unit: Vec<&PlannedRun> = unit.iter().map(|&k| &runs[k]).collect();
                work(config, &unit, runs.len(), root, &tally);
            });
        }
    });
    tally.finish()
}

/// One unit of work: its finished runs skipped, the rest trained, each outcome said.
fn work(config: &CompareConfig, unit: &[&PlannedRun], total: usize, root: &Path, tally: &Tally) {
    let mut pending = vec![];
    for &run in unit {
        match finished::check(&root.join(&run.rel_dir), &run.variant) {
            Ok(Finish::Pending) => pending.push(run),
            Ok(Finish::Done) => {
                tally.skipped.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Finish::Repaired(how)) => {
                eprintln!("{}: finished; {how}", run.rel_dir.display());
                tally.skipped.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Finish::Retrain(how)) => {
                eprintln!("{}: {how}", run.rel_dir.display());
                pending.push(run);
            }
            Err(e) => tally.failed(run, format!("{e:#}")),
        }
    }
    if pending.is_empty() {
        return;
    }
    let start = Instant::now();
    for (run, result) in run_unit(config, &pending, root) {
        let k = tally.done.fetch_add(1, Ordering::SeqCst) + 1;
        let head = format!(
            "[{k}/{total}] {} {} seed {}",
            run.env, run.variant, run.seed
        );
        let line = |message: String| eprintln!("{head}{message}");
        match outcome(result, start, &root.join(&run.rel_dir), line) {
            Outcome::Done => {}
            Outcome::Skipped => {
                tally.held.fetch_add(1, Ordering::SeqCst);
            }
            Outcome::Interrupted(stop) => {
                *tally.interrupted.lock().expect("interruption") = Some(stop);
            }
            Outcome::Failed(e) => tally.failed(run, e),
        }
    }
}

/// How one run of a comparison ended.
enum Outcome {
    Done,
    /// Held by another process (a second `compare` over the same study).
    Skipped,
    Interrupted(Interrupted),
    Failed(String),
}

/// Says how a run ended (through `line`) and, for a failure, writes its `error.txt`.
fn outcome(
    result: Result<crate::run::train::RunSummary>,
    start: Instant,
    dir: &Path,
    line: impl Fn(String),
) -> Outcome {
    match result {
        Ok(summary) => {
            let end = match &summary.diverged {
                Some(d) => format!("diverged at step {}: {}", d.step, d.what),
                None => format!("final eval return {:.2}", summary.final_eval_return),
            };
            line(format!(": {end} ({:.0} s)", start.elapsed().as_secs_f64()));
            Outcome::Done
        }
        Err(e) => match e.downcast::<Interrupted>() {
            Ok(stop) => {
                line(format!(": {stop}"));
                Outcome::Interrupted(stop)
            }
            // Another process trains it: its files are not this one's to write.
            Err(e) if e.downcast_ref::<Locked>().is_some() => {
                line(format!(" skipped: {e}"));
                Outcome::Skipped
            }
            Err(e) => {
                line(format!(" failed: {e:#}"));
                let text = format!("{e:#}\n");
                let _ = crate::storage::write_atomic(&dir.join(ERROR_FILE), text.as_bytes());
                Outcome::Failed(format!("{e:#}"))
            }
        },
    }
}

/// The runs of a unit of work (one run, or a population's), each with its outcome.
fn run_unit<'r>(
    config: &CompareConfig,
    runs: &[&'r PlannedRun],
    root: &Path,
) -> Vec<(&'r PlannedRun, Result<crate::run::train::RunSummary>)> {
    if let [run] = runs {
        return vec![(*run, run_one(config, run, &root.join(&run.rel_dir)))];
    }
    let members = runs
        .iter()
        .map(|r| {
            let dir = root.join(&r.rel_dir);
            let _ = std::fs::remove_file(dir.join(ERROR_FILE));
            Ok(Member {
                dir,
                config: config.config_for(r)?,
                variant: Some(r.variant.clone()),
            })
        })
        .collect::<Result<Vec<_>>>();
    match members.and_then(|m| train_members(&m, None)) {
        Ok(summaries) => runs
            .iter()
            .zip(summaries)
            .map(|(r, s)| (*r, s.context("the run stopped early")))
            .collect(),
        // Every member shares the population's fate.
        Err(e) => {
            let stop = e.downcast_ref::<Interrupted>().copied();
            let held = e.downcast_ref::<Locked>();
            runs.iter()
                .map(|r| match (stop, held) {
                    (Some(stop), _) => (*r, Err(stop.into())),
                    (None, Some(held)) => (*r, Err(held.clone().into())),
                    (None, None) => (*r, Err(anyhow::anyhow!("the population failed: {e:#}"))),
                })
                .collect()
        }
    }
}

/// One run: resumed from its checkpoint if it has one, else started; labelled with its
/// variant for `result.json`.
fn run_one(
    config: &CompareConfig,
    run: &PlannedRun,
    dir: &Path,
) -> Result<crate::run::train::RunSummary> {
    let _ = std::fs::remove_file(dir.join(ERROR_FILE));
    let mut trainer = if crate::run::checkpoint::latest(dir)?.is_some() {
        Trainer::resume(dir)?
    } else {
        Trainer::new(config.config_for(run)?, dir)?
    };
    trainer.set_variant(&run.variant);
    let mut run = crate::run::population::SingleRun::new(trainer)?;
    run.run(None)?.context("the run stopped early")
}
