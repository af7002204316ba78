//! A report's records: finished runs read back, each with where it sits in the grid,
//! and each environment and variant's statistics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::report::grid::RunAxes;
use crate::report::stats::{aggregate_iqm, iqm, mean, stratified_bootstrap_ci};
use crate::run::files::{RunResult, RESULT_FILE};
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

/// Every finished run below `roots` (several roots merge shards, or result files
/// copied from many machines): its `result.json`, else (runs from before result files)
/// its `summary.json`. The variant is the one the result names, else the name of the
/// directory above `seed-<k>`.
pub fn load_runs(roots: &[PathBuf], thresholds: &BTreeMap<String, f64>) -> Result<Vec<RunRecord>> {
    let mut runs = vec![];
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let skipped = ["checkpoints", "report", "slurm"];
            if path.is_dir()
                && path
                    .file_name()
                    .is_some_and(|n| !skipped.iter().any(|s| n == *s))
            {
                stack.push(path);
            }
        }
        if let Some((summary, variant, config)) = finished_run(&dir)? {
            runs.push(record(summary, variant, config, thresholds));
        }
    }
    runs.sort_by(|a, b| (&a.env, &a.variant, a.seed).cmp(&(&b.env, &b.variant, b.seed)));
    Ok(runs)
}

/// The summary, variant and (where it wrote one) config of the run in `dir`, if it
/// finished.
fn finished_run(dir: &Path) -> Result<Option<(RunSummary, String, Option<String>)>> {
    let from_path = || {
        dir.parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
    };
    if let Some(r) = read_json::<RunResult>(&dir.join(RESULT_FILE), "a run result")? {
        let variant = r
            .variant
            .or_else(from_path)
            .unwrap_or_else(|| r.summary.norm.clone());
        return Ok(Some((r.summary, variant, Some(r.config))));
    }
    let Some(s) = crate::run::train::finished_summary(dir)? else {
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

/// One variant's runs on one environment: IQMs with bootstrap intervals, steps to the
/// threshold, speed.
pub(crate) fn variant_stats(env: &str, variant: &str, all: &[&RunRecord]) -> VariantStats {
    let rs: Vec<&RunRecord> = all.iter().copied().filter(|r| !r.diverged).collect();
    let finals: Vec<f64> = rs.iter().map(|r| r.final_return).collect();
    let aucs: Vec<f64> = rs.iter().map(|r| r.auc).collect();
    let mut solved: Vec<u64> = rs.iter().filter_map(|r| r.steps_to_threshold).collect();
    solved.sort_unstable();
    let ci = |values: &Vec<f64>, seed| {
        let tasks = std::slice::from_ref(values);
        stratified_bootstrap_ci(tasks, aggregate_iqm, BOOTSTRAP_REPS, 0.95, seed)
    };
    VariantStats {
        env: env.to_string(),
        variant: variant.to_string(),
        runs: rs.len(),
        diverged_runs: all.len() - rs.len(),
        final_iqm: iqm(&finals),
        final_ci: ci(&finals, 1),
        final_mean: mean(&finals),
        auc_iqm: iqm(&aucs),
        auc_ci: ci(&aucs, 2),
        // The median over all runs, counting unsolved ones as never: shown only when
        // at least half the runs got there.
        median_steps_to_threshold: (!solved.is_empty() && solved.len() * 2 >= rs.len())
            .then(|| solved[(rs.len() - 1) / 2]),
        solved_runs: solved.len(),
        mean_wall_seconds: mean(&rs.iter().map(|r| r.wall_seconds).collect::<Vec<_>>()),
        mean_steps_per_second: mean(&rs.iter().map(|r| r.steps_per_second).collect::<Vec<_>>()),
    }
}
