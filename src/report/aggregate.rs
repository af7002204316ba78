//! The numbers behind the report's figures, as rliable computes them: per variant the
//! four aggregate metrics of normalized final scores with stratified-bootstrap
//! intervals, its probability of improving on the baseline method in the same setting,
//! its performance profile with bands; and the headline's IQM against batch size, per
//! environment and over all of them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::grid::{RunAxes, Setting};
use super::records::{iqm_ci, RunRecord, FINAL_SALT};
use super::stats::{
    aggregate_iqm, aggregate_mean, aggregate_median, iqm, normalize, optimality_gap, paired_ci,
    performance_profile, probability_of_improvement, stratified_bootstrap_ci,
};
use crate::report::settings::ScoreRange;

/// Resamples behind every interval here.
pub const REPS: usize = 2_000;
/// Resamples behind each point of a performance profile's band (31 points).
const PROFILE_REPS: usize = 500;

/// A statistic and its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

impl Estimate {
    /// `salt` tells the statistics apart; the data seeds the rest (the same runs, the
    /// same interval, wherever they sit in a report).
    fn of(tasks: &[Vec<f64>], stat: fn(&[Vec<f64>]) -> f64, salt: u64) -> Self {
        let (low, high) = stratified_bootstrap_ci(tasks, stat, REPS, 0.95, salt);
        Self {
            value: stat(tasks),
            low,
            high,
        }
    }
}

/// One variant's aggregate over environments (normalized final scores).
#[derive(Debug, Clone, Serialize)]
pub struct AggregateStats {
    pub variant: String,
    pub method: String,
    pub setting: Setting,
    /// Runs counted, over every environment (n of the intervals).
    pub runs: usize,
    /// Environments with a run counted: fewer than the report's where a grid is not
    /// done, and then the cell is not comparable with one over all of them.
    pub envs: usize,
    pub median: Estimate,
    pub iqm: Estimate,
    pub mean: Estimate,
    pub optimality_gap: Estimate,
    /// P(a run of this variant scores above a run of the baseline method in the same
    /// setting), averaged over environments; none for the baseline itself.
    pub improvement: Option<Estimate>,
    /// Fraction of runs above each of [`TAUS`], with bands.
    pub profile: Vec<Estimate>,
}

/// A method's IQM at one batch size and sampler: one point of the headline figure.
#[derive(Debug, Clone, Serialize)]
pub struct BatchPoint {
    /// The environment, or none for the aggregate over environments (normalized).
    pub env: Option<String>,
    pub method: String,
    pub sampler: Option<String>,
    pub batch_size: usize,
    pub iqm: Estimate,
}

/// The performance profile's thresholds: normalized scores 0 to 1.5.
pub fn taus() -> Vec<f64> {
    (0..=30).map(|i| f64::from(i) * 0.05).collect()
}

/// Final returns by environment (tasks) and variant.
pub struct Scores<'a> {
    pub envs: &'a [&'a str],
    pub groups: &'a BTreeMap<(&'a str, &'a str), Vec<&'a RunRecord>>,
    pub ranges: &'a BTreeMap<String, ScoreRange>,
}

impl Scores<'_> {
    /// One list per environment of `variant`'s final returns (finished runs, not
    /// diverged ones), normalized to the environment's score range if asked.
    pub fn of(&self, variant: &str, normalized: bool) -> Vec<Vec<f64>> {
        let one = |env: &str| -> Vec<f64> {
            let r = self.ranges[env];
            let Some(rs) = self.groups.get(&(env, variant)) else {
                return vec![];
            };
            rs.iter()
                .filter(|x| !x.diverged)
                .map(|x| match normalized {
                    true => normalize(x.final_return, r.random, r.reference),
                    false => x.final_return,
                })
                .collect()
        };
        self.envs.iter().map(|env| one(env)).collect()
    }

    /// A variant's method and setting (its runs all share them).
    pub fn axes(&self, variant: &str) -> Option<&RunAxes> {
        self.groups
            .iter()
            .find(|((_, v), _)| *v == variant)
            .map(|(_, rs)| &rs[0].axes)
    }

    /// The variant of `method` in `setting`, if the grid has one.
    fn variant_of(&self, method: &str, setting: &Setting) -> Option<&str> {
        self.groups.iter().find_map(|((_, v), rs)| {
            let axes = &rs.first()?.axes;
            (axes.method == method && axes.setting == *setting).then_some(*v)
        })
    }
}

/// Every variant's aggregate; `baseline` names a variant whose method is the baseline.
pub fn aggregates(
    scores: &Scores,
    variants: &[String],
    baseline: Option<&str>,
) -> Vec<AggregateStats> {
    let base_method = baseline
        .and_then(|b| scores.axes(b))
        .map(|a| a.method.clone());
    let taus = taus();
    let mut out = vec![];
    for v in variants {
        let Some(axes) = scores.axes(v).cloned() else {
            continue;
        };
        let tasks: Vec<Vec<f64>> = non_empty(scores.of(v, true));
        let improvement = base_method
            .as_deref()
            .and_then(|m| scores.variant_of(m, &axes.setting))
            .filter(|b| b != v)
            .map(|b| improvement(scores, v, b, 5));
        let profile = taus
            .iter()
            .enumerate()
            .map(|(i, &tau)| {
                let above = |t: &[Vec<f64>]| performance_profile(t, &[tau])[0];
                let (low, high) =
                    stratified_bootstrap_ci(&tasks, above, PROFILE_REPS, 0.95, 10 + i as u64);
                Estimate {
                    value: above(&tasks),
                    low,
                    high,
                }
            })
            .collect();
        out.push(AggregateStats {
            variant: v.clone(),
            method: axes.method,
            setting: axes.setting,
            runs: tasks.iter().map(Vec::len).sum(),
            envs: tasks.len(),
            median: Estimate::of(&tasks, aggregate_median, 1),
            iqm: Estimate::of(&tasks, aggregate_iqm, 2),
            mean: Estimate::of(&tasks, aggregate_mean, 3),
            optimality_gap: Estimate::of(&tasks, optimality_gap, 4),
            improvement,
            profile,
        });
    }
    out
}

/// P(`v` > `baseline`) over the environments both have runs on, with its interval.
fn improvement(scores: &Scores, v: &str, baseline: &str, salt: u64) -> Estimate {
    let (mut x, mut y) = (vec![], vec![]);
    for (a, b) in scores
        .of(v, false)
        .into_iter()
        .zip(scores.of(baseline, false))
    {
        if !a.is_empty() && !b.is_empty() {
            x.push(a);
            y.push(b);
        }
    }
    let (value, (low, high)) = paired_ci(&x, &y, probability_of_improvement, REPS, salt);
    Estimate { value, low, high }
}

fn non_empty(tasks: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
    tasks.into_iter().filter(|t| !t.is_empty()).collect()
}

/// The headline's points: each method's IQM of final returns at each batch size and
/// sampler, per environment (raw returns) and over environments (normalized: the
/// aggregates' IQM, so that the figure, its table and the aggregate table print one
/// interval for one number).
pub fn by_batch_size(scores: &Scores, aggregates: &[AggregateStats]) -> Vec<BatchPoint> {
    let mut points = vec![];
    for ((env, _), rs) in scores.groups {
        let axes = &rs[0].axes;
        let Some(batch_size) = axes.setting.batch_size else {
            continue;
        };
        let finals: Vec<f64> = rs
            .iter()
            .filter(|r| !r.diverged)
            .map(|r| r.final_return)
            .collect();
        if finals.is_empty() {
            continue;
        }
        let (low, high) = iqm_ci(&finals, FINAL_SALT);
        points.push(BatchPoint {
            env: Some(env.to_string()),
            method: axes.method.clone(),
            sampler: axes.setting.sampler.clone(),
            batch_size,
            iqm: Estimate {
                value: iqm(&finals),
                low,
                high,
            },
        });
    }
    for a in aggregates.iter().filter(|a| a.runs > 0) {
        let Some(batch_size) = a.setting.batch_size else {
            continue;
        };
        points.push(BatchPoint {
            env: None,
            method: a.method.clone(),
            sampler: a.setting.sampler.clone(),
            batch_size,
            iqm: a.iqm,
        });
    }
    points
}

/// IQM of `to`'s normalized final scores less IQM of `from`'s, with its 95% interval;
/// none when they share no environment. Only environments both variants have runs on
/// count, so that the difference compares the same games. Each environment of each
/// variant is a stratum: seeds are resampled within it, for both variants apart (their
/// runs are independent, not paired by seed). Used for the change between two
/// samplers (`samplers.rs`) and between two batch sizes (the headline's caption).
pub fn iqm_change(scores: &Scores, from: &str, to: &str, salt: u64) -> Option<Estimate> {
    let (mut x, mut y) = (vec![], vec![]);
    for (a, b) in scores.of(to, true).into_iter().zip(scores.of(from, true)) {
        if !a.is_empty() && !b.is_empty() {
            x.push(a);
            y.push(b);
        }
    }
    if x.is_empty() {
        return None;
    }
    let diff = |a: &[Vec<f64>], b: &[Vec<f64>]| aggregate_iqm(a) - aggregate_iqm(b);
    let (value, (low, high)) = paired_ci(&x, &y, diff, REPS, salt);
    Some(Estimate { value, low, high })
}

/// How much a method's IQM changes from its largest batch size to its smallest, over
/// environments (normalized): what the headline's caption reports.
#[derive(Debug, Clone, Serialize)]
pub struct BatchChange {
    pub method: String,
    pub sampler: Option<String>,
    pub from: usize,
    pub to: usize,
    /// IQM at `to` less IQM at `from`.
    pub change: Estimate,
}

/// Every method's [`BatchChange`] in each sampler where it ran two batch sizes or more.
pub fn batch_changes(scores: &Scores, variants: &[String]) -> Vec<BatchChange> {
    // (method, sampler) -> its (batch size, variant)s.
    type Sizes<'a> = Vec<(usize, &'a str)>;
    let mut by_method: BTreeMap<(String, Option<String>), Sizes> = BTreeMap::new();
    for v in variants {
        if let Some(axes) = scores.axes(v) {
            if let Some(b) = axes.setting.batch_size {
                let key = (axes.method.clone(), axes.setting.sampler.clone());
                by_method.entry(key).or_default().push((b, v));
            }
        }
    }
    let mut out = vec![];
    for ((method, sampler), mut sizes) in by_method {
        sizes.sort_unstable();
        let (Some(&(to, small)), Some(&(from, large))) = (sizes.first(), sizes.last()) else {
            continue;
        };
        if from == to {
            continue;
        }
        // Over the games both batch sizes have runs on: a study part-way through had
        // compared the large batch's IQM over four games with the small one's over two.
        let Some(change) = iqm_change(scores, large, small, 9_000) else {
            continue;
        };
        out.push(BatchChange {
            method,
            sampler,
            from,
            to,
            change,
        });
    }
    out
}
