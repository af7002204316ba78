//! The report's charts: per environment the evaluation curves, the smoothed training
//! returns and one chart per diagnostic (variants overlaid, mean over seeds with a 95%
//! bootstrap band over seeds); across environments the aggregate bars and the
//! performance profile.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;

use super::records::{group, Report, RunRecord};
use crate::report::plots::{bar_chart, line_chart, Axes, Bar, Series};
use crate::report::stats::{mean, stratified_bootstrap_ci};
use crate::run::diagnostics::REPORTED;
use crate::study::compare::sanitize;

/// Bootstrap resamples of each band point (a band of a few seeds needs few).
const BAND_REPS: usize = 500;
/// Points of a smoothed training curve.
const TRAIN_POINTS: u64 = 50;

/// Mean over runs of values that share a step, with a band over the runs.
fn band(by_step: BTreeMap<u64, Vec<f64>>, name: &str) -> Series {
    let points = by_step
        .iter()
        .map(|(&s, vals)| {
            let one = std::slice::from_ref(vals);
            let (lo, hi) = stratified_bootstrap_ci(one, |t| mean(&t[0]), BAND_REPS, 0.95, s);
            (s as f64, mean(vals), lo, hi)
        })
        .collect();
    Series {
        name: name.to_string(),
        points,
    }
}

/// A curve the runs sample at the same steps (evaluations, diagnostics).
fn curve_series<'a>(
    runs: &[&'a RunRecord],
    name: &str,
    curve: impl Fn(&'a RunRecord) -> Option<&'a [(u64, f64)]>,
) -> Series {
    let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for r in runs {
        for &(s, v) in curve(r).unwrap_or_default() {
            if v.is_finite() {
                by_step.entry(s).or_default().push(v);
            }
        }
    }
    band(by_step, name)
}

/// Training returns, which each run has at its own steps (episode ends): per run, the
/// mean return of the episodes ending in the last `window` steps before each of
/// [`TRAIN_POINTS`] evenly spaced steps (none there: no point); then across runs.
fn training_series(runs: &[&RunRecord], name: &str) -> Series {
    let last = runs
        .iter()
        .filter_map(|r| r.train_curve.last().map(|p| p.0))
        .max()
        .unwrap_or(0);
    let spacing = (last / TRAIN_POINTS).max(1);
    let window = spacing.max(last / 20);
    let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for r in runs {
        for k in 1..=TRAIN_POINTS {
            let at = k * spacing;
            let recent: Vec<f64> = r
                .train_curve
                .iter()
                .filter(|(s, _)| *s <= at && *s + window > at)
                .map(|p| p.1)
                .collect();
            if !recent.is_empty() {
                by_step.entry(at).or_default().push(mean(&recent));
            }
        }
    }
    band(by_step, name)
}

/// Every chart of the report into `out`.
pub fn write(report: &Report, out: &Path) -> Result<()> {
    let groups = group(&report.runs);
    let mut envs: Vec<&str> = report.runs.iter().map(|r| r.env.as_str()).collect();
    envs.dedup();
    for env in envs {
        let runs: Vec<(&str, &Vec<&RunRecord>)> = groups
            .iter()
            .filter(|((e, _), _)| *e == env)
            .map(|((_, v), rs)| (*v, rs))
            .collect();
        environment_charts(env, &runs, out)?;
    }
    aggregate_charts(report, out)
}

/// One environment's curves, training returns and diagnostics.
fn environment_charts(env: &str, runs: &[(&str, &Vec<&RunRecord>)], out: &Path) -> Result<()> {
    let stem = |what: &str| out.join(format!("{what}-{}", sanitize(env)));
    let eval: Vec<Series> = runs
        .iter()
        .map(|(v, rs)| curve_series(rs, v, |r| Some(&r.eval_curve)))
        .collect();
    let steps = |y_label| Axes::over_steps(env, y_label);
    line_chart(&stem("curves"), &steps("evaluation return"), &eval)?;
    let train: Vec<Series> = runs.iter().map(|(v, rs)| training_series(rs, v)).collect();
    let title = format!("{env}: training episodes (smoothed)");
    line_chart(
        &stem("train-curves"),
        &Axes::over_steps(&title, "training return"),
        &train,
    )?;
    for (name, label) in REPORTED {
        let series: Vec<Series> = runs
            .iter()
            .map(|(v, rs)| curve_series(rs, v, |r| r.diagnostics.get(name).map(Vec::as_slice)))
            .filter(|s| !s.points.is_empty())
            .collect();
        if !series.is_empty() {
            let file = format!("diagnostics-{}", name.replace('/', "-").replace('.', "_"));
            line_chart(&stem(&file), &steps(label), &series)?;
        }
    }
    Ok(())
}

/// The aggregate bars and the performance profile.
fn aggregate_charts(report: &Report, out: &Path) -> Result<()> {
    let bars: Vec<Bar> = report
        .aggregate
        .iter()
        .map(|a| Bar {
            name: a.variant.clone(),
            value: a.normalized_iqm,
            low: a.normalized_ci.0,
            high: a.normalized_ci.1,
        })
        .collect();
    bar_chart(
        &out.join("aggregate_iqm"),
        "normalized score IQM (95% CI)",
        "normalized IQM",
        &bars,
    )?;
    let profiles: Vec<Series> = report
        .performance_profiles
        .iter()
        .map(|(v, fr)| Series {
            name: v.clone(),
            points: report
                .performance_profile_taus
                .iter()
                .zip(fr)
                .map(|(&t, &f)| (t, f, f, f))
                .collect(),
        })
        .collect();
    let axes = Axes {
        title: "performance profile".into(),
        x_label: "normalized score tau".into(),
        y_label: "fraction of runs > tau".into(),
        x_steps: false,
    };
    line_chart(&out.join("performance_profile"), &axes, &profiles)
}
