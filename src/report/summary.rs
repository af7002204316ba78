//! A report's numbers, built from its records: per environment and variant, across
//! environments on normalized scores (`aggregate.rs`), and the score ranges that
//! normalize them.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::Serialize;

use super::aggregate::{self, AggregateStats, BatchChange, BatchPoint, Scores};
use super::leave_out::LeftOut;
use super::records::{group, variant_stats, Loaded, RunRecord, VariantStats};
use super::samplers::{sampler_changes, SamplerChange};
use crate::report::settings::{ReportConfig, ScoreRange};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub baseline: Option<String>,
    pub score_ranges: BTreeMap<String, ScoreRange>,
    pub per_env: Vec<VariantStats>,
    pub aggregate: Vec<AggregateStats>,
    pub performance_profile_taus: Vec<f64>,
    /// The headline figure's points: IQM against batch size.
    pub by_batch_size: Vec<BatchPoint>,
    /// Each method's change from its largest batch to its smallest.
    pub batch_changes: Vec<BatchChange>,
    /// Each method's change from the uniform sampler to a correlated one, per batch
    /// size; empty unless the grid has both.
    pub sampler_changes: Vec<SamplerChange>,
    pub runs: Vec<RunRecord>,
    /// Runs left out, each with why (see [`Loaded::missing`]).
    pub missing: Vec<String>,
    /// Runs found more than once and counted once.
    pub duplicates: usize,
    /// Methods left out on request (`normrl report --leave-out`), set by the caller.
    pub left_out: LeftOut,
}

pub fn build(loaded: Loaded, config: &ReportConfig) -> Result<Report> {
    let Loaded {
        runs,
        missing,
        duplicates,
    } = loaded;
    if runs.is_empty() {
        bail!("no finished runs (summary.json) found");
    }
    let groups = group(&runs);
    let envs = env_ids(&runs);
    let variants: Vec<String> = {
        let mut v: Vec<String> = runs.iter().map(|r| r.variant.clone()).collect();
        v.sort();
        v.dedup();
        v
    };
    let mut baseline = config.baseline.clone();
    if let Some(b) = &config.baseline {
        // A study still running may not have finished its baseline (a planned run of
        // it is missing): its report is drawn without the comparisons to it, and says
        // so. A name no run has is a mistake.
        let planned = missing.iter().any(|m| {
            let dir = m.split(": ").next().unwrap_or_default();
            std::path::Path::new(dir)
                .components()
                .any(|c| c.as_os_str() == b.as_str())
        });
        if !variants.contains(b) && planned {
            eprintln!("the baseline '{b}' has no finished run yet: the report leaves out the comparisons with it");
            baseline = None;
        } else if !variants.contains(b) {
            bail!(
                "baseline '{b}' is not among the variants: {}",
                variants.join(", ")
            );
        }
    }
    let config = &ReportConfig {
        baseline,
        ..config.clone()
    };
    let per_env = per_variant(&groups);
    let ranges = score_ranges(&envs, &per_env, config);
    let scores = Scores {
        envs: &envs,
        groups: &groups,
        ranges: &ranges,
    };
    let aggregate = aggregate::aggregates(&scores, &variants, config.baseline.as_deref());
    let by_batch_size = aggregate::by_batch_size(&scores, &aggregate);
    let batch_changes = aggregate::batch_changes(&scores, &variants);
    let sampler_changes = sampler_changes(&scores, &variants);
    Ok(Report {
        baseline: config.baseline.clone(),
        aggregate,
        performance_profile_taus: aggregate::taus(),
        by_batch_size,
        batch_changes,
        sampler_changes,
        score_ranges: ranges,
        per_env,
        runs,
        missing,
        duplicates,
        left_out: LeftOut::default(),
    })
}

impl Report {
    /// The baseline variant's method, if the report has a baseline.
    pub fn base_method(&self) -> Option<&str> {
        let base = self.baseline.as_ref()?;
        let run = self.runs.iter().find(|r| &r.variant == base);
        Some(run.map_or(base.as_str(), |r| r.axes.method.as_str()))
    }

    /// The environments of the report's runs, each once, by name.
    pub fn envs(&self) -> Vec<&str> {
        env_ids(&self.runs)
    }

    /// The methods in the order every figure and table lists them: the baseline's
    /// first, the others by name.
    pub fn methods(&self) -> Vec<String> {
        let base = self.base_method();
        let mut names: Vec<String> = self.runs.iter().map(|r| r.axes.method.clone()).collect();
        names.sort_by_key(|m| (Some(m.as_str()) != base, m.clone()));
        names.dedup();
        names
    }
}

/// Each environment's and variant's statistics, from its runs.
fn per_variant(groups: &BTreeMap<(&str, &str), Vec<&RunRecord>>) -> Vec<VariantStats> {
    groups
        .iter()
        .map(|((env, variant), rs)| variant_stats(env, variant, rs))
        .collect()
}

/// [`score_ranges`] of every run `loaded` holds: a report that leaves methods out
/// (`--leave-out`) normalizes by these, so that leaving a method out does not move the
/// others' normalized scores (the best variant may be one left out).
pub fn all_score_ranges(loaded: &Loaded, config: &ReportConfig) -> BTreeMap<String, ScoreRange> {
    let groups = group(&loaded.runs);
    let envs = env_ids(&loaded.runs);
    let per_env = per_variant(&groups);
    score_ranges(&envs, &per_env, config)
}

/// The environments `runs` ran on, each once, by name. Sorted before the dedup: runs
/// come sorted from disk, but not from every caller, and an environment listed twice
/// would be two strata of the bootstrap (intervals too narrow by the count's root).
fn env_ids(runs: &[RunRecord]) -> Vec<&str> {
    let mut envs: Vec<&str> = runs.iter().map(|r| r.env.as_str()).collect();
    envs.sort_unstable();
    envs.dedup();
    envs
}

/// Score ranges: configured, else the random-policy score (from the environment
/// registry) and the best variant's mean final return in this comparison.
fn score_ranges(
    envs: &[&str],
    per_env: &[VariantStats],
    config: &ReportConfig,
) -> BTreeMap<String, ScoreRange> {
    let mut ranges = BTreeMap::new();
    for env in envs {
        let range = match config.scores.get(*env) {
            Some(r) => *r,
            None => {
                let best = per_env
                    .iter()
                    // A cell whose runs all diverged has no mean (its 0.0 is a
                    // placeholder), and on a game of negative returns it would be
                    // the best.
                    .filter(|s| s.env == *env && s.runs > 0)
                    .map(|s| s.final_mean)
                    .fold(f64::MIN, f64::max);
                let random = normrl_envs::registry::random_score(env).unwrap_or(0.0);
                ScoreRange {
                    random,
                    reference: if best > random { best } else { random + 1.0 },
                }
            }
        };
        ranges.insert(env.to_string(), range);
    }
    ranges
}
