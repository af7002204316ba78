//! A report's records: finished runs read back, each with where it sits in the grid,
//! and each environment and variant's statistics.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::report::grid::RunAxes;
use crate::report::stats::{aggregate_iqm, iqm, mean, stratified_bootstrap_ci};
use crate::run::files::is_moved_aside;
use crate::run::files::{RunResult, RESULT_FILE, SUMMARY_FILE};
use crate::run::train::RunSummary;
use crate::storage::read_json;

pub(crate) const BOOTSTRAP_REPS: usize = 2_000;

/// One finished run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub env: String,
    pub variant: String,
    /// The variant's method, batch size and sampler.
    #[serde(flatten)]
    pub axes: RunAxes,
    pub seed: u64,
    pub final_return: f64,
    /// Mean of the evaluation curve: the normalized area under it.
    pub auc: f64,
    pub steps_to_threshold: Option<u64>,
    pub wall_seconds: f64,
    pub steps_per_second: f64,
    /// The run stopped on a non-finite value: counted, never averaged in.
    pub diverged: bool,
    #[serde(skip)]
    pub eval_curve: Vec<(u64, f64)>,
    /// `(step, return)` of every training episode.
    #[serde(skip)]
    pub train_curve: Vec<(u64, f64)>,
    /// The run's diagnostics, by name (see `diagnostics.rs`).
    #[serde(skip)]
    pub diagnostics: BTreeMap<String, Vec<(u64, f64)>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantStats {
    pub env: String,
    pub variant: String,
    /// Runs that finished (diverged ones are counted apart, in `diverged_runs`).
    pub runs: usize,
    pub diverged_runs: usize,
    pub final_iqm: f64,
    pub final_ci: (f64, f64),
    pub final_mean: f64,
    pub auc_iqm: f64,
    pub auc_ci: (f64, f64),
    pub median_steps_to_threshold: Option<u64>,
    pub solved_runs: usize,
    pub mean_wall_seconds: f64,
    pub mean_steps_per_second: f64,
}

/// What a report found below its directories.
#[derive(Debug, Default)]
pub struct Loaded {
    pub runs: Vec<RunRecord>,
    /// Runs the report leaves out, each with why: a planned run (in a `plan.json`
    /// of one of the directories) that no directory holds finished, and a run whose
    /// results are unreadable.
    pub missing: Vec<String>,
    /// Runs found more than once (overlapping directories, a copied shard, results
    /// merged from an archive beside the originals) and counted once.
    pub duplicates: usize,
}

/// The runs seen so far, by identity: a run is its variant, its resolved config (which
/// holds its seed) or, for a run from before result files, its environment and seed.
#[derive(Default)]
struct Seen(HashMap<(String, String), (PathBuf, RunSummary)>);

impl Seen {
    /// Whether the run in `dir` is new; the same run seen before with the same
    /// returns is not; with other returns it is an error naming both directories.
    fn admit(
        &mut self,
        dir: &Path,
        summary: &RunSummary,
        variant: &str,
        config: Option<&str>,
    ) -> Result<bool> {
        let identity = match config {
            Some(config) => {
                crate::config::TrainConfig::canonical_toml(config).unwrap_or(config.to_string())
            }
            None => format!("{} seed {}", summary.env, summary.seed),
        };
        let key = (variant.to_string(), identity);
        let Some((first, before)) = self.0.get(&key) else {
            self.0.insert(key, (dir.to_path_buf(), summary.clone()));
            return Ok(true);
        };
        let same = before.eval_curve == summary.eval_curve
            && before.final_eval_return == summary.final_eval_return
            && before.diverged == summary.diverged;
        if !same {
            bail!(
                "{} and {} hold the same run (variant '{variant}', the same config and seed {}) with different results (final return {} and {}): remove the one that is wrong, or report them apart",
                first.display(),
                dir.display(),
                summary.seed,
                before.final_eval_return,
                summary.final_eval_return
            );
        }
        Ok(false)
    }
}

/// Every finished run below `roots` (several roots merge shards, or result files
/// copied from many machines): its `result.json`, else (runs from before result files)
/// its `summary.json`. The variant is the one the result names, else the name of the
/// directory above `seed-<k>`. A run whose results are unreadable is named in
/// `missing` instead, and so is every planned run that none of `roots` holds. A run
/// found twice counts once (see [`Seen`]).
pub fn load_runs(roots: &[PathBuf], thresholds: &BTreeMap<String, f64>) -> Result<Loaded> {
    let mut loaded = Loaded::default();
    let mut found = BTreeSet::new();
    let mut seen = Seen::default();
    for root in roots {
        let mut stack: Vec<PathBuf> = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            stack.extend(subdirectories(&dir)?);
            match finished_run(&dir) {
                Ok(Some((summary, variant, config))) => {
                    found.insert(dir.strip_prefix(root).unwrap_or(&dir).to_path_buf());
                    if seen.admit(&dir, &summary, &variant, config.as_deref())? {
                        loaded
                            .runs
                            .push(record(summary, variant, config, thresholds));
                    } else {
                        loaded.duplicates += 1;
                    }
                }
                Ok(None) => {}
                Err(e) => loaded.missing.push(format!("{}: {e:#}", dir.display())),
            }
        }
    }
    for root in roots {
        for planned in planned_runs(root)? {
            if found.insert(planned.dir.clone()) {
                let dir = root.join(&planned.dir);
                if dir.join(RESULT_FILE).exists() || dir.join(SUMMARY_FILE).exists() {
                    continue; // named above as unreadable
                }
                loaded
                    .missing
                    .push(format!("{}: not finished", dir.display()));
            }
        }
    }
    loaded.missing.sort();
    loaded
        .runs
        .sort_by(|a, b| (&a.env, &a.variant, a.seed).cmp(&(&b.env, &b.variant, b.seed)));
    Ok(loaded)
}

/// The runs a comparison's `plan.json` in `root` lists, if it has one. (Only their
/// directories are read here: `study/` writes the plan, and it builds on `report/`.)
fn planned_runs(root: &Path) -> Result<Vec<PlannedRun>> {
    #[derive(serde::Deserialize)]
    struct PlanFile {
        runs: Vec<PlannedRun>,
    }
    let plan = read_json::<PlanFile>(&root.join("plan.json"), "a comparison plan")?;
    Ok(plan.map(|p| p.runs).unwrap_or_default())
}

#[derive(serde::Deserialize)]
struct PlannedRun {
    dir: PathBuf,
}

/// The directories below `dir` that may hold runs: not a run's checkpoints, a report,
/// Slurm's logs, or a run moved aside for its damaged results.
fn subdirectories(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let skipped = ["checkpoints", "report", "slurm"];
    Ok(entries
        .flatten()
        .map(|e| e.path())
        .filter(|path| {
            path.is_dir()
                && !is_moved_aside(path)
                && path
                    .file_name()
                    .is_some_and(|n| !skipped.iter().any(|s| n == *s))
        })
        .collect())
}

/// The summary, variant and (where it wrote one) config of the run in `dir`, if it
/// finished.
fn finished_run(dir: &Path) -> Result<Option<(RunSummary, String, Option<String>)>> {
    let from_path = || {
        dir.parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
    };
    // A damaged result with a readable summary still counts (`compare` rewrites it).
    let result = read_json::<RunResult>(&dir.join(RESULT_FILE), "a run result");
    let summary = || crate::run::train::finished_summary(dir);
    let result = match result {
        Err(damage) => match summary() {
            Ok(Some(_)) => None,
            _ => return Err(damage),
        },
        Ok(r) => r,
    };
    if let Some(r) = result {
        let variant = r
            .variant
            .or_else(from_path)
            .unwrap_or_else(|| r.summary.norm.clone());
        return Ok(Some((r.summary, variant, Some(r.config))));
    }
    let Some(s) = summary()? else {
        return Ok(None);
    };
    let variant = from_path().unwrap_or_else(|| s.norm.clone());
    Ok(Some((s, variant, None)))
}

fn record(
    s: RunSummary,
    variant: String,
    config: Option<String>,
    thresholds: &BTreeMap<String, f64>,
) -> RunRecord {
    let threshold = thresholds.get(&s.env).copied();
    let steps_to_threshold = threshold.and_then(|t| {
        s.eval_curve
            .iter()
            .find(|(_, r)| *r >= t)
            .map(|(step, _)| *step)
    });
    let returns: Vec<f64> = s.eval_curve.iter().map(|(_, r)| *r).collect();
    RunRecord {
        env: s.env.clone(),
        axes: RunAxes::of(&variant, config.as_deref(), &s.norm),
        variant,
        seed: s.seed,
        final_return: s.final_eval_return,
        auc: mean(&returns),
        steps_to_threshold,
        wall_seconds: s.wall_seconds,
        steps_per_second: s.steps_per_second,
        diverged: s.diverged.is_some(),
        eval_curve: s.eval_curve,
        train_curve: s.train_curve,
        diagnostics: s.diagnostics,
    }
}

pub(crate) fn group(runs: &[RunRecord]) -> BTreeMap<(&str, &str), Vec<&RunRecord>> {
    let mut g: BTreeMap<(&str, &str), Vec<&RunRecord>> = BTreeMap::new();
    for r in runs {
        g.entry((r.env.as_str(), r.variant.as_str()))
            .or_default()
            .push(r);
    }
    g
}

/// The salt of a cell's final-return interval: the per-environment table's and the
/// headline's per-environment points', one interval for one number.
pub(crate) const FINAL_SALT: u64 = 1;

/// The IQM's 95% interval of one cell's `values` (its runs on one environment).
pub(crate) fn iqm_ci(values: &[f64], salt: u64) -> (f64, f64) {
    let tasks = [values.to_vec()];
    stratified_bootstrap_ci(&tasks, aggregate_iqm, BOOTSTRAP_REPS, 0.95, salt)
}

/// One variant's runs on one environment: IQMs with bootstrap intervals, steps to the
/// threshold, speed.
pub(crate) fn variant_stats(env: &str, variant: &str, all: &[&RunRecord]) -> VariantStats {
    let rs: Vec<&RunRecord> = all.iter().copied().filter(|r| !r.diverged).collect();
    let finals: Vec<f64> = rs.iter().map(|r| r.final_return).collect();
    let aucs: Vec<f64> = rs.iter().map(|r| r.auc).collect();
    let mut solved: Vec<u64> = rs.iter().filter_map(|r| r.steps_to_threshold).collect();
    solved.sort_unstable();
    VariantStats {
        env: env.to_string(),
        variant: variant.to_string(),
        runs: rs.len(),
        diverged_runs: all.len() - rs.len(),
        final_iqm: iqm(&finals),
        final_ci: iqm_ci(&finals, FINAL_SALT),
        final_mean: mean(&finals),
        auc_iqm: iqm(&aucs),
        auc_ci: iqm_ci(&aucs, 2),
        // The median over all runs, counting unsolved ones as never: shown only when
        // at least half the runs got there.
        median_steps_to_threshold: (!solved.is_empty() && solved.len() * 2 >= rs.len())
            .then(|| solved[(rs.len() - 1) / 2]),
        solved_runs: solved.len(),
        mean_wall_seconds: mean(&rs.iter().map(|r| r.wall_seconds).collect::<Vec<_>>()),
        mean_steps_per_second: mean(&rs.iter().map(|r| r.steps_per_second).collect::<Vec<_>>()),
    }
}
