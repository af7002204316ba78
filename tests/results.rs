//! What runs leave behind for clusters: result files that merge by copying, the
//! checkpoints `checkpoint.keep` keeps, and the states `normrl status` reads (done,
//! running, failed, interrupted by a signal, not started).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::normrl;

fn setup(name: &str, keep: &str, steps: u64) -> (PathBuf, PathBuf) {
    let dir = common::fresh_dir(&format!("results-{name}"));
    let body = format!(
        r#"seeds = 2
[set]
"run.total_steps" = {steps}
"replay.learning_starts" = 200
"eval.interval" = 500
"eval.episodes" = 2
"checkpoint.interval" = 500
"checkpoint.keep" = "{keep}"
"logging.interval" = 250
[axes]
norm = ["none", "weight_norm"]
[report]
baseline = "none"
"#
    );
    let config = common::cartpole_comparison(&dir, "c", &body);
    (dir, config)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn checkpoints(run: &Path) -> usize {
    match std::fs::read_dir(run.join("checkpoints")) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("step-"))
            .count(),
        Err(_) => 0,
    }
}

#[test]
fn result_files_merge_by_copying_and_keep_says_which_checkpoints_stay() {
    for (keep, expected) in [("all", 4), ("last", 1), ("none", 0)] {
        let (dir, config) = setup(&format!("keep-{keep}"), keep, 2000);
        let runs = dir.join("runs");
        let (code, _, err) = normrl(&["compare", "--config", s(&config), "--runs-dir", s(&runs)]);
        assert_eq!(code, 0, "{err}");
        let run = runs.join("classic_cartpole/weight_norm/seed-1");
        // Checkpoints at 500, 1000, 1500 and the final one at 2000.
        assert_eq!(checkpoints(&run), expected, "checkpoint.keep = {keep}");
        assert!(run.join("result.json").exists() && run.join("summary.json").exists());
        if keep != "last" {
            let _ = std::fs::remove_dir_all(dir);
            continue;
        }
        // Only the result files, copied flat into numbered folders (as from many
        // machines): the same report.
        let merged = dir.join("merged");
        let mut k = 0;
        for variant in ["none", "weight_norm"] {
            for seed in ["seed-1", "seed-2"] {
                let from = runs
                    .join("classic_cartpole")
                    .join(variant)
                    .join(seed)
                    .join("result.json");
                let to = merged.join(format!("host-{k}"));
                std::fs::create_dir_all(&to).unwrap();
                std::fs::copy(from, to.join("result.json")).unwrap();
                k += 1;
            }
        }
        let (code, _, err) = normrl(&["report", s(&merged), "--baseline", "none"]);
        assert_eq!(code, 0, "{err}");
        let table = |report: &Path| -> String {
            let text = std::fs::read_to_string(report.join("runs.csv")).unwrap();
            // Everything but wall time and speed.
            text.lines()
                .map(|l| l.split(',').take(6).collect::<Vec<_>>().join(",") + "\n")
                .collect()
        };
        assert_eq!(table(&merged.join("report")), table(&runs.join("report")));
        // A method left out on request: named at the top, none of its runs counted; a
        // method with no run is an error that writes nothing.
        let out = dir.join("left-out");
        let args = ["report", s(&runs), "--out", s(&out), "--baseline", "none"];
        let (code, _, err) = normrl(&[&args[..], &["--leave-out", "weigth_norm"]].concat());
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--leave-out 'weigth_norm'") && err.contains("none, weight_norm"));
        assert!(!out.exists(), "nothing written");
        let (code, _, err) = normrl(&[&args[..], &["--leave-out", "weight_norm"]].concat());
        assert_eq!(code, 0, "{err}");
        let md = std::fs::read_to_string(out.join("report.md")).unwrap();
        let named = "Left out on request (`--leave-out`): **weight_norm**, with their 2 finished and 0 missing runs.";
        assert!(md.contains(named), "{md}");
        let csv = std::fs::read_to_string(out.join("runs.csv")).unwrap();
        assert!(
            !csv.contains("weight_norm") && csv.lines().count() == 3,
            "{csv}"
        );
        // Leaving out the best method keeps the normalization: the score ranges are
        // every run's, the left-out included.
        let json = |dir: &Path| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap()
        };
        let full = json(&runs.join("report"));
        let mean = |v: &serde_json::Value| v["final_mean"].as_f64().unwrap();
        let per_env = full["per_env"].as_array().unwrap();
        let best = per_env
            .iter()
            .max_by(|a, b| mean(a).total_cmp(&mean(b)))
            .unwrap();
        let best = best["variant"].as_str().unwrap();
        let out = dir.join("best-left-out");
        let (code, _, err) = normrl(&["report", s(&runs), "--out", s(&out), "--leave-out", best]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            json(&out)["score_ranges"],
            full["score_ranges"],
            "left out {best}"
        );
        let result: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("result.json")).unwrap())
                .unwrap();
        assert_eq!(result["variant"], "weight_norm");
        assert!(result["config"].as_str().unwrap().contains("weight_norm"));
        assert_eq!(result["normrl_version"], env!("CARGO_PKG_VERSION"));
        assert!(!result["host"].as_str().unwrap().is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `normrl status --json` of `runs`.
fn status(runs: &Path) -> serde_json::Value {
    let (code, out, err) = normrl(&["status", s(runs), "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn state_of<'a>(status: &'a serde_json::Value, dir: &str) -> &'a serde_json::Value {
    status["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["dir"] == dir)
        .unwrap_or_else(|| panic!("{dir} not in {status}"))
}

#[test]
fn a_signal_checkpoints_and_status_tells_each_state() {
    let (dir, config) = setup("status", "last", 200_000);
    let runs = dir.join("runs");
    // Task 0 (one run per task) as a Kubernetes Indexed Job names it: the first run,
    // stopped by SIGUSR1 once it trains.
    let child = Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args([
            "compare",
            "--config",
            s(&config),
            "--runs-dir",
            s(&runs),
            "--task",
            "auto",
        ])
        .env("JOB_COMPLETION_INDEX", "0")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child = common::Started(Some(child));
    let first = runs.join("classic_cartpole/none/seed-1");
    let start = Instant::now();
    let mut seen_running = false;
    while start.elapsed() < Duration::from_secs(60) && !seen_running {
        std::thread::sleep(Duration::from_millis(100));
        if first.join("heartbeat").exists() && first.join("checkpoints/latest").exists() {
            let st = status(&runs);
            let state = state_of(&st, "classic_cartpole/none/seed-1");
            seen_running = state["state"] == "running" && state["pid"] == child.id();
        }
    }
    // Signal the process this test started, by its id.
    let killed = Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(seen_running, "the run was never seen running: {err}");
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("SIGUSR1 at step"), "{err}");
    // A failed run leaves its error; the others have not started.
    let failed = runs.join("classic_cartpole/weight_norm/seed-2");
    std::fs::create_dir_all(&failed).unwrap();
    std::fs::write(failed.join("error.txt"), "cannot build\nthe Q-network\n").unwrap();
    let st = status(&runs);
    assert_eq!(
        state_of(&st, "classic_cartpole/none/seed-1")["state"],
        "interrupted"
    );
    let f = state_of(&st, "classic_cartpole/weight_norm/seed-2");
    assert_eq!(f["state"], "failed");
    assert_eq!(
        f["error"],
        serde_json::json!(["cannot build", "the Q-network"])
    );
    assert_eq!(st["variants"]["none"]["not_started"], 1);
    assert_eq!(st["variants"]["weight_norm"]["not_started"], 1);
    let (code, table, _) = normrl(&["status", s(&runs)]);
    assert_eq!(code, 0);
    assert!(table.contains("| none | 0 | 0 | 0 | 1 | 1 |"), "{table}");
    assert!(
        table.contains("failed: classic_cartpole/weight_norm/seed-2"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
