//! A comparison as a Slurm job array on a real Slurm (a one-node cluster started by
//! the test, see `slurm_cluster`): the array's report equals the same comparison run
//! locally, and a task signalled as before a preemption checkpoints, is requeued,
//! resumes and ends with the uninterrupted run's results.

mod common;
mod slurm_cluster;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use common::normrl;
use slurm_cluster::Cluster;

/// One cluster at a time: both tests would share this machine's cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn workdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-slurm-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small CartPole comparison: `norms` x 2 seeds of `steps` steps.
fn comparison(dir: &Path, norms: &str, steps: u64) -> PathBuf {
    common::cartpole_comparison(
        dir,
        "small",
        &format!(
            r#"seeds = 2
[set]
"run.total_steps" = {steps}
"replay.learning_starts" = 300
"eval.interval" = 1000
"eval.episodes" = 2
"checkpoint.interval" = 1000
"logging.interval" = 250
"logging.layer_stats_interval" = 1000
[axes]
norm = [{norms}]
[report]
baseline = "none"
"#
        ),
    )
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Submits with `normrl compare --slurm --submit` in `cluster`; the array's job id.
fn submit(cluster: &Cluster, config: &Path, runs: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "compare",
        "--config",
        arg(config),
        "--runs-dir",
        arg(runs),
        "--slurm",
        "--submit",
    ];
    args.extend(extra);
    let out = cluster
        .command(env!("CARGO_BIN_EXE_normrl"))
        .args(&args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "submission failed: {err}");
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        job.parse::<u64>().is_ok(),
        "sbatch printed no job id: {job:?} ({err})"
    );
    job
}

/// The runs' numbers, the wall-clock columns left out.
fn runs_table(report: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(report.join("runs.csv")).unwrap();
    text.lines()
        .map(|l| l.split(',').take(6).collect::<Vec<_>>().join(","))
        .collect()
}

/// Every task log of the array, joined.
fn task_logs(runs: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(runs.join("slurm")).unwrap().flatten() {
        if entry
            .path()
            .extension()
            .is_some_and(|e| e == "out" || e == "err")
        {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap());
        }
    }
    text
}

#[test]
fn a_slurm_array_reports_what_a_local_comparison_does() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = workdir("array");
    let config = comparison(&dir, r#""none", "weight_norm", "batch_norm""#, 2000);
    let cluster = Cluster::start("array", 16_917);
    let array_runs = dir.join("array");
    let job = submit(&cluster, &config, &array_runs, &["--runs-per-task", "2"]);
    let script = std::fs::read_to_string(array_runs.join("slurm/array.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --array=0-2\n"), "{script}");
    cluster.wait_for("the array to finish", Duration::from_secs(300), || {
        !cluster.queue().contains(&job)
    });
    let logs = task_logs(&array_runs);
    assert!(logs.contains("array task 2 of 3: 2 runs"), "{logs}");
    // Every run done, says status.
    let (code, out, err) = normrl(&["status", arg(&array_runs), "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    for (variant, counts) in status["variants"].as_object().unwrap() {
        assert_eq!(counts["done"], 2, "{variant}: {counts}\n{logs}");
    }
    let (code, _, err) = normrl(&["report", arg(&array_runs), "--baseline", "none"]);
    assert_eq!(code, 0, "{err}");
    // The same comparison here, without Slurm: the same numbers.
    let local_runs = dir.join("local");
    let (code, _, err) = normrl(&[
        "compare",
        "--config",
        arg(&config),
        "--runs-dir",
        arg(&local_runs),
        "--jobs",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    let (array, local) = (
        runs_table(&array_runs.join("report")),
        runs_table(&local_runs.join("report")),
    );
    assert_eq!(array.len(), 7, "{array:?}");
    assert_eq!(array, local);
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_preempted_task_checkpoints_is_requeued_and_resumes_exactly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = workdir("preempt");
    let config = comparison(&dir, r#""none""#, 30_000);
    let cluster = Cluster::start("preempt", 16_927);
    let runs = dir.join("array");
    let job = submit(&cluster, &config, &runs, &["--runs-per-task", "2"]);
    let task = format!("{job}_0");
    let run = runs.join("classic_cartpole/none/seed-1");
    cluster.wait_for("the first run to train", Duration::from_secs(120), || {
        run.join("checkpoints/latest").exists()
    });
    // What Slurm sends ahead of a time limit (--signal=B:USR1@120), sent now.
    let out = cluster.run("scancel", &["--batch", "--signal=USR1", &task]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster.wait_for("the task to be requeued", Duration::from_secs(60), || {
        task_logs(&runs).contains("requeued Slurm job")
    });
    assert!(
        !run.join("summary.json").exists(),
        "the run was stopped before its end"
    );
    // A requeued job waits (BeginTime) while its old credential is revoked: 10 s on
    // this cluster (cred_expire), then Slurm starts it again by itself.
    // (While it is requeued the job can drop out of squeue for a moment: its log says
    // when it is done.)
    cluster.wait_for(
        "the requeued task to finish",
        Duration::from_secs(300),
        || task_logs(&runs).contains("array task 0: done") && !cluster.queue().contains(&job),
    );
    let logs = task_logs(&runs);
    assert!(logs.contains("SIGUSR1 at step"), "{logs}");
    let results = |root: &Path| -> Vec<serde_json::Value> {
        ["seed-1", "seed-2"]
            .iter()
            .map(|s| {
                let path = root
                    .join("classic_cartpole/none")
                    .join(s)
                    .join("result.json");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|_| panic!("no {}\n{logs}", path.display()));
                serde_json::from_str::<serde_json::Value>(&text).unwrap()["summary"].clone()
            })
            .collect()
    };
    let local = dir.join("local");
    let (code, _, err) = normrl(&[
        "compare",
        "--config",
        arg(&config),
        "--runs-dir",
        arg(&local),
    ]);
    assert_eq!(code, 0, "{err}");
    for (a, b) in results(&runs).iter().zip(results(&local)) {
        for key in [
            "eval_curve",
            "train_curve",
            "diagnostics",
            "updates",
            "final_eval_return",
        ] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
}
