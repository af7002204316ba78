//! `report.md` and the CSV tables. `report.md`: the figures first (the headline, when
//! the grid has batch sizes to compare, and the change from uniform to correlated
//! batches, when it has both), each with one sentence under it that says what it
//! shows, written from the numbers; then the tables.

use std::fmt::{Display, Write as _};

use super::aggregate::{AggregateStats, Estimate};
use super::grid::{sampler_rank, Setting};
use super::plots::tick_label;
use super::records::{VariantStats, BOOTSTRAP_REPS};
use super::samplers::SamplerChange;
use super::summary::Report;
use crate::run::diagnostics::REPORTED;
use crate::storage::sanitize;

fn fmt_ci(v: f64, ci: (f64, f64)) -> String {
    format!("{v:.2} [{:.2}, {:.2}]", ci.0, ci.1)
}

fn est(e: &Estimate) -> String {
    fmt_ci(e.value, (e.low, e.high))
}

/// A variant's name as a caption says it: "batch_norm at uniform, batch 4".
fn named(a: &AggregateStats) -> String {
    match a.setting.title() {
        t if t.is_empty() => a.method.clone(),
        t => format!("{} at {t}", a.method),
    }
}

/// "loses" or "gains", as a change's sign says.
fn verb(change: f64) -> &'static str {
    if change < 0.0 {
        "loses"
    } else {
        "gains"
    }
}

pub fn markdown(report: &Report) -> String {
    let mut md = String::from("# Comparison report\n\n");
    let _ = writeln!(
        md,
        "IQM = interquartile mean over seeds; intervals are 95% stratified-bootstrap confidence intervals ({BOOTSTRAP_REPS} resamples). Final = the last evaluation; AUC = the mean of the evaluation curve; normalized = (score - random) / (reference - random), ranges below. One color per method in every figure.\n"
    );
    missing(report, &mut md);
    headline(report, &mut md);
    sampler_changes(report, &mut md);
    setting_table(report, &mut md);
    aggregates(report, &mut md);
    environments(report, &mut md);
    ranges(report, &mut md);
    md
}

/// The runs the report leaves out, named before any number that lacks them.
fn missing(report: &Report, md: &mut String) {
    let left = &report.left_out;
    if !left.methods.is_empty() {
        let named: Vec<String> = left.methods.iter().map(|m| format!("**{m}**")).collect();
        let _ = writeln!(
            md,
            "Left out on request (`--leave-out`): {}, with their {} finished and {} missing runs.\n",
            named.join(", "),
            left.runs,
            left.missing
        );
    }
    if report.duplicates > 0 {
        let _ = writeln!(
            md,
            "{} runs were found more than once (the same variant, config and seed in overlapping directories, with the same results) and are counted once.\n",
            report.duplicates
        );
    }
    if report.missing.is_empty() {
        return;
    }
    let n = report.missing.len();
    let runs = if n == 1 { "run is" } else { "runs are" };
    let envs = super::missing::per_environment(&report.missing);
    let per_env = match envs.len() {
        0 | 1 => String::new(),
        _ => {
            let counts: Vec<String> = envs.iter().map(|(e, n)| format!("{e} {n}")).collect();
            format!("; by environment: {}", counts.join(", "))
        }
    };
    let _ = writeln!(
        md,
        "**{n} {runs} missing from this report** (every figure and table below is drawn without them{per_env}):\n"
    );
    let lines = super::missing::grouped(&report.missing);
    // A long list folds away, so that the report's first page is its figures.
    let fold = lines.len() > 12;
    if fold {
        let _ = writeln!(md, "<details><summary>The missing runs</summary>\n");
    }
    for line in &lines {
        let _ = writeln!(md, "- {line}");
    }
    if fold {
        md.push_str("\n</details>\n");
    }
    md.push('\n');
}

fn figure(md: &mut String, file: &str, alt: &str, caption: &str) {
    let _ = writeln!(md, "![{alt}]({file})\n\n{caption}\n");
}

/// The study's figure and what it says: which method loses most from its largest batch
/// to its smallest, and which least.
fn headline(report: &Report, md: &mut String) {
    let changes = &report.batch_changes;
    let (Some(worst), Some(best)) = (
        changes
            .iter()
            .min_by(|a, b| a.change.value.total_cmp(&b.change.value)),
        changes
            .iter()
            .max_by(|a, b| a.change.value.total_cmp(&b.change.value)),
    ) else {
        return;
    };
    md.push_str("## Return against batch size\n\n");
    let sampler = |s: &Option<String>| {
        s.as_ref()
            .map(|s| format!(", {s} sampler"))
            .unwrap_or_default()
    };
    let caption = format!(
        "IQM of the normalized final return over all environments against batch size, a panel per method on one shared y axis, a line per sampler. From batch {} to batch {}, **{}** {} most ({} in normalized IQM{}); **{}** {} least ({}{}).",
        worst.from,
        worst.to,
        worst.method,
        verb(worst.change.value),
        est(&worst.change),
        sampler(&worst.sampler),
        best.method,
        verb(best.change.value),
        est(&best.change),
        sampler(&best.sampler),
    );
    figure(md, "batch_size.png", "IQM against batch size", &caption);
    let envs: std::collections::BTreeSet<&str> = report
        .by_batch_size
        .iter()
        .filter_map(|p| p.env.as_deref())
        .collect();
    let links: Vec<String> = envs
        .iter()
        .map(|e| format!("[{e}](batch_size-{}.png)", sanitize(e)))
        .collect();
    let _ = writeln!(md, "Per environment (raw returns): {}.\n", links.join(", "));
}

/// The non-i.i.d. question: each method's change from uniform to correlated batches,
/// the figure and what it says, for each correlated sampler of the grid.
fn sampler_changes(report: &Report, md: &mut String) {
    let changes = &report.sampler_changes;
    if changes.is_empty() {
        return;
    }
    md.push_str("## Uniform against correlated batches\n\n");
    let mut targets: Vec<&str> = changes.iter().map(|c| c.to.as_str()).collect();
    targets.sort_by_key(|t| sampler_rank(Some(t)));
    targets.dedup();
    let mut sentences: Vec<String> = targets
        .iter()
        .map(|to| {
            let of: Vec<&SamplerChange> = changes
                .iter()
                .filter(|c| c.to == *to && !c.same_runs)
                .collect();
            sampler_sentence(to, &of)
        })
        .filter(|s| !s.is_empty())
        .collect();
    sentences.extend(same_runs_sentence(changes));
    let caption = format!(
        "Change in each method's IQM of the normalized final return over all environments when its batches come from a correlated sampler instead of uniform, a panel per batch size and correlated sampler, with 95% stratified-bootstrap intervals of the difference (seeds resampled within each environment, for each sampler apart). {}",
        sentences.join(" ")
    );
    figure(
        md,
        "sampler_change.png",
        "change from uniform to correlated batches",
        &caption,
    );
}

/// The settings whose correlated sampler trained every method's runs exactly as
/// `uniform` did (`sequential` at batch 1: a run of one transition is a uniform draw),
/// named, since the figure leaves them out.
fn same_runs_sentence(changes: &[SamplerChange]) -> Option<String> {
    let mut settings: Vec<(Option<usize>, &str)> = changes
        .iter()
        .map(|c| (c.batch_size, c.to.as_str()))
        .filter(|&(b, to)| {
            let mut of = changes.iter().filter(|c| c.batch_size == b && c.to == to);
            of.all(|c| c.same_runs)
        })
        .collect();
    settings.sort();
    settings.dedup();
    let named: Vec<String> = settings
        .iter()
        .map(|(b, to)| match b {
            Some(b) => format!("{to} at batch {b}"),
            None => to.to_string(),
        })
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "Left out of the figure: {}, where every method's runs ended exactly as under uniform, seed for seed (a change of 0 by construction, not an estimate).",
            named.join(", ")
        )
    })
}

/// What the changes to one sampler say: the largest drop, the smallest, and how many
/// intervals lie below zero (the method is surely worse with correlated batches).
fn sampler_sentence(to: &str, changes: &[&SamplerChange]) -> String {
    let value = |c: &&&SamplerChange| c.change.value;
    let (Some(worst), Some(best)) = (
        changes.iter().min_by(|a, b| value(a).total_cmp(&value(b))),
        changes.iter().max_by(|a, b| value(a).total_cmp(&value(b))),
    ) else {
        return String::new();
    };
    let at = |c: &SamplerChange| {
        let batch = c
            .batch_size
            .map(|b| format!(" at batch {b}"))
            .unwrap_or_default();
        format!("**{}**{batch} ({})", c.method, est(&c.change))
    };
    // "loses most" for the largest drop; a largest change that is a gain says so.
    let (worst_verb, best_verb) = (
        if worst.change.value < 0.0 {
            "loses most"
        } else {
            "gains least"
        },
        if best.change.value < 0.0 {
            "loses least"
        } else {
            "gains most"
        },
    );
    let below = changes.iter().filter(|c| c.change.high < 0.0).count();
    let above = changes.iter().filter(|c| c.change.low > 0.0).count();
    format!(
        "With the {to} sampler, {} {worst_verb} and {} {best_verb}; {below} of {} intervals lie below zero, {above} above.",
        at(worst),
        at(best),
        changes.len()
    )
}

/// A setting as a table's column names it: `b4 sequential`, `b32`, `uniform`.
fn column(setting: &Setting) -> String {
    let batch = setting.batch_size.map(|b| format!("b{b}"));
    let parts: Vec<String> = [batch, setting.sampler.clone()]
        .into_iter()
        .flatten()
        .collect();
    match parts.join(" ") {
        p if p.is_empty() => "all runs".into(),
        p => p,
    }
}

/// The headline's numbers as a table: final normalized IQM [95% CI] over all
/// environments, a row per method, a column per batch size and sampler (smallest
/// batch first, uniform before correlated samplers); drawn when the grid has two
/// settings or more.
fn setting_table(report: &Report, md: &mut String) {
    let mut settings: Vec<&Setting> = report.aggregate.iter().map(|a| &a.setting).collect();
    settings.sort_by_key(|s| (s.batch_size, sampler_rank(s.sampler.as_deref())));
    settings.dedup();
    if settings.len() < 2 {
        return;
    }
    md.push_str("## Final normalized IQM per method and setting\n\n");
    md.push_str("IQM of the normalized final return over all environments [95% stratified-bootstrap CI]; - where the grid has no such run.\n\n");
    let names: Vec<String> = settings.iter().map(|s| column(s)).collect();
    let _ = writeln!(md, "| method | {} |", names.join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(settings.len()));
    // A cell whose runs are uniform's own, seed for seed (sequential at batch 1), is
    // marked: the same number twice is not two measurements agreeing.
    let same = |method: &str, s: &Setting| {
        let of = |c: &&SamplerChange| c.method == method && c.batch_size == s.batch_size;
        let to = |c: &&SamplerChange| Some(&c.to) == s.sampler.as_ref();
        let changes = report.sampler_changes.iter();
        changes.filter(of).filter(to).any(|c| c.same_runs)
    };
    let all_envs = report.envs().len();
    for method in report.methods() {
        let cells: Vec<String> = settings
            .iter()
            .map(|s| {
                let a = report
                    .aggregate
                    .iter()
                    .find(|a| a.method == method && &a.setting == *s);
                let mark = if same(&method, s) { " †" } else { "" };
                a.filter(|a| a.runs > 0).map_or_else(
                    || "-".into(),
                    |a| format!("{}{mark}{}", est(&a.iqm), partial(a, all_envs)),
                )
            })
            .collect();
        let _ = writeln!(md, "| {method} | {} |", cells.join(" | "));
    }
    md.push('\n');
    if report.sampler_changes.iter().any(|c| c.same_runs) {
        md.push_str("† The same runs as uniform at that batch size, seed for seed (trained alike to the same final return): one measurement, not two.\n\n");
    }
    if report
        .aggregate
        .iter()
        .any(|a| a.runs > 0 && a.envs < all_envs)
    {
        let _ = writeln!(md, "‡ k/{all_envs}: over the k environments with a finished run only, of the report's {all_envs}; not comparable with a cell over all of them.\n");
    }
}

/// A cell's mark where its aggregate covers fewer environments than the report: a
/// study half done aggregates a method over the games it finished, and a cell over two
/// easy games would read as better than one over five.
fn partial(a: &AggregateStats, all_envs: usize) -> String {
    match a.envs < all_envs {
        true => format!(" ‡{}/{all_envs}", a.envs),
        false => String::new(),
    }
}

/// The methods whose IQM interval in `leader`'s setting overlaps the leader's, as a
/// clause (`, its interval overlapping none's, layer_norm's`): the ones the data does
/// not tell from the leader. Empty where none does.
fn overlapping(report: &Report, leader: &AggregateStats) -> String {
    let tied: Vec<String> = report
        .aggregate
        .iter()
        .filter(|b| b.setting == leader.setting && b.method != leader.method && b.runs > 0)
        .filter(|b| b.iqm.high >= leader.iqm.low)
        .map(|b| format!("{}'s", b.method))
        .collect();
    match tied.is_empty() {
        true => String::new(),
        false => format!(", its interval overlapping {}", tied.join(", ")),
    }
}

/// The aggregate figures, their captions and table.
fn aggregates(report: &Report, md: &mut String) {
    md.push_str("## Across environments\n\n");
    let mut leaders: Vec<&AggregateStats> = vec![];
    for a in &report.aggregate {
        let better = |b: &&AggregateStats| b.setting == a.setting && b.iqm.value > a.iqm.value;
        if !report.aggregate.iter().any(|b| better(&b)) {
            leaders.push(a);
        }
    }
    // In the figures' order: larger batches first, uniform first within a batch size.
    leaders.sort_by(|a, b| {
        let key = |x: &AggregateStats| std::cmp::Reverse(x.setting.batch_size);
        let rank = |x: &AggregateStats| sampler_rank(x.setting.sampler.as_deref()).0;
        (key(a), rank(a)).cmp(&(key(b), rank(b)))
    });
    // A leader over fewer games than the report's is marked as in the table (‡ k/n).
    let all_envs = report.envs().len();
    let leaders: Vec<String> = leaders
        .iter()
        .map(|a| {
            let iqm = format!("{}{}", est(&a.iqm), partial(a, all_envs));
            format!("{} ({iqm}){}", named(a), overlapping(report, a))
        })
        .collect();
    let caption = format!(
        "Median, IQM, mean and optimality gap of normalized final scores per method, a row per setting. Highest IQM: {}.",
        leaders.join("; ")
    );
    figure(md, "aggregate.png", "aggregate metrics", &caption);
    improvement(report, md);
    profile(report, md);
    // The baseline is a variant, but each setting is compared with the baseline's
    // method in that same setting: the header names the method, not the variant.
    let base = report.base_method().unwrap_or("-");
    let _ = write!(
        md,
        "| variant | runs | median | IQM | mean | optimality gap | P(improvement over {base}, same setting) |\n|---|---|---|---|---|---|---|\n"
    );
    for a in &report.aggregate {
        let poi = a
            .improvement
            .as_ref()
            .map(est)
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {poi} |",
            a.variant,
            a.runs,
            est(&a.median),
            est(&a.iqm),
            est(&a.mean),
            est(&a.optimality_gap)
        );
    }
    md.push('\n');
}

fn improvement(report: &Report, md: &mut String) {
    let with: Vec<&AggregateStats> = report
        .aggregate
        .iter()
        .filter(|a| a.improvement.is_some())
        .collect();
    let value = |a: &&AggregateStats| a.improvement.map_or(f64::NAN, |e| e.value);
    let Some(top) = with.iter().max_by(|a, b| value(a).total_cmp(&value(b))) else {
        return;
    };
    let above = with
        .iter()
        .filter(|a| a.improvement.is_some_and(|e| e.low > 0.5))
        .count();
    let below = with
        .iter()
        .filter(|a| a.improvement.is_some_and(|e| e.high < 0.5))
        .count();
    let caption = format!(
        "Probability that a run of each method scores above a run of the baseline method in the same setting. Likeliest to improve: {} ({}). {above} of {} intervals lie above 0.5, {below} below.",
        named(top),
        est(&top.improvement.expect("filtered")),
        with.len()
    );
    figure(
        md,
        "improvement.png",
        "probability of improvement",
        &caption,
    );
}

fn profile(report: &Report, md: &mut String) {
    // At tau = 0.5: how often each variant's runs get halfway to the reference.
    let Some(k) = report
        .performance_profile_taus
        .iter()
        .position(|&t| (t - 0.5).abs() < 1e-9)
    else {
        return;
    };
    let at = |a: &&AggregateStats| a.profile.get(k).map_or(f64::NAN, |e| e.value);
    let (Some(most), Some(least)) = (
        report
            .aggregate
            .iter()
            .max_by(|a, b| at(a).total_cmp(&at(b))),
        report
            .aggregate
            .iter()
            .min_by(|a, b| at(a).total_cmp(&at(b))),
    ) else {
        return;
    };
    let caption = format!(
        "Fraction of runs whose normalized score exceeds each threshold, a panel per setting. Above 0.5: most often {} ({:.2} of runs), least often {} ({:.2}).",
        named(most),
        at(&most),
        named(least),
        at(&least)
    );
    figure(
        md,
        "performance_profile.png",
        "performance profiles",
        &caption,
    );
}

/// The per-environment table, then each environment's curves and diagnostics.
fn environments(report: &Report, md: &mut String) {
    md.push_str("## Per environment\n\n| env | variant | runs | diverged | final IQM [95% CI] | final mean | AUC IQM [95% CI] | steps to threshold (median) | wall s | steps/s |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for s in &report.per_env {
        let steps = s
            .median_steps_to_threshold
            .map(|v| format!("{v} ({}/{} runs)", s.solved_runs, s.runs))
            .unwrap_or_else(|| format!("- ({}/{} runs)", s.solved_runs, s.runs));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.0} | {:.0} |",
            s.env,
            s.variant,
            s.runs,
            s.diverged_runs,
            fmt_ci(s.final_iqm, s.final_ci),
            s.final_mean,
            fmt_ci(s.auc_iqm, s.auc_ci),
            steps,
            s.mean_wall_seconds,
            s.mean_steps_per_second
        );
    }
    md.push('\n');
    for env in report.envs() {
        environment(report, env, md);
    }
}

/// A statistic of a variant on one environment, with its confidence interval.
type Stat = fn(&VariantStats) -> (f64, (f64, f64));

/// A figure's caption from the variants at the two ends of its statistic.
type Caption = fn(&str, &str) -> String;

fn environment(report: &Report, env: &str, md: &mut String) {
    let stats: Vec<&VariantStats> = report.per_env.iter().filter(|s| s.env == env).collect();
    // "variant (estimate [CI])" of the variants highest and lowest on `stat`.
    let extremes = |stat: Stat| {
        let key = |s: &&&VariantStats| stat(s).0;
        let named = |s: &VariantStats| {
            let (value, ci) = stat(s);
            format!("{} ({})", s.variant, fmt_ci(value, ci))
        };
        let max = stats.iter().max_by(|a, b| key(a).total_cmp(&key(b)))?;
        let min = stats.iter().min_by(|a, b| key(a).total_cmp(&key(b)))?;
        Some((named(max), named(min)))
    };
    let _ = writeln!(md, "### {env}\n");
    let file = sanitize(env);
    // Each curve figure, its caption naming the variants at both ends of its statistic.
    let figures: [(&str, &str, Stat, Caption); 2] = [
        (
            "curves",
            "evaluation curves",
            |s| (s.final_iqm, s.final_ci),
            |hi, lo| {
                format!("Evaluation return over training, mean over seeds with a 95% band, a panel per setting. Highest at the end: {hi}; lowest: {lo}.")
            },
        ),
        (
            "train-curves",
            "training curves",
            |s| (s.auc_iqm, s.auc_ci),
            |hi, lo| {
                format!("Training episodes' returns, smoothed per seed. Largest area under the evaluation curve: {hi}; smallest: {lo}.")
            },
        ),
    ];
    for (image, alt, stat, caption) in figures {
        if let Some((hi, lo)) = extremes(stat) {
            let (image, alt) = (format!("{image}-{file}.png"), format!("{env} {alt}"));
            figure(md, &image, &alt, &caption(&hi, &lo));
        }
    }
    diagnostics(report, env, md);
}

/// A line per diagnostic: its figure and which variant ends highest and lowest.
fn diagnostics(report: &Report, env: &str, md: &mut String) {
    let mut lines = vec![];
    for (name, label) in REPORTED {
        let mut last: Vec<(&str, f64)> = vec![];
        for s in report.per_env.iter().filter(|s| s.env == env) {
            let values: Vec<f64> = report
                .runs
                .iter()
                .filter(|r| r.env == env && r.variant == s.variant)
                .filter_map(|r| r.diagnostics.get(name)?.last().map(|p| p.1))
                .filter(|v| v.is_finite())
                .collect();
            if !values.is_empty() {
                last.push((&s.variant, super::stats::mean(&values)));
            }
        }
        let (Some(hi), Some(lo)) = (
            last.iter().max_by(|a, b| a.1.total_cmp(&b.1)),
            last.iter().min_by(|a, b| a.1.total_cmp(&b.1)),
        ) else {
            continue;
        };
        let file = format!(
            "diagnostics-{}-{}.png",
            name.replace('/', "-").replace('.', "_"),
            sanitize(env)
        );
        lines.push(format!(
            "- [{label}]({file}): at the end highest for {} ({}), lowest for {} ({}).",
            hi.0,
            tick_label(hi.1),
            lo.0,
            tick_label(lo.1)
        ));
    }
    if !lines.is_empty() {
        let _ = writeln!(
            md,
            "Diagnostics over training (mean over seeds, 95% bands):\n\n{}\n",
            lines.join("\n")
        );
    }
}

fn ranges(report: &Report, md: &mut String) {
    md.push_str("## Score ranges\n\n");
    for (env, r) in &report.score_ranges {
        let _ = writeln!(
            md,
            "- {env}: random {:.2}, reference {:.2}",
            r.random, r.reference
        );
    }
    // A reference derived from the runs moves when runs are added; a study fixes its
    // ranges once its grid is done, so that every later report normalizes alike. The
    // block is exact (`{:?}` prints the shortest form that reads back as the same f64).
    md.push_str(
        "\nTo normalize later reports by exactly these ranges, put them in the comparison's config:\n\n```toml\n[report.scores]\n",
    );
    for (env, r) in &report.score_ranges {
        let key = toml::Value::String(env.clone());
        let _ = writeln!(
            md,
            "{key} = {{ random = {:?}, reference = {:?} }}",
            r.random, r.reference
        );
    }
    md.push_str("```\n");
}

/// Appends the CSV row of `fields` to `csv`: joined by commas, unquoted.
fn csv_row(csv: &mut String, fields: &[&dyn Display]) {
    let row: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
    let _ = writeln!(csv, "{}", row.join(","));
}

/// `runs.csv`: one row per run.
pub(crate) fn csv_runs(report: &Report) -> String {
    let mut csv = String::from(
        "env,variant,seed,final_return,auc,steps_to_threshold,wall_seconds,steps_per_second\n",
    );
    for r in &report.runs {
        let steps = r.steps_to_threshold.map(|s| s.to_string());
        let fields: [&dyn Display; 8] = [
            &r.env,
            &r.variant,
            &r.seed,
            &r.final_return,
            &r.auc,
            &steps.unwrap_or_default(),
            &r.wall_seconds,
            &r.steps_per_second,
        ];
        csv_row(&mut csv, &fields);
    }
    csv
}

/// `summary.csv`: one row per environment and variant.
pub(crate) fn csv_summary(report: &Report) -> String {
    let mut summary = String::from("env,variant,runs,final_iqm,final_ci_low,final_ci_high,final_mean,auc_iqm,auc_ci_low,auc_ci_high\n");
    for s in &report.per_env {
        let fields: [&dyn Display; 10] = [
            &s.env,
            &s.variant,
            &s.runs,
            &s.final_iqm,
            &s.final_ci.0,
            &s.final_ci.1,
            &s.final_mean,
            &s.auc_iqm,
            &s.auc_ci.0,
            &s.auc_ci.1,
        ];
        csv_row(&mut summary, &fields);
    }
    summary
}
