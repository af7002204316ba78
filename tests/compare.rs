//! A tiny comparison end to end: plan, parallel runs, report with CSV and plots, skip
//! on re-run, shards merged by `normrl report`.

use std::path::{Path, PathBuf};

mod common;

use common::{normrl, SHORT_RUNS};

/// A tiny comparison in a fresh folder named after `name`, its config changed by
/// `edits` ([`rewrite`]).
fn setup(name: &str, edits: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("normrl-compare-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let body = format!(
        r#"seeds = 2
[set]
"run.total_steps" = 1500
{SHORT_RUNS}"logging.layer_stats_interval" = 500
[axes]
norm = ["none", "weight_norm"]
[report]
baseline = "none"
thresholds = {{ "classic/cartpole" = 30.0 }}
"#
    );
    let config = common::cartpole_comparison(&dir, "tiny", &body);
    rewrite(&config, edits);
    (dir, config)
}

/// Rewrites the comparison `config`, each `(from, to)` of `edits` in turn.
fn rewrite(config: &Path, edits: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(config).unwrap();
    for (from, to) in edits {
        text = text.replace(from, to);
    }
    std::fs::write(config, text).unwrap();
}

/// `normrl compare --config CONFIG --runs-dir RUNS`.
/// `normrl compare` of `config` into `runs`, with the `extra` flags.
fn compare_args<'a>(config: &'a Path, runs: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let (config, runs) = (config.to_str().unwrap(), runs.to_str().unwrap());
    let mut args = vec!["compare", "--config", config, "--runs-dir", runs];
    args.extend(extra);
    args
}

/// `normrl args` is refused (exit status 2), saying `needle`.
fn assert_refused(args: &[&str], needle: &str) {
    let (code, _, err) = normrl(args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(needle), "{err}");
}

fn csv_rows(path: &Path) -> usize {
    std::fs::read_to_string(path).unwrap().lines().count() - 1
}

/// Every table and chart of a CartPole report, none nearly empty, and steps on the
/// x axes written 1.2k rather than 1200.0.
fn assert_report_files(report: &Path) {
    for file in [
        "report.md",
        "report.json",
        "runs.csv",
        "summary.csv",
        "curves-classic_cartpole.png",
        "curves-classic_cartpole.svg",
        "aggregate.png",
        "aggregate.svg",
        "improvement.svg",
        "performance_profile.png",
        "performance_profile.svg",
        "train-curves-classic_cartpole.png",
        "diagnostics-dormant_tau0-all-classic_cartpole.png",
        "diagnostics-dormant_tau0_1-all-classic_cartpole.png",
        "diagnostics-effective_rank-classic_cartpole.svg",
        "diagnostics-param_norm-all-classic_cartpole.svg",
        "diagnostics-effective_step-all-classic_cartpole.svg",
        "diagnostics-q_overestimation-classic_cartpole.svg",
    ] {
        let meta =
            std::fs::metadata(report.join(file)).unwrap_or_else(|_| panic!("missing {file}"));
        assert!(meta.len() > 100, "{file} is nearly empty");
    }
    // Steps read as 1.2k, not 1200.0: every x label of 1,000 or more has its unit.
    let svg = std::fs::read_to_string(report.join("curves-classic_cartpole.svg")).unwrap();
    let labels: Vec<&str> = svg
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('<'))
        .collect();
    assert!(labels.iter().any(|l| l.ends_with('k')), "{labels:?}");
    assert!(
        !labels
            .iter()
            .any(|l| l.parse::<f64>().is_ok_and(|v| v >= 1000.0)),
        "{labels:?}"
    );
}

#[test]
fn tiny_comparison_reports_and_skips_finished_runs() {
    let (dir, config) = setup("full", &[]);
    let runs = dir.join("runs");
    let args = compare_args(&config, &runs, &["--jobs", "2"]);
    let (code, out, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("4 runs (1 environments x 2 variants x 2 seeds)"),
        "{err}"
    );
    assert!(
        out.contains("| classic/cartpole | weight_norm | 2 |"),
        "{out}"
    );
    let report = runs.join("report");
    assert_report_files(&report);
    assert_eq!(csv_rows(&report.join("runs.csv")), 4);
    assert_eq!(csv_rows(&report.join("summary.csv")), 2);
    let png = std::fs::read(report.join("aggregate.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.join("report.json")).unwrap()).unwrap();
    let wn = json["aggregate"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["variant"] == "weight_norm")
        .unwrap();
    let p = &wn["improvement"];
    let [value, low, high] = ["value", "low", "high"].map(|k| p[k].as_f64().unwrap());
    assert!(
        (0.0..=1.0).contains(&value) && low <= value && value <= high,
        "{p}"
    );
    assert_eq!(wn["method"], "weight_norm");
    assert_eq!(wn["setting"]["batch_size"], 64); // CartPole's config

    // Re-running skips every finished run.
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("4 runs were already finished and skipped"),
        "{err}"
    );
    regroup_once(&args, &runs.join("plan.json"));
    goes_on_from_its_archive(&config, &runs, &dir.join("fresh"));
    let _ = std::fs::remove_dir_all(dir);
}

/// The finished runs packed as a study's archive (`scripts/pack-results.py`: each
/// result.json alone, its training curve binned) and unpacked on a "new machine":
/// `status` counts them done, `compare` skips them all, and the report's final returns
/// are the originals'.
fn goes_on_from_its_archive(config: &Path, runs: &Path, fresh: &Path) {
    let archive = fresh.with_extension("tar.xz");
    let packed = std::process::Command::new("python3")
        .arg("scripts/pack-results.py")
        .args([runs, &archive, Path::new("--bin=100")])
        .output()
        .unwrap();
    assert!(packed.status.success(), "{packed:?}");
    std::fs::create_dir_all(fresh).unwrap();
    let unpacked = std::process::Command::new("tar")
        .arg("-xJf")
        .args([&archive, Path::new("-C"), fresh])
        .status()
        .unwrap();
    assert!(unpacked.success());
    let run = fresh.join("classic_cartpole/weight_norm/seed-2");
    let files: Vec<_> = std::fs::read_dir(&run).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "only result.json in {}", run.display());
    let (code, out, err) = normrl(&["status", fresh.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["variants"]["weight_norm"]["done"], 2, "{status}");
    let (code, _, err) = normrl(&compare_args(config, fresh, &[]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("4 runs were already finished and skipped"),
        "{err}"
    );
    let finals = |report: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(report.join("runs.csv")).unwrap();
        text.lines()
            .map(|l| l.split(',').take(6).collect::<Vec<_>>().join(","))
            .collect()
    };
    assert_eq!(finals(&fresh.join("report")), finals(&runs.join("report")));
    // A dry run of a study that goes on prices only the runs left.
    let dry = |config: &Path| normrl(&compare_args(config, fresh, &["--dry-run"]));
    let (code, _, err) = dry(config);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("all 4 of these runs have finished"), "{err}");
    // The throughput per environment and batch size: with one environment, the same
    // rates as the whole plan's.
    let overall = err.split("steps/s with updates: ").nth(1).unwrap();
    let overall = overall.split(')').next().unwrap();
    let table = "steps/s with updates, by environment and batch size:\n  classic/cartpole: ";
    let per_env = err.split(table).nth(1).unwrap_or_else(|| panic!("{err}"));
    assert_eq!(per_env.lines().next().unwrap(), overall, "{err}");
    std::fs::remove_dir_all(&run).unwrap();
    let (code, _, err) = dry(config);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("3 of these 4 runs have finished; the 1 left: comparison"),
        "{err}"
    );
    assert!(err.contains("left: comparison 'tiny': 1 runs ("), "{err}");
}

/// A plan only run here may be grouped into array tasks as asked; once an array of it
/// is written, its grouping is fixed.
fn regroup_once(local: &[&str], plan: &Path) {
    let with = |extra: &[&str]| -> (i32, String) {
        let mut args: Vec<&str> = local[..local.len() - 2].to_vec();
        args.extend(extra);
        let (code, out, err) = normrl(&args);
        (code, out + &err)
    };
    // A task index is checked against the grouping asked for (2 tasks of 2 runs),
    // before the plan is touched.
    let before = std::fs::read_to_string(plan).unwrap();
    let (code, text) = with(&["--task", "2", "--runs-per-task", "2"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("the plan has tasks 0 to 1"), "{text}");
    assert_eq!(std::fs::read_to_string(plan).unwrap(), before);
    let (code, text) = with(&["--slurm", "--runs-per-task", "2"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("4 runs in 2 array tasks"), "{text}");
    let (code, text) = with(&["--slurm", "--runs-per-task", "3"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("groups 2 runs per task, not 3"), "{text}");
}

#[test]
fn shards_split_the_grid_and_report_merges_them() {
    let (dir, config) = setup("shards", &[]);
    for shard in ["0/2", "1/2"] {
        let runs = dir.join(format!("shard-{}", &shard[..1]));
        let (code, _, err) = normrl(&compare_args(&config, &runs, &["--shard", shard]));
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("2 of 4 runs"), "{err}");
    }
    let out_dir = dir.join("merged");
    let (code, out, err) = normrl(&[
        "report",
        dir.join("shard-0").to_str().unwrap(),
        dir.join("shard-1").to_str().unwrap(),
        "--baseline",
        "none",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(csv_rows(&out_dir.join("runs.csv")), 4);
    assert!(
        out.contains("P(improvement over none, same setting)"),
        "{out}"
    );
    merged_copies_count_once(&dir, &out_dir);
    let shard = dir.join("shard-0");
    assert_refused(
        &["report", shard.to_str().unwrap(), "--baseline", "nope"],
        "baseline 'nope' is not among the variants",
    );
    let config = config.to_str().unwrap();
    assert_refused(
        &["compare", "--config", config, "--shard", "3/2", "--dry-run"],
        "0 <= i < n",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A shard merged twice (a copy beside the original, and a directory given twice)
/// counts its runs once and says how many copies it dropped; a copy whose result
/// differs is refused, naming both directories.
fn merged_copies_count_once(dir: &Path, out_dir: &Path) {
    let copy = dir.join("shard-0-copy");
    let status = std::process::Command::new("cp")
        .args([
            "-r",
            dir.join("shard-0").to_str().unwrap(),
            copy.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let shard = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let (s0, s1, c) = (shard("shard-0"), shard("shard-1"), shard("shard-0-copy"));
    let out = out_dir.to_str().unwrap();
    let args = [
        "report",
        &s0,
        &s1,
        &c,
        &s1,
        "--baseline",
        "none",
        "--out",
        out,
    ];
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(csv_rows(&out_dir.join("runs.csv")), 4);
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains("4 runs were found more than once"), "{md}");
    assert!(md.contains("| none | 2 |"), "n per setting: {md}");
    // The copy of one run now says another return.
    let run = copy.join("classic_cartpole/none/seed-1/result.json");
    let text = std::fs::read_to_string(&run).unwrap();
    let mut result: serde_json::Value = serde_json::from_str(&text).unwrap();
    let changed = result["summary"]["final_eval_return"].as_f64().unwrap() + 1.0;
    result["summary"]["final_eval_return"] = changed.into();
    std::fs::write(&run, result.to_string()).unwrap();
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("hold the same run") && err.contains("with different results"),
        "{err}"
    );
    assert!(
        err.contains("shard-0-copy/classic_cartpole/none/seed-1"),
        "{err}"
    );
    std::fs::remove_dir_all(copy).unwrap();
}

/// Two shards of one grid started at the same moment on one runs directory (two
/// machines sharing a disk): both settle on the one plan and run their share, however
/// their writes of `plan.json` interleave (the interleaving itself is tested in
/// `study::plan`). Tried three times, each on a fresh directory.
#[test]
fn two_shards_started_together_both_run_their_share() {
    let (dir, config) = setup("race", &[("seeds = 2", "seeds = 1")]);
    for attempt in 0..3 {
        let runs = dir.join(format!("runs-{attempt}"));
        let started: Vec<common::Started> = ["0/2", "1/2"]
            .iter()
            .map(|shard| {
                let child = std::process::Command::new(env!("CARGO_BIN_EXE_normrl"))
                    .args(compare_args(&config, &runs, &["--shard", shard]))
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                common::Started(Some(child))
            })
            .collect();
        for process in started {
            let out = process.wait();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{err}");
            assert!(err.contains("1 of 2 runs"), "{err}");
        }
        for variant in ["none", "weight_norm"] {
            let run = runs.join(format!("classic_cartpole/{variant}/seed-1"));
            assert!(run.join("result.json").exists(), "{}", run.display());
        }
        let left: Vec<String> = std::fs::read_dir(&runs)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("tmp"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Finished runs whose results were damaged afterwards (truncated to nothing, as a
/// crashed file server leaves them): `compare` rewrites a damaged file from the other
/// one, and trains a run with neither readable again (the same run, as its seed
/// fixes it), saying so; `report` names a run it cannot count at the top of
/// `report.md` and draws the rest.
#[test]
fn damaged_results_are_repaired_or_retrained_and_reports_name_missing_runs() {
    let (dir, config) = setup("damaged", &[]);
    let runs = dir.join("runs");
    let args = compare_args(&config, &runs, &["--jobs", "2"]);
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    let run =
        |variant: &str, seed: u32| runs.join(format!("classic_cartpole/{variant}/seed-{seed}"));
    let final_return = |dir: &Path| -> f64 {
        let text = std::fs::read_to_string(dir.join("result.json")).unwrap();
        let result: serde_json::Value = serde_json::from_str(&text).unwrap();
        result["summary"]["final_eval_return"].as_f64().unwrap()
    };
    let before = final_return(&run("weight_norm", 2));
    let summary_before = std::fs::read_to_string(run("none", 2).join("summary.json")).unwrap();
    std::fs::write(run("none", 1).join("result.json"), "").unwrap();
    std::fs::write(
        run("none", 2).join("summary.json"),
        "{\"env\": \"classic/ca",
    )
    .unwrap();
    std::fs::write(run("weight_norm", 2).join("result.json"), "").unwrap();
    std::fs::write(run("weight_norm", 2).join("summary.json"), "").unwrap();

    // The report alone counts what it can read and names the rest.
    let (code, _, err) = normrl(&["report", runs.to_str().unwrap(), "--baseline", "none"]);
    assert_eq!(code, 0, "{err}");
    let md = std::fs::read_to_string(runs.join("report/report.md")).unwrap();
    let head: String = md.lines().take(8).collect::<Vec<_>>().join("\n");
    assert!(
        head.contains("**1 run is missing from this report**"),
        "{md}"
    );
    assert!(
        head.contains("weight_norm/seed-2/result.json is not a run result"),
        "{head}"
    );
    assert_eq!(csv_rows(&runs.join("report/runs.csv")), 3);

    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("none/seed-1: finished;"), "{err}");
    assert!(
        err.contains("rewritten from its summary.json and config.toml"),
        "{err}"
    );
    assert!(err.contains("rewritten from its result.json"), "{err}");
    assert!(
        err.contains("moved to") && err.contains("trained again"),
        "{err}"
    );
    assert!(
        err.contains("3 runs were already finished and skipped"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(run("none", 2).join("summary.json")).unwrap(),
        summary_before
    );
    assert_eq!(final_return(&run("weight_norm", 2)), before);
    let md = std::fs::read_to_string(runs.join("report/report.md")).unwrap();
    assert!(!md.contains("missing from this report"), "{md}");
    assert_eq!(csv_rows(&runs.join("report/runs.csv")), 4);
    let aside = std::fs::read_dir(runs.join("classic_cartpole/weight_norm"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("seed-2.damaged-")
        })
        .count();
    assert_eq!(aside, 1, "the damaged run is kept aside");

    // A planned run that no directory holds is named too.
    std::fs::remove_dir_all(run("none", 2)).unwrap();
    let (code, _, err) = normrl(&["report", runs.to_str().unwrap(), "--baseline", "none"]);
    assert_eq!(code, 0, "{err}");
    let md = std::fs::read_to_string(runs.join("report/report.md")).unwrap();
    assert!(md.contains("**1 run is missing from this report**"), "{md}");
    assert!(md.contains("none/seed-2: not finished"), "{md}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `population = "seeds"`: each variant's seeds train as one population (SVB's too),
/// into the run directories single runs use. A second invocation skips them all.
#[test]
fn a_comparison_trains_its_seeds_as_populations() {
    let (dir, config) = setup(
        "population",
        &[
            ("seeds = 2", "seeds = 3\npopulation = \"seeds\""),
            (
                r#"norm = ["none", "weight_norm"]"#,
                r#"norm = ["none", "svb"]"#,
            ),
        ],
    );
    let runs = dir.join("runs");
    let args = compare_args(&config, &runs, &[]);
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("as 2 populations of up to 3 runs"), "{err}");
    for variant in ["none", "svb"] {
        for seed in 1..=3 {
            let run = runs.join(format!("classic_cartpole/{variant}/seed-{seed}"));
            let result: serde_json::Value =
                serde_json::from_slice(&std::fs::read(run.join("result.json")).unwrap()).unwrap();
            assert_eq!(result["variant"], variant, "{}", run.display());
            assert_eq!(result["summary"]["steps"], 1500, "{}", run.display());
            // Which products' rounding the run took, so that it can be retrained bit
            // for bit on a CPU of the same family.
            let kernels = normrl_agents::product_kernels();
            assert_eq!(result["product_kernels"], kernels, "{}", run.display());
        }
    }
    assert_eq!(csv_rows(&runs.join("report/runs.csv")), 6);
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("6 runs were already finished and skipped"),
        "{err}"
    );
    // A grouping that is neither "seeds" nor a size is refused.
    rewrite(
        &config,
        &[("population = \"seeds\"", "population = \"variants\"")],
    );
    assert_refused(&args, "population = 'variants' must be");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--dry-run --measure`: the study's first population is trained for a few hundred
/// steps with updates in a scratch folder, its rate is stated and the study's time
/// estimated by it (steps over rate); nothing is left behind and no run is created.
/// Then a grid of two batch sizes, each priced at its own rate.
#[test]
fn a_dry_run_measures_the_studys_rate_on_its_device() {
    let (dir, config) = setup(
        "measure",
        &[("seeds = 2", "seeds = 2\npopulation = \"seeds\"")],
    );
    let runs = dir.join("runs");
    let (code, _, err) = normrl(&compare_args(&config, &runs, &["--dry-run", "--measure"]));
    assert_eq!(code, 0, "{err}");
    let measured = err
        .split("measured on ")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    let rate: f64 = common::number_after(measured, ": ", ' ');
    assert!(rate > 10.0, "{err}");
    assert!(
        measured.contains("a population of 2, 300 steps with updates"),
        "{err}"
    );
    // The study's total steps over that rate, in the estimate's own units.
    let steps: f64 = err
        .split(" environment steps")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    let minutes = (steps / rate / 60.0).round();
    assert!(
        measured.contains(&format!("take about {minutes:.0} minutes there")),
        "{steps} steps at {rate}/s: {err}"
    );
    assert!(!runs.exists(), "a dry run created {}", runs.display());
    each_batch_size_is_measured();
    let scratch = std::env::temp_dir().join("normrl-measure-");
    let left = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .any(|e| {
            e.path()
                .to_string_lossy()
                .starts_with(scratch.to_string_lossy().as_ref())
        });
    let _ = std::fs::remove_dir_all(dir);
    assert!(!left, "the measurement's scratch folder was left behind");
}

/// A grid of two batch sizes is priced at each one's rate: the first population of each
/// trained, both rates stated, and the study's time the sum of each run's steps over
/// its batch size's rate (one rate for all would be off by their ratio).
fn each_batch_size_is_measured() {
    let (dir, config) = setup(
        "measure-batches",
        &[
            ("seeds = 2", "seeds = 2\npopulation = \"seeds\""),
            ("[axes]", "[axes]\nbatch_size = [4, 64]"),
            ("baseline = \"none\"", "baseline = \"b4-none\""),
        ],
    );
    let runs = dir.join("runs");
    let long = ["--dry-run", "--set", "run.total_steps=20000000"];
    let (code, _, err) = normrl(&compare_args(&config, &runs, &long));
    assert_eq!(code, 0, "{err}");
    let measured = err
        .split("measured on ")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    let b4: f64 = common::number_after(measured, "batch 4 ", ',');
    let b64: f64 = common::number_after(measured, "batch 64 ", ' ');
    assert!(
        measured.contains("(the first population of each batch size, of 2, 300 steps"),
        "{err}"
    );
    // 8 runs of 2e7 steps, half of them at each batch size.
    let hours = 4.0 * 2e7 * (1.0 / b4 + 1.0 / b64) / 3600.0;
    let stated: f64 = common::number_after(measured, "take about ", ' ');
    assert!(
        (stated - hours).abs() <= 0.05 + hours * 1e-3,
        "{hours} h: {err}"
    );
    assert!(b4 > b64, "batch 64 steps slower than batch 4: {err}");
    // The pieces it timed say nothing of their own: the rates stated are the study's.
    assert!(!err.contains("population of 2 on"), "{err}");
    assert!(!runs.exists(), "a dry run created {}", runs.display());
    let _ = std::fs::remove_dir_all(dir);
}

/// A variant that sets a key an axis also sets would train its own value under a label
/// naming the axis' value: refused before anything runs, naming both and the ways out.
#[test]
fn a_variant_setting_an_axis_key_is_refused() {
    let variant = "[[variants]]\nname = \"wn-g10\"\nset = { \"norm.kind\" = \"weight_norm\", \"norm.g_lr_scale\" = 10.0 }\n";
    let edits = [
        ("[report]", format!("{variant}[report]")),
        ("baseline = \"none\"", "baseline = \"none-wn-g10\"".into()),
    ];
    let edits: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let (dir, config) = setup("variant-axis", &edits);
    let runs = dir.join("runs");
    for extra in [&[][..], &["--dry-run"]] {
        let (code, out, err) = normrl(&compare_args(&config, &runs, extra));
        assert_eq!(code, 2, "{out}{err}");
        for needle in [
            "variant 'wn-g10' sets 'norm.kind'",
            "the axis 'norm' also sets",
            "drop the axis 'norm'",
            "set only keys that no axis sets",
        ] {
            assert!(err.contains(needle), "lacks {needle:?}: {err}");
        }
        assert!(out.is_empty() && !runs.exists(), "{out}");
    }
    // Setting only what the axis does not is the other way out: every run then trains
    // the axis' method, which the plan shows beside each run.
    rewrite(&config, &[("\"norm.kind\" = \"weight_norm\", ", "")]);
    let (code, out, err) = normrl(&compare_args(&config, &runs, &["--dry-run"]));
    assert_eq!(code, 0, "{err}");
    let methods: Vec<&str> = out.lines().filter_map(|l| l.split('\t').nth(1)).collect();
    assert_eq!(
        methods,
        ["none", "none", "weight_norm", "weight_norm"],
        "{out}"
    );
    // A method preset sets the normalization (and the loss, the target network...):
    // beside an axis over the method it is refused the same way.
    rewrite(
        &config,
        &[("\"norm.g_lr_scale\" = 10.0", "preset = \"xqc\"")],
    );
    let (code, out, err) = normrl(&compare_args(&config, &runs, &["--dry-run"]));
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("variant 'wn-g10' sets 'preset', which the axis 'norm' also sets"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The `toml` blocks of a markdown file, in order.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = vec![];
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        let fence = line.trim_start();
        match current.as_mut() {
            None if fence.starts_with("```toml") => current = Some(String::new()),
            Some(_) if fence.starts_with("```") => blocks.extend(current.take()),
            Some(block) => block.push_str(&format!("{}\n", line.trim_start())),
            None => {}
        }
    }
    blocks
}

/// The `normrl compare` commands of a markdown file's `sh` blocks, continuation lines
/// joined and comments dropped, each as its arguments.
fn compare_commands(markdown: &str) -> Vec<Vec<String>> {
    let mut commands = vec![];
    let mut pending = String::new();
    for line in markdown.lines() {
        let line = line.split(" #").next().unwrap().trim();
        pending.push_str(line.trim_end_matches('\\'));
        pending.push(' ');
        if line.ends_with('\\') {
            continue;
        }
        let words: Vec<String> = pending.split_whitespace().map(str::to_string).collect();
        pending.clear();
        if let Some(at) = words.iter().position(|w| w.ends_with("normrl")) {
            if words.get(at + 1).is_some_and(|w| w == "compare") {
                commands.push(words[at + 1..].to_vec());
            }
        }
    }
    commands
}

/// `text`, written as `dir/compare/<name>.toml`, dry-runs to `count` runs, `run` among
/// them, and creates nothing.
fn assert_plans(dir: &Path, name: &str, text: &str, count: usize, run: &str) {
    let config = dir.join(format!("compare/{name}.toml"));
    std::fs::write(&config, text).unwrap();
    let runs = dir.join("runs");
    let (code, out, err) = normrl(&compare_args(&config, &runs, &["--dry-run"]));
    assert_eq!(code, 0, "{name}: {err}");
    assert_eq!(out.lines().count(), count, "{name}: {out}");
    assert!(out.contains(run), "{name}: {out}");
    assert!(!runs.exists());
}

/// Every comparison the docs show runs as written: `docs/config.md`'s example study
/// (with `docs/cluster.md`'s `[slurm]` table) plans the runs its text says, and each
/// `normrl compare` command of the two pages, as a dry run, shows the runs it would
/// run: a shard only its share. A dry run whose reader closes the pipe early ends
/// quietly.
#[test]
fn the_docs_comparisons_run_as_written() {
    let dir = common::fresh_dir("docs-examples");
    let config_md = std::fs::read_to_string("docs/config.md").unwrap();
    let cluster_md = std::fs::read_to_string("docs/cluster.md").unwrap();
    // The example's `base` is relative to its file, as if it sat in configs/compare/.
    std::fs::create_dir_all(dir.join("compare")).unwrap();
    std::fs::create_dir_all(dir.join("minatar")).unwrap();
    std::fs::copy(
        "configs/minatar/breakout.toml",
        dir.join("minatar/breakout.toml"),
    )
    .unwrap();
    let studies: Vec<String> = toml_blocks(&config_md)
        .into_iter()
        .filter(|b| b.contains("[axes]") && !b.starts_with("extends"))
        .collect();
    assert_eq!(studies.len(), 1, "docs/config.md's example study");
    // The example of `extends`, beside the study it extends: 5 games x 5 seeds of one
    // method at batch 1 under the online sampler.
    let extension = toml_blocks(&config_md)
        .into_iter()
        .find(|b| b.starts_with("extends"))
        .expect("docs/config.md's example of extends");
    std::fs::copy(
        "configs/compare/minatar-study-v1.toml",
        dir.join("compare/minatar-study-v1.toml"),
    )
    .unwrap();
    let run = "minatar_seaquest/b1-online-layer_norm/seed-5\tlayer_norm";
    assert_plans(&dir, "extension", &extension, 25, run);
    let slurm = toml_blocks(&cluster_md)
        .into_iter()
        .find(|b| b.starts_with("[slurm]"))
        .expect("docs/cluster.md's [slurm] table");
    let with_slurm = studies[0].split("[slurm]").next().unwrap().to_string() + &slurm;
    for (name, text) in [("example", &studies[0]), ("example-slurm", &with_slurm)] {
        // 2 games x 3 batch sizes x 2 samplers x 3 variants x 5 seeds.
        let run = "minatar_breakout/b1-sequential-wn-g10/seed-5\tweight_norm";
        assert_plans(&dir, name, text, 180, run);
    }

    let mut tried = 0;
    for args in compare_commands(&config_md)
        .into_iter()
        .chain(compare_commands(&cluster_md))
    {
        // A GPU's rate needs a GPU, and an array's script is written, not dry-run.
        if args.iter().any(|a| a.contains("cuda") || a == "--slurm") {
            continue;
        }
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        if !args.contains(&"--dry-run") {
            args.push("--dry-run");
        }
        let (code, out, err) = normrl(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let shard = args.iter().position(|a| *a == "--shard");
        let expected = match shard.map(|i| args[i + 1]) {
            // `i/n`: every n-th run from the i-th.
            Some(spec) => {
                let (i, n) = spec.split_once('/').unwrap();
                let (i, n): (usize, usize) = (i.parse().unwrap(), n.parse().unwrap());
                (1800 - i).div_ceil(n)
            }
            None if args.contains(&"configs/compare/minatar-small-batch.toml") => 1800,
            None => out.lines().count(),
        };
        assert_eq!(out.lines().count(), expected, "{args:?}");
        assert!(out.lines().all(|l| l.split('\t').count() == 2), "{args:?}");
        tried += 1;
    }
    assert!(tried >= 4, "the docs' compare commands: {tried} tried");

    // `compare --dry-run | head -1`.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args([
            "compare",
            "--config",
            "configs/compare/minatar-small-batch.toml",
            "--dry-run",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(first.contains("seed-1"), "{first}");
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
