//! Which figures a report draws, from its numbers. One color per method in all of
//! them (`grid::color_of`); a grid's other axes (batch size, sampler) are panels and
//! environments are files, never colors:
//! - `batch_size[-<env>]`: the headline, IQM against batch size as small multiples, a
//!   panel per method in its color on one shared y axis, a line per sampler (when the
//!   grid has two batch sizes or more);
//! - `sampler_change`: each method's change in IQM from uniform to correlated batches,
//!   a panel per batch size and correlated sampler (when the grid has both kinds);
//! - `aggregate`: median, IQM, mean and optimality gap as interval plots, a row of
//!   panels per setting;
//! - `improvement`: each method's probability of improving on the baseline method in
//!   the same setting;
//! - `performance_profile`: a panel per setting, bands from the bootstrap;
//! - per environment `curves`, `train-curves` and `diagnostics-*`: a panel per setting.
//!
//! Where the settings vary in batch size and sampler both, the figures of a panel per
//! setting are a grid of them (`Methods::grid`): rows by batch size, columns by sampler.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Result;

use super::aggregate::{AggregateStats, BatchPoint, Estimate};
use super::grid::{color_of, sampler_rank, Setting};
use super::plots::{self, lighter, Content, Figure, Key, Line, Panel, Point, Row, Stroke};
use super::records::RunRecord;
use super::samplers::SamplerChange;
use super::stats::{mean, stratified_bootstrap_ci};
use super::summary::Report;
use crate::run::diagnostics::REPORTED;
use crate::storage::sanitize;

/// Points `(x, y, low, high)` of a curve with its band, from some runs.
type Series<'a> = dyn Fn(&[&RunRecord]) -> Vec<Point> + 'a;

/// Bootstrap resamples of each band point (a band of a few seeds needs few).
const BAND_REPS: usize = 500;
/// Points of a smoothed training curve.
const TRAIN_POINTS: u64 = 50;

/// Every figure of the report into `out`.
pub fn write(report: &Report, out: &Path) -> Result<()> {
    let methods = Methods::of(report);
    headline(report, &methods, out)?;
    sampler_change(report, &methods, out)?;
    aggregate(report, &methods, out)?;
    improvement(report, &methods, out)?;
    profiles(report, &methods, out)?;
    for env in report.envs() {
        environment(report, env, &methods, out)?;
    }
    Ok(())
}

/// The report's methods in a fixed order (the baseline's first), and its settings.
struct Methods {
    names: Vec<String>,
    settings: Vec<Setting>,
}

impl Methods {
    fn of(report: &Report) -> Self {
        let names = report.methods();
        let set: BTreeSet<Setting> = report.runs.iter().map(|r| r.axes.setting.clone()).collect();
        let mut settings: Vec<Setting> = set.into_iter().collect();
        // Samplers from the least correlated to the most (as the grids' columns), and
        // within one, larger batches first: the small-batch end of a row is on the right.
        settings.sort_by_key(|s| {
            let rank = sampler_rank(s.sampler.as_deref()).0;
            (rank, std::cmp::Reverse(s.batch_size), s.sampler.clone())
        });
        Self { names, settings }
    }

    fn legend(&self) -> Vec<Key> {
        let key = |m: &String| Key {
            label: m.clone(),
            color: color_of(m),
            stroke: Stroke::Solid,
        };
        self.names.iter().map(key).collect()
    }

    /// A line per method, in the methods' order and colors, of the methods `points`
    /// gives points for.
    fn lines(&self, points: impl Fn(&String) -> Option<Vec<Point>>) -> Vec<Line> {
        let line = |m: &String| {
            let color = color_of(m);
            points(m).map(|points| Line {
                color,
                stroke: Stroke::Solid,
                points,
            })
        };
        self.names.iter().filter_map(line).collect()
    }

    /// Two columns of setting panels at most beside each other, else one.
    fn columns(&self) -> usize {
        self.settings.len().clamp(1, 2)
    }

    /// A figure's columns and its panels' settings: where the settings vary in batch
    /// size and sampler both, a row per batch size (larger first) and a column per
    /// sampler (uniform first), with a gap where the grid did not run a pair (the
    /// study's `online` sampler at batch 1 only); else the settings in order.
    fn grid(&self) -> (usize, Vec<Option<&Setting>>) {
        let mut samplers: Vec<Option<&str>> =
            self.settings.iter().map(|s| s.sampler.as_deref()).collect();
        samplers.sort_by_key(|s| sampler_rank(*s));
        samplers.dedup();
        let mut batches: Vec<Option<usize>> = self.settings.iter().map(|s| s.batch_size).collect();
        batches.sort_by_key(|b| std::cmp::Reverse(*b));
        batches.dedup();
        if samplers.len() < 2 || batches.len() < 2 {
            return (self.columns(), self.settings.iter().map(Some).collect());
        }
        let cell = |b: Option<usize>, s: Option<&str>| {
            let at = |x: &&Setting| x.batch_size == b && x.sampler.as_deref() == s;
            self.settings.iter().find(at)
        };
        let cells = batches
            .iter()
            .flat_map(|&b| samplers.iter().map(move |&s| cell(b, s)))
            .collect();
        (samplers.len(), cells)
    }

    /// A panel per cell of [`Methods::grid`], blank in its gaps.
    fn figure(&self, title: String, panel: impl Fn(&Setting) -> Panel) -> Figure {
        let (columns, cells) = self.grid();
        let blank = || Panel {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            content: Content::Blank,
        };
        Figure {
            title,
            columns,
            panels: cells
                .into_iter()
                .map(|c| c.map_or_else(blank, &panel))
                .collect(),
            legend: self.legend(),
        }
    }
}

fn panel_title(what: &str, setting: &Setting) -> String {
    match setting.title() {
        t if t.is_empty() => what.to_string(),
        t => format!("{what}, {t}"),
    }
}

/// The headline's x axis: batch sizes, evenly on a log scale and shrinking from left
/// to right (the small-batch end of every figure is on the right).
struct BatchAxis {
    ticks: Vec<(f64, String)>,
}

impl BatchAxis {
    fn x(batch_size: usize) -> f64 {
        -(batch_size as f64).log2()
    }
}

/// How a sampler's line looks in every panel: the first sampler (uniform) solid in the
/// method's color, the next dashed and lighter, any further dotted and lighter still.
fn sampler_style(rank: usize) -> (Stroke, f64) {
    match rank {
        0 => (Stroke::Solid, 0.0),
        1 => (Stroke::Dashed, 0.4),
        _ => (Stroke::Dotted, 0.6),
    }
}

/// The headline: IQM against batch size, over environments and per environment, as
/// small multiples. Seven methods with bands in one panel hide each other; a panel per
/// method on one shared y axis compares them at a glance, and the samplers of a
/// method, a line each, sit together where their difference is the question.
fn headline(report: &Report, methods: &Methods, out: &Path) -> Result<()> {
    let sizes: BTreeSet<usize> = report.by_batch_size.iter().map(|p| p.batch_size).collect();
    if sizes.len() < 2 {
        return Ok(());
    }
    let axis = BatchAxis {
        ticks: sizes
            .iter()
            .map(|&b| (BatchAxis::x(b), b.to_string()))
            .collect(),
    };
    let mut samplers: Vec<Option<&str>> = report
        .by_batch_size
        .iter()
        .map(|p| p.sampler.as_deref())
        .collect();
    samplers.sort_by_key(|s| sampler_rank(*s));
    samplers.dedup();
    let named: BTreeSet<&str> = report
        .by_batch_size
        .iter()
        .filter_map(|p| p.env.as_deref())
        .collect();
    let envs = std::iter::once(None).chain(named.into_iter().map(Some));
    for env in envs {
        let points: Vec<&BatchPoint> = report
            .by_batch_size
            .iter()
            .filter(|p| p.env.as_deref() == env)
            .collect();
        let panels: Vec<Panel> = methods
            .names
            .iter()
            .filter_map(|m| method_panel(m, env.is_some(), &points, &samplers, &axis))
            .collect();
        let (title, stem) = match env {
            None => (
                "Return against batch size, all environments (IQM, 95% CI)".to_string(),
                "batch_size".to_string(),
            ),
            Some(e) => (
                format!("Return against batch size, {e} (IQM, 95% CI)"),
                format!("batch_size-{}", sanitize(e)),
            ),
        };
        let figure = Figure {
            title,
            columns: small_multiple_columns(panels.len()),
            panels,
            legend: sampler_legend(&samplers),
        };
        plots::write(&out.join(stem), &figure)?;
    }
    Ok(())
}

/// One method's panel of the headline: a line per sampler, in the method's color.
fn method_panel(
    method: &str,
    raw: bool,
    points: &[&BatchPoint],
    samplers: &[Option<&str>],
    axis: &BatchAxis,
) -> Option<Panel> {
    let color = color_of(method);
    let lines: Vec<Line> = samplers
        .iter()
        .enumerate()
        .filter_map(|(rank, sampler)| {
            let mut pts: Vec<Point> = points
                .iter()
                .filter(|p| p.method == method && p.sampler.as_deref() == *sampler)
                .map(|p| {
                    let x = BatchAxis::x(p.batch_size);
                    (x, p.iqm.value, p.iqm.low, p.iqm.high)
                })
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (stroke, light) = sampler_style(rank);
            (!pts.is_empty()).then(|| Line {
                color: lighter(color, light),
                stroke,
                points: pts,
            })
        })
        .collect();
    (!lines.is_empty()).then(|| Panel {
        title: method.to_string(),
        x_label: "batch size".into(),
        y_label: match raw {
            false => "IQM normalized final return".into(),
            true => "IQM final return".into(),
        },
        content: Content::Lines {
            lines,
            x_ticks: Some(axis.ticks.clone()),
        },
    })
}

/// The headline's legend: how each sampler's line looks (in gray, as every method's
/// color takes the same stroke and lightness); none for a grid without samplers.
fn sampler_legend(samplers: &[Option<&str>]) -> Vec<Key> {
    samplers
        .iter()
        .enumerate()
        .filter_map(|(rank, s)| {
            let (stroke, light) = sampler_style(rank);
            Some(Key {
                label: format!("{} sampler", (*s)?),
                color: lighter((0, 0, 0), light),
                stroke,
            })
        })
        .collect()
}

/// Columns of a grid of `n` small multiples: at most four, and rows as full as they
/// can be (six panels are two rows of three, seven two rows of four and three).
fn small_multiple_columns(n: usize) -> usize {
    let rows = n.div_ceil(4).max(1);
    n.div_ceil(rows).max(1)
}

/// The change of each method's IQM from uniform to correlated batches, a panel per
/// batch size (and per correlated sampler), all on one x axis with a line at zero.
fn sampler_change(report: &Report, methods: &Methods, out: &Path) -> Result<()> {
    let changes = &report.sampler_changes;
    if changes.is_empty() {
        return Ok(());
    }
    // Panels in the headline's order, larger batches first, each batch size's samplers
    // side by side. A panel whose every method trained the same runs under both
    // samplers (`sequential` at batch 1) is left out: its change is 0 by construction,
    // and report.md says so.
    let mut panels: Vec<(&str, Option<usize>)> = changes
        .iter()
        .filter(|c| !c.same_runs)
        .map(|c| (c.to.as_str(), c.batch_size))
        .collect();
    panels.sort_by_key(|&(to, b)| (std::cmp::Reverse(b), sampler_rank(Some(to))));
    panels.dedup();
    if panels.is_empty() {
        return Ok(());
    }
    // One range for every panel, so that the batch sizes compare too.
    let ends = changes.iter().flat_map(|c| [c.change.low, c.change.high]);
    let (low, high) = ends
        .filter(|v| v.is_finite())
        .fold((0.0_f64, 0.0_f64), |(a, b), v| (a.min(v), b.max(v)));
    let panel = |&(to, batch): &(&str, Option<usize>)| {
        let setting = Setting {
            sampler: None,
            batch_size: batch,
        };
        Panel {
            title: panel_title(&format!("{to} − uniform"), &setting),
            x_label: "change in normalized IQM".into(),
            y_label: String::new(),
            content: Content::Intervals {
                rows: change_rows(changes, methods, to, batch),
                mark: Some(0.0),
                range: Some((low, high)),
            },
        }
    };
    // Every row names its method, so the figure needs no legend.
    let figure = Figure {
        title: "Change in normalized IQM from uniform to correlated batches (95% CIs)".into(),
        columns: panels.len().min(4),
        panels: panels.iter().map(panel).collect(),
        legend: vec![],
    };
    plots::write(&out.join("sampler_change"), &figure)
}

/// The rows of one panel of `sampler_change`: each method's change in its order.
fn change_rows(
    changes: &[SamplerChange],
    methods: &Methods,
    to: &str,
    batch: Option<usize>,
) -> Vec<Row> {
    let of = |m: &String| {
        let c = changes
            .iter()
            .find(|c| &c.method == m && c.to == to && c.batch_size == batch)?;
        Some(Row {
            label: m.clone(),
            color: color_of(m),
            value: c.change.value,
            low: c.change.low,
            high: c.change.high,
        })
    };
    methods.names.iter().filter_map(of).collect()
}

/// `method`'s aggregate in `setting`, if the grid ran it there.
fn aggregate_of<'a>(
    report: &'a Report,
    method: &str,
    setting: &Setting,
) -> Option<&'a AggregateStats> {
    report
        .aggregate
        .iter()
        .find(|a| a.method == method && &a.setting == setting)
}

/// The rows of an interval panel: each method's estimate in `setting`.
fn rows(
    report: &Report,
    methods: &Methods,
    setting: &Setting,
    pick: impl Fn(&AggregateStats) -> Option<Estimate>,
) -> Vec<Row> {
    methods
        .names
        .iter()
        .filter_map(|m| {
            let e = pick(aggregate_of(report, m, setting)?)?;
            Some(Row {
                label: m.clone(),
                color: color_of(m),
                value: e.value,
                low: e.low,
                high: e.high,
            })
        })
        .collect()
}

/// rliable's four aggregate metrics, a row of panels per setting.
fn aggregate(report: &Report, methods: &Methods, out: &Path) -> Result<()> {
    type Metric = fn(&AggregateStats) -> Estimate;
    let metrics: [(&str, Metric); 4] = [
        ("Median", |a| a.median),
        ("IQM", |a| a.iqm),
        ("Mean", |a| a.mean),
        ("Optimality gap (lower is better)", |a| a.optimality_gap),
    ];
    let mut panels = vec![];
    for setting in &methods.settings {
        for (name, metric) in metrics {
            panels.push(Panel {
                title: panel_title(name, setting),
                x_label: "normalized score".into(),
                y_label: String::new(),
                content: Content::Intervals {
                    rows: rows(report, methods, setting, |a| Some(metric(a))),
                    mark: None,
                    range: None,
                },
            });
        }
    }
    let figure = Figure {
        title: "Normalized final scores over all environments (95% stratified-bootstrap CIs)"
            .into(),
        columns: 4,
        panels,
        legend: methods.legend(),
    };
    plots::write(&out.join("aggregate"), &figure)
}

/// Each method's probability of improvement on the baseline method, per setting.
fn improvement(report: &Report, methods: &Methods, out: &Path) -> Result<()> {
    let Some(base) = report.base_method() else {
        return Ok(());
    };
    let panel = |setting: &Setting| Panel {
        title: panel_title(&format!("P(method > {base})"), setting),
        x_label: "probability of improvement".into(),
        y_label: String::new(),
        content: Content::Intervals {
            rows: rows(report, methods, setting, |a| a.improvement),
            mark: Some(0.5),
            range: Some((0.0, 1.0)),
        },
    };
    let title = format!("Probability of improvement over {base} in the same setting (95% CIs)");
    plots::write(&out.join("improvement"), &methods.figure(title, panel))
}

/// Performance profiles with bootstrap bands, a panel per setting.
fn profiles(report: &Report, methods: &Methods, out: &Path) -> Result<()> {
    let taus = &report.performance_profile_taus;
    let panel = |setting: &Setting| {
        let lines = methods.lines(|m| {
            let a = aggregate_of(report, m, setting)?;
            let points = taus.iter().zip(&a.profile);
            Some(points.map(|(&t, e)| (t, e.value, e.low, e.high)).collect())
        });
        Panel {
            title: panel_title("Performance profile", setting),
            x_label: "normalized score τ".into(),
            y_label: "fraction of runs > τ".into(),
            content: Content::Lines {
                lines,
                x_ticks: None,
            },
        }
    };
    let title = "Performance profiles over all environments (95% CIs)".into();
    let figure = methods.figure(title, panel);
    plots::write(&out.join("performance_profile"), &figure)
}

/// One environment's evaluation curves, training returns and diagnostics, each a
/// figure with a panel per setting.
fn environment(report: &Report, env: &str, methods: &Methods, out: &Path) -> Result<()> {
    let runs: Vec<&RunRecord> = report.runs.iter().filter(|r| r.env == env).collect();
    let stem = |what: &str| out.join(format!("{what}-{}", sanitize(env)));
    let figure = |title: String, y_label: &str, series: &Series| {
        let panel = |setting: &Setting| {
            let lines = methods.lines(|m| {
                let rs: Vec<&RunRecord> = runs
                    .iter()
                    .copied()
                    .filter(|r| &r.axes.method == m && &r.axes.setting == setting)
                    .collect();
                let points = series(&rs);
                (!points.is_empty()).then_some(points)
            });
            Panel {
                title: panel_title(env, setting),
                x_label: "environment steps".into(),
                y_label: y_label.to_string(),
                content: Content::Lines {
                    lines,
                    x_ticks: None,
                },
            }
        };
        methods.figure(title, panel)
    };
    let eval = |rs: &[&RunRecord]| curve(rs, |r| Some(&r.eval_curve));
    let title = format!("{env}: evaluation return (mean over seeds, 95% CI)");
    plots::write(&stem("curves"), &figure(title, "evaluation return", &eval))?;
    let title = format!("{env}: training episodes (smoothed, mean over seeds, 95% CI)");
    plots::write(
        &stem("train-curves"),
        &figure(title, "training return", &training),
    )?;
    for (name, label) in REPORTED {
        let diag = |rs: &[&RunRecord]| curve(rs, |r| r.diagnostics.get(name).map(Vec::as_slice));
        if runs
            .iter()
            .any(|r| r.diagnostics.get(name).is_some_and(|c| !c.is_empty()))
        {
            let file = format!("diagnostics-{}", name.replace('/', "-").replace('.', "_"));
            let title = format!("{env}: {label} (mean over seeds, 95% CI)");
            plots::write(&stem(&file), &figure(title, short(label), &diag))?;
        }
    }
    Ok(())
}

/// A diagnostic's label short enough for an axis ("effective rank of the penultimate
/// features" is "effective rank"); the figure's title says it in full.
fn short(label: &str) -> &str {
    [" (", " of ", " ||"]
        .iter()
        .filter_map(|cut| label.find(cut))
        .min()
        .map_or(label, |end| &label[..end])
}

/// Mean over runs of values that share a step, with a band over the runs.
fn band(by_step: BTreeMap<u64, Vec<f64>>) -> Vec<(f64, f64, f64, f64)> {
    by_step
        .iter()
        .map(|(&s, vals)| {
            let one = std::slice::from_ref(vals);
            let (lo, hi) = stratified_bootstrap_ci(one, |t| mean(&t[0]), BAND_REPS, 0.95, s);
            (s as f64, mean(vals), lo, hi)
        })
        .collect()
}

/// A curve the runs sample at the same steps (evaluations, diagnostics).
fn curve<'a>(
    runs: &[&'a RunRecord],
    of: impl Fn(&'a RunRecord) -> Option<&'a [(u64, f64)]>,
) -> Vec<(f64, f64, f64, f64)> {
    let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for r in runs {
        for &(s, v) in of(r).unwrap_or_default() {
            if v.is_finite() {
                by_step.entry(s).or_default().push(v);
            }
        }
    }
    band(by_step)
}

/// Training returns, which each run has at its own steps (episode ends): per run, the
/// mean return of the episodes ending in the last `window` steps before each of
/// [`TRAIN_POINTS`] evenly spaced steps (none there: no point); then across runs.
fn training(runs: &[&RunRecord]) -> Vec<(f64, f64, f64, f64)> {
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
    band(by_step)
}
