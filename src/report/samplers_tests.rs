//! The change from uniform to sequential batches against a case computed by hand, the
//! table of IQM per method and setting, and which figures a grid with one sampler or
//! two gets (their labels checked as `layout_tests` checks the others).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::aggregate::AggregateStats;
use super::grid::RunAxes;
use super::layout_tests::{check_svg, texts, Box2};
use super::records::{Loaded, RunRecord};
use super::settings::{ReportConfig, ScoreRange};
use super::summary::{build, Report};

const ENVS: [&str; 2] = ["minatar/breakout", "minatar/asterix"];

/// A finished run with only what the aggregates read: its final return.
pub(super) fn run(env: &str, variant: &str, seed: u64, final_return: f64) -> RunRecord {
    RunRecord {
        env: env.to_string(),
        axes: RunAxes::of(variant, None, "none"),
        variant: variant.to_string(),
        seed,
        final_return,
        auc: final_return / 2.0,
        steps_to_threshold: None,
        wall_seconds: 1.0,
        steps_per_second: 1.0,
        diverged: false,
        eval_curve: vec![(0, 0.0), (1_000, final_return)],
        train_curve: vec![(500, final_return)],
        diagnostics: BTreeMap::new(),
    }
}

/// A report of `runs` whose scores normalize by a tenth (random 0, reference 10) on
/// every environment, so that normalized scores are known by hand.
fn report(runs: Vec<RunRecord>) -> Report {
    let range = ScoreRange {
        random: 0.0,
        reference: 10.0,
    };
    let config = ReportConfig {
        scores: ENVS.iter().map(|e| (e.to_string(), range)).collect(),
        ..ReportConfig::default()
    };
    let loaded = Loaded {
        runs,
        ..Loaded::default()
    };
    build(loaded, &config).unwrap()
}

/// Four seeds a variant on both environments: `first` + 0..3 on breakout, and 4 more
/// on asterix.
fn seeds(runs: &mut Vec<RunRecord>, variant: &str, first: f64) {
    for (e, env) in ENVS.iter().enumerate() {
        for seed in 0..4u64 {
            let ret = first + (4 * e as u64 + seed) as f64;
            runs.push(run(env, variant, seed + 1, ret));
        }
    }
}

/// The headline's change from the largest batch to the smallest counts the games both
/// have runs on: with batch 1 finished on breakout only, the change is breakout's, not
/// batch 1's breakout against batch 32's breakout and asterix (a study part-way
/// through compared two games with four).
#[test]
fn the_change_across_batch_sizes_compares_the_same_games() {
    let mut runs = vec![];
    // Batch 32: 1..=4 on breakout, 5..=8 on asterix; batch 1: 0..=3 on breakout only.
    seeds(&mut runs, "b32-uniform-none", 1.0);
    runs.extend((0..4u64).map(|s| run(ENVS[0], "b1-uniform-none", s + 1, s as f64)));
    let r = report(runs);
    let [c] = r.batch_changes.as_slice() else {
        panic!("one change: {:?}", r.batch_changes);
    };
    assert_eq!((c.from, c.to), (32, 1));
    // Breakout alone: IQM of 0.1..=0.4 (drop one at each end: 0.25) against 0.0..=0.3
    // (0.15): -0.1. Over both games batch 32 would have been 0.45, a change of -0.3.
    assert!((c.change.value + 0.1).abs() < 1e-12, "{:?}", c.change);
}

#[test]
fn the_change_from_uniform_to_sequential_by_hand() {
    // Uniform: returns 1..=8 over both games, normalized 0.1..=0.8; the IQM of eight
    // drops two at each end: mean(0.3, 0.4, 0.5, 0.6) = 0.45. Sequential: 0..=7,
    // IQM 0.35. The change is -0.1.
    let mut runs = vec![];
    seeds(&mut runs, "b4-uniform-none", 1.0);
    seeds(&mut runs, "b4-sequential-none", 0.0);
    let r = report(runs);
    let [c] = r.sampler_changes.as_slice() else {
        panic!("one change: {:?}", r.sampler_changes);
    };
    assert_eq!((c.method.as_str(), c.batch_size), ("none", Some(4)));
    assert_eq!((c.from.as_str(), c.to.as_str()), ("uniform", "sequential"));
    assert!((c.change.value + 0.1).abs() < 1e-12, "{:?}", c.change);
    assert!(c.change.low <= c.change.value && c.change.value <= c.change.high);
    assert!(c.change.low < c.change.high, "{:?}", c.change);
    // The point estimate is the difference of the two IQMs the table prints.
    let iqm = |v: &str| r.aggregate.iter().find(|a| a.variant == v).unwrap().iqm;
    let (u, s) = (iqm("b4-uniform-none"), iqm("b4-sequential-none"));
    assert!((u.value - 0.45).abs() < 1e-12 && (s.value - 0.35).abs() < 1e-12);
    assert!((c.change.value - (s.value - u.value)).abs() < 1e-12);
}

#[test]
fn identical_samplers_change_nothing() {
    let mut runs = vec![];
    seeds(&mut runs, "b4-uniform-none", 1.0);
    seeds(&mut runs, "b4-sequential-none", 1.0);
    // An evaluation midway that differs (a run the study's binary resumed between two
    // evaluations) leaves the runs the same: trained alike to the same final return.
    let last = runs.last_mut().unwrap();
    last.eval_curve.insert(1, (500, 99.0));
    let [c] = report(runs).sampler_changes.try_into().unwrap();
    // The same runs, seed for seed: exactly 0, with no bootstrap spread.
    assert!(c.same_runs);
    assert_eq!(
        (c.change.value, c.change.low, c.change.high),
        (0.0, 0.0, 0.0)
    );
}

#[test]
fn the_same_scores_from_other_runs_are_not_the_same_runs() {
    // Equal final returns, but seed 1 and 2 swapped: an estimate, not an identity.
    let mut runs = vec![];
    seeds(&mut runs, "b4-uniform-none", 1.0);
    seeds(&mut runs, "b4-sequential-none", 1.0);
    for r in runs
        .iter_mut()
        .filter(|r| r.variant == "b4-sequential-none")
    {
        r.seed = match r.seed {
            1 => 2,
            2 => 1,
            s => s,
        };
    }
    let [c] = report(runs).sampler_changes.try_into().unwrap();
    assert!(!c.same_runs);
    assert_eq!(c.change.value, 0.0);
    assert!(c.change.low < 0.0 && 0.0 < c.change.high, "{:?}", c.change);
}

/// Batch 1 and 4 under uniform and sequential, where sequential at batch 1 trains
/// exactly the uniform runs (as the study's sampler does): its panel is left out of
/// the figure and report.md says why, while batch 4's is drawn.
#[test]
fn a_setting_of_the_same_runs_is_named_and_left_out_of_the_figure() {
    let mut runs = vec![];
    for method in ["none", "layer_norm"] {
        seeds(&mut runs, &format!("b1-uniform-{method}"), 1.0);
        seeds(&mut runs, &format!("b1-sequential-{method}"), 1.0);
        seeds(&mut runs, &format!("b4-uniform-{method}"), 2.0);
        seeds(&mut runs, &format!("b4-sequential-{method}"), -2.0);
    }
    let r = report(runs);
    let (dir, _) = written(&r, "same-runs");
    let svg = std::fs::read_to_string(dir.join("sampler_change.svg")).unwrap();
    assert!(svg.contains("sequential − uniform, batch 4"), "{svg}");
    assert!(!svg.contains("batch 1"), "{svg}");
    check_svg(&dir.join("sampler_change.svg"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("Left out of the figure: sequential at batch 1, where every method's runs ended exactly as under uniform"),
        "{md}"
    );
    // The sentence on the drawn changes counts batch 4's two, not batch 1's.
    assert!(md.contains("2 of 2 intervals lie below zero"), "{md}");
    // The table marks batch 1's sequential cells, and only those, as uniform's runs.
    let header = "| method | b1 uniform | b1 sequential | b4 uniform | b4 sequential |";
    let table = &md[md.find(header).unwrap_or_else(|| panic!("{md}"))..];
    for row in table.lines().skip(2).take(2) {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert!(cells[2].ends_with(" †") && !cells[1].contains('†'), "{row}");
        // One measurement: the same estimate and interval, to the last digit.
        assert_eq!(cells[2].trim_end_matches(" †"), cells[1], "{row}");
        assert!(!cells[3].contains('†') && !cells[4].contains('†'), "{row}");
    }
    assert!(
        md.contains("† The same runs as uniform at that batch size"),
        "{md}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_single_sampler_has_no_change() {
    let mut runs = vec![];
    seeds(&mut runs, "b4-uniform-none", 1.0);
    seeds(&mut runs, "b1-uniform-none", 0.0);
    assert!(report(runs).sampler_changes.is_empty());
}

/// Two methods at batch 1 and 4, with `samplers`: the second method 5 better (0.5
/// normalized), each correlated sampler 4 worse than the last (0.4), so that both
/// differences stand clear of a spread of 3 over the seeds.
fn grid(samplers: &[&str]) -> Report {
    let mut runs = vec![];
    for (m, method) in ["none", "layer_norm"].iter().enumerate() {
        for batch in [1, 4] {
            for (s, sampler) in samplers.iter().enumerate() {
                let first = (batch + 5 * m) as f64 - 4.0 * s as f64;
                seeds(&mut runs, &format!("b{batch}-{sampler}-{method}"), first);
            }
        }
    }
    report(runs)
}

/// Writes `report` into a fresh directory; the names of the files written.
fn written(report: &Report, name: &str) -> (PathBuf, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("normrl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    super::write(report, &dir).unwrap();
    let names = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    (dir, names)
}

#[test]
fn two_samplers_get_the_change_figure_its_section_and_the_table() {
    let r = grid(&["uniform", "sequential"]);
    let (dir, names) = written(&r, "two-samplers");
    for want in ["sampler_change.png", "sampler_change.svg", "batch_size.png"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    for svg in [
        "sampler_change.svg",
        "batch_size.svg",
        "batch_size-minatar_asterix.svg",
    ] {
        check_svg(&dir.join(svg));
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("![change from uniform to correlated batches](sampler_change.png)"));
    // Every cell loses 4 (0.4 normalized) from uniform to sequential: all four
    // intervals lie below zero, and the sentence names a method with its interval.
    assert!(
        md.contains("4 of 4 intervals lie below zero, 0 above."),
        "{md}"
    );
    assert!(md.contains("With the sequential sampler, **"), "{md}");
    // The leaders of each setting in the figures' order: batch 4 before batch 1,
    // uniform before sequential.
    let leaders = leaders(&md);
    let at = |setting: &str| leaders.find(setting).unwrap_or_else(|| panic!("{leaders}"));
    let order = [
        "uniform, batch 4",
        "sequential, batch 4",
        "uniform, batch 1",
        "sequential, batch 1",
    ];
    assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])), "{leaders}");
    // layer_norm leads every setting by 0.5 normalized over none, with intervals about
    // 0.2 wide: apart, so no overlap is named.
    assert!(
        leaders.contains("layer_norm at uniform, batch 4 ("),
        "{leaders}"
    );
    assert!(!leaders.contains("overlapping"), "{leaders}");
    assert!(md.contains(" loses most and **"), "{md}");
    // The table: methods as rows (the baseline-less order is by name), a column per
    // batch size and sampler, smallest batch first and uniform first.
    let header = "| method | b1 uniform | b1 sequential | b4 uniform | b4 sequential |\n|---|---|---|---|---|\n";
    let table = md.find(header).unwrap_or_else(|| panic!("{md}"));
    let rows: Vec<&str> = md[table + header.len()..].lines().take(2).collect();
    assert!(rows[0].starts_with("| layer_norm | "), "{rows:?}");
    assert!(rows[1].starts_with("| none | "), "{rows:?}");
    // none at batch 1, uniform: returns 1..=8, IQM 0.45 as in the case by hand.
    let none_b1_uniform = rows[1].split(" | ").nth(1).unwrap();
    assert!(none_b1_uniform.starts_with("0.45 ["), "{rows:?}");
    assert!(is_estimate(none_b1_uniform), "{none_b1_uniform}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["sampler_changes"].as_array().unwrap().len(), 4);
    assert!(json["sampler_changes"][0]["change"]["low"].is_number());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sentence of report.md that names each setting's leader.
fn leaders(md: &str) -> &str {
    let sentence = md.split("Highest IQM: ").nth(1);
    sentence
        .and_then(|s| s.lines().next())
        .unwrap_or_else(|| panic!("{md}"))
}

/// Whether `cell` reads `v [lo, hi]`, each with two decimals.
fn is_estimate(cell: &str) -> bool {
    let Some((v, rest)) = cell.split_once(" [") else {
        return false;
    };
    let Some((lo, hi)) = rest.trim_end_matches(']').split_once(", ") else {
        return false;
    };
    [v, lo, hi]
        .iter()
        .all(|x| x.parse::<f64>().is_ok() && x.split_once('.').is_some_and(|(_, d)| d.len() == 2))
}

#[test]
fn one_sampler_gets_neither_the_figure_nor_its_section() {
    let r = grid(&["uniform"]);
    let (dir, names) = written(&r, "one-sampler");
    assert!(names.iter().any(|n| n == "batch_size.png"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("sampler_change")),
        "{names:?}"
    );
    check_svg(&dir.join("batch_size.svg"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(!md.contains("sampler_change"), "{md}");
    assert!(md.contains("| method | b1 uniform | b4 uniform |"), "{md}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The study's grid (seven methods, batch 1, 4 and 32, two samplers) on two games:
/// the headline's small multiples and the change figure read cleanly.
#[test]
fn a_study_sized_grid_reads_cleanly() {
    // With the retrain's variant, whose name is the longest a legend has had.
    let methods = [
        "none",
        "weight_norm",
        "wn_mean_only_bn",
        "batch_norm",
        "batch_renorm",
        "layer_norm",
        "group_norm",
        "wn_mean_only_bn_init256",
    ];
    let mut runs = vec![];
    for (m, method) in methods.iter().enumerate() {
        for batch in [1usize, 4, 32] {
            for (s, sampler) in ["uniform", "sequential"].iter().enumerate() {
                let variant = format!("b{batch}-{sampler}-{method}");
                for (e, env) in ENVS.iter().enumerate() {
                    for seed in 1..=3u64 {
                        let level = (m + 1) as f64 * (batch as f64).log2() / (1 + s) as f64;
                        let noise = (seed as f64 - 2.0) * (m + 2) as f64;
                        let ret = level * (1 + 3 * e) as f64 + noise;
                        runs.push(run(env, &variant, seed, ret));
                    }
                }
            }
        }
    }
    let config = ReportConfig {
        baseline: Some("b32-uniform-none".into()),
        ..ReportConfig::default()
    };
    let loaded = Loaded {
        runs,
        ..Loaded::default()
    };
    let r = build(loaded, &config).unwrap();
    assert_eq!(r.sampler_changes.len(), 8 * 3);
    let (dir, _) = written(&r, "study-grid");
    for svg in [
        "batch_size.svg",
        "batch_size-minatar_breakout.svg",
        "sampler_change.svg",
        "aggregate.svg",
        "improvement.svg",
    ] {
        check_svg(&dir.join(svg));
    }
    if std::env::var_os("KEEP").is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    } else {
        eprintln!("{}", dir.display());
    }
}

/// Uniform and sequential at batch 32, 4 and 1, and `online` at batch 1 only: each
/// environment's figures are a row per batch size and a column per sampler (uniform,
/// sequential, online), with gaps where online did not run. One method's parameter norm
/// near 1e7 (weight norm's first-batch init), the others' near 100: the axis is
/// symmetric-log, with whole decades as ticks, so that the others do not lie on zero.
#[test]
fn settings_are_a_grid_and_a_wide_diagnostic_takes_a_symmetric_log_axis() {
    let mut runs = vec![];
    let settings = [
        (32, "uniform"),
        (32, "sequential"),
        (4, "uniform"),
        (4, "sequential"),
        (1, "uniform"),
        (1, "sequential"),
        (1, "online"),
    ];
    for (batch, sampler) in settings {
        for (method, norm) in [
            ("none", 80.0),
            ("layer_norm", 120.0),
            ("weight_norm", 1.4e7),
        ] {
            let variant = format!("b{batch}-{sampler}-{method}");
            for seed in 1..=3u64 {
                let mut r = run(ENVS[0], &variant, seed, seed as f64);
                let curve = vec![(1_000, norm + seed as f64), (2_000, norm * 1.1)];
                r.diagnostics.insert("param_norm/all".into(), curve);
                runs.push(r);
            }
        }
    }
    let (dir, _) = written(&report(runs), "settings-grid");
    let svg = dir.join("diagnostics-param_norm-all-minatar_breakout.svg");
    check_svg(&svg);
    let texts = texts_of(&svg);
    let at = |label: &str| {
        let found = texts.iter().find(|(t, _)| t == label);
        found
            .unwrap_or_else(|| panic!("no '{label}' in {texts:?}"))
            .1
    };
    // A title's center and top: titles are centered over their panels.
    let title = |setting: &str| {
        let b = at(&format!("minatar/breakout, {setting}"));
        ((b.0 + b.2) / 2.0, b.1)
    };
    let (u32_, s32) = (title("uniform, batch 32"), title("sequential, batch 32"));
    let (u1, s1, o1) = (
        title("uniform, batch 1"),
        title("sequential, batch 1"),
        title("online, batch 1"),
    );
    // Rows: batch 32 above batch 1; columns: uniform, sequential, online.
    assert!(u32_.1 < u1.1 && (u1.1 - s1.1).abs() < 1.0 && (u1.1 - o1.1).abs() < 1.0);
    assert!(u1.0 < s1.0 && s1.0 < o1.0, "{u1:?} {s1:?} {o1:?}");
    assert!((u32_.0 - u1.0).abs() < 1.0 && (s32.0 - s1.0).abs() < 1.0);
    // Batch 32 has no online panel: the row's third column is blank.
    assert!(!texts.iter().any(|(t, _)| t.contains("online, batch 32")));
    // The aggregate figure's rows: samplers from the least correlated to the most
    // (not by name: online, sequential, uniform), larger batches first within one.
    let aggregate = texts_of(&dir.join("aggregate.svg"));
    let top = |setting: &str| {
        let title = format!("IQM, {setting}");
        let found = aggregate.iter().find(|(t, _)| *t == title);
        found.unwrap_or_else(|| panic!("no '{title}'")).1 .1
    };
    let rows = settings.map(|(b, s)| top(&format!("{s}, batch {b}")));
    let order = [0, 2, 4, 1, 3, 5, 6].map(|i| rows[i]);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{rows:?}");
    // The axis: symmetric-log, ticks on every other decade (80 to 1.4e7 spans six).
    assert!(texts.iter().any(|(t, _)| t == "parameter norm (symlog)"));
    for tick in ["100", "10k", "1M"] {
        at(tick);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The labels of the SVG at `path` and their boxes.
fn texts_of(path: &std::path::Path) -> Vec<(String, Box2)> {
    texts(&std::fs::read_to_string(path).unwrap())
}

/// Two methods with the same returns and a third far below: the leader's sentence
/// names the one whose interval overlaps its own, not the one apart.
#[test]
fn a_leader_names_the_methods_it_is_not_told_from() {
    let firsts = [
        ("b4-uniform-layer_norm", 2.0),
        ("b4-uniform-group_norm", 1.9),
        ("b4-uniform-none", -20.0),
        ("b1-uniform-none", 0.0),
    ];
    let mut runs = vec![];
    for (variant, first) in firsts {
        seeds(&mut runs, variant, first);
    }
    let (dir, _) = written(&report(runs), "overlap");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let leaders = leaders(&md);
    let b4 = leaders.split("; ").find(|l| l.contains("batch 4")).unwrap();
    assert!(
        b4.starts_with("layer_norm at uniform, batch 4 ("),
        "{leaders}"
    );
    assert!(
        b4.ends_with(", its interval overlapping group_norm's"),
        "{leaders}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ranges derived from the runs (no `[report] scores`): report.md gives them as a TOML
/// block that reads back as the same numbers, and a report configured with it
/// normalizes every score exactly as the one that derived them.
#[test]
fn derived_ranges_are_written_to_be_fixed_in_the_config() {
    let mut runs = vec![];
    seeds(&mut runs, "b4-uniform-none", 1.0 / 3.0);
    seeds(&mut runs, "b4-uniform-layer_norm", 2.0 / 7.0);
    let loaded = || Loaded {
        runs: runs.clone(),
        ..Loaded::default()
    };
    let derived = build(loaded(), &ReportConfig::default()).unwrap();
    let (dir, _) = written(&derived, "fixed-ranges");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let block = md
        .split("```toml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let table: toml::Table = toml::from_str(block).unwrap();
    let config: ReportConfig = table["report"].clone().try_into().unwrap();
    assert_eq!(config.scores, derived.score_ranges);
    // Breakout's best mean (none's seeds, 1/3 + 0..3) is no short decimal: the list's
    // two decimals would have moved it.
    let breakout = config.scores["minatar/breakout"].reference;
    assert!((breakout - (1.0 / 3.0 + 1.5)).abs() < 1e-12);
    assert_ne!(format!("{breakout:.2}").parse::<f64>().unwrap(), breakout);
    let fixed = build(loaded(), &config).unwrap();
    let iqm = |r: &Report| -> Vec<(f64, f64, f64)> {
        let est = |a: &AggregateStats| (a.iqm.value, a.iqm.low, a.iqm.high);
        r.aggregate.iter().map(est).collect()
    };
    assert_eq!(iqm(&fixed), iqm(&derived));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An interval is the data's: leaving a method out of a report, which moves where the
/// others sit in it, leaves their intervals as they were.
#[test]
fn a_method_left_out_moves_no_other_interval() {
    let mut runs = vec![];
    seeds(&mut runs, "b4-uniform-batch_norm", 0.5);
    seeds(&mut runs, "b4-uniform-none", 1.0);
    seeds(&mut runs, "b4-uniform-layer_norm", 2.0);
    seeds(&mut runs, "b4-sequential-none", 0.0);
    seeds(&mut runs, "b4-sequential-layer_norm", 3.0);
    let all = report(runs.clone());
    runs.retain(|r| !r.variant.ends_with("batch_norm"));
    let fewer = report(runs);
    let of = |r: &Report, v: &str| {
        let a = r.aggregate.iter().find(|a| a.variant == v).unwrap();
        (
            a.iqm.value,
            a.iqm.low,
            a.iqm.high,
            a.median.low,
            a.median.high,
        )
    };
    for v in [
        "b4-uniform-none",
        "b4-uniform-layer_norm",
        "b4-sequential-none",
    ] {
        assert_eq!(of(&all, v), of(&fewer, v), "{v}");
    }
    // The runs come with their environments interleaved (`seeds`), unsorted: each
    // environment is still one stratum, so a variant counts its 8 runs, not 8 per
    // variant in the report (an environment listed once per variant had counted 40).
    assert!(
        all.aggregate.iter().all(|a| a.runs == 8),
        "{:?}",
        all.aggregate
    );
    let change = |r: &Report| {
        let c = r
            .sampler_changes
            .iter()
            .find(|c| c.method == "layer_norm")
            .unwrap();
        (c.change.low, c.change.high)
    };
    assert_eq!(change(&all), change(&fewer));
}

/// A method that has finished one of the two games: its cells are marked with the
/// games they cover, as not comparable with the cells over both; complete cells are not.
#[test]
fn a_cell_over_fewer_environments_is_marked() {
    let mut runs = vec![];
    for (sampler, first) in [("uniform", 1.0), ("sequential", 0.0)] {
        seeds(&mut runs, &format!("b4-{sampler}-none"), first);
        seeds(&mut runs, &format!("b4-{sampler}-layer_norm"), first + 5.0);
    }
    runs.retain(|r| !(r.variant == "b4-sequential-layer_norm" && r.env == ENVS[1]));
    let (dir, _) = written(&report(runs), "partial-cells");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let header = "| method | b4 uniform | b4 sequential |\n|---|---|---|\n";
    let table = md.find(header).unwrap_or_else(|| panic!("{md}")) + header.len();
    let rows: Vec<Vec<&str>> = md[table..]
        .lines()
        .take(2)
        .map(|row| row.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert_eq!(rows[0][0], "layer_norm", "{rows:?}");
    assert!(is_estimate(rows[0][1]), "{rows:?}");
    let (estimate, mark) = rows[0][2].split_once(" ‡").unwrap();
    assert!(is_estimate(estimate) && mark == "1/2", "{rows:?}");
    assert!(rows[1][1..].iter().all(|c| is_estimate(c)), "{rows:?}");
    assert!(md.contains("‡ k/2: over the k environments"), "{md}");
    // So is the leader of the setting, in the aggregate figure's caption.
    let leaders = leaders(&md);
    assert!(
        leaders.contains("layer_norm at sequential, batch 4 (") && leaders.contains("‡1/2)"),
        "{leaders}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One number, one interval: a cell's final IQM on one environment carries the same
/// interval in the per-environment table as in the headline's per-environment points.
#[test]
fn a_cells_interval_is_the_same_in_the_table_and_the_headline() {
    // Twelve irregular returns a cell: with few, evenly spaced ones every resampling
    // gives the same quantiles, and a test could not tell two intervals apart.
    let mut runs = vec![];
    let mut x = 7u64;
    for variant in ["b4-uniform-none", "b1-uniform-none"] {
        for env in ENVS {
            for seed in 1..=12 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                runs.push(run(env, variant, seed, (x >> 40) as f64 / 1e5));
            }
        }
    }
    let r = report(runs);
    let mut compared = 0;
    for s in &r.per_env {
        let axes = RunAxes::of(&s.variant, None, "none");
        let point = r.by_batch_size.iter().find(|p| {
            p.env.as_deref() == Some(s.env.as_str())
                && Some(p.batch_size) == axes.setting.batch_size
        });
        let p = point.unwrap().iqm;
        assert_eq!(
            (p.value, p.low, p.high),
            (s.final_iqm, s.final_ci.0, s.final_ci.1)
        );
        compared += 1;
    }
    assert_eq!(compared, 4);
}
