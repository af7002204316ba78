//! The faults a cluster user meets, each with real processes and real files: Ctrl-C
//! keeps the work, one process writes a run, a damaged checkpoint is caught and
//! fallen back from, a full disk names itself; after each, the resumed run ends
//! equal to an uninterrupted one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{normrl, Started};
use normrl::config::TrainConfig;
use normrl::train::Trainer;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-faults-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--set` arguments of a CartPole run of `steps` with a checkpoint every `every`.
fn sets(steps: u64, every: u64, extra: &[&str]) -> Vec<String> {
    let mut keys = vec![
        format!("run.total_steps={steps}"),
        format!("checkpoint.interval={every}"),
        "eval.interval=2000".into(),
        "eval.episodes=2".into(),
        "logging.progress=false".into(),
    ];
    keys.extend(extra.iter().map(|s| s.to_string()));
    keys.into_iter()
        .flat_map(|k| ["--set".to_string(), k])
        .collect()
}

/// `normrl train --config configs/cartpole.toml <sets> --run-dir <dir>`.
fn train_args(sets: &[String], dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["train", "--config", "configs/cartpole.toml"]
        .map(String::from)
        .to_vec();
    args.extend(sets.iter().cloned());
    args.extend(["--run-dir".into(), dir.display().to_string()]);
    args
}

fn run(args: &[String]) -> (i32, String, String) {
    normrl(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn resume(dir: &Path) -> (i32, String, String) {
    normrl(&["train", "--resume", dir.to_str().unwrap()])
}

/// The two runs' summaries are equal in every field but timing.
fn assert_same_run(a: &Path, b: &Path) {
    let read = |d: &Path| -> serde_json::Map<String, serde_json::Value> {
        let text = std::fs::read_to_string(d.join("summary.json")).unwrap();
        let mut map: serde_json::Map<_, _> = serde_json::from_str(&text).unwrap();
        for timing in ["wall_seconds", "steps_per_second", "diagnostics_seconds"] {
            map.remove(timing);
        }
        map
    };
    let (a_sum, b_sum) = (read(a), read(b));
    assert!(a_sum.contains_key("eval_curve") && a_sum.contains_key("diagnostics"));
    assert_eq!(a_sum, b_sum, "{} differs from {}", b.display(), a.display());
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "waited for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// While a run trains, a second `train --resume` and a second fresh `train` of its
/// directory are refused at once, naming the holder; Ctrl-C then writes a checkpoint
/// at that step, exits 130 with the command that resumes, and the resume ends equal
/// to the uninterrupted run.
#[test]
fn ctrl_c_keeps_the_work_and_a_second_writer_is_refused() {
    let root = temp("ctrl-c");
    let sets = sets(40_000, 5_000, &[]);
    let (reference, dir) = (root.join("reference"), root.join("run"));
    let (code, _, err) = run(&train_args(&sets, &reference));
    assert_eq!(code, 0, "{err}");

    let child = Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args(train_args(&sets, &dir))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Started(Some(child));
    let pid = started.id();
    wait_for("the first checkpoint", || {
        !normrl::checkpoint::complete(&dir).is_empty()
    });
    let holder = normrl::storage::lock::holder(&dir).expect("the run holds its lock");
    assert_eq!(holder.pid, pid);
    let (code, _, err) = resume(&dir);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("is being trained by pid {pid} on host")),
        "{err}"
    );
    let (code, _, err) = run(&train_args(&sets, &dir));
    assert_eq!(code, 2, "{err}");

    signal(pid, "INT");
    let out = started.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains(&format!("normrl train --resume {}", dir.display())),
        "{err}"
    );
    let step: u64 = common::number_after(&err, "SIGINT (Ctrl-C) at step ", ':');
    let newest = normrl::checkpoint::complete(&dir).pop().unwrap().0;
    assert_eq!(newest, step, "the checkpoint is at the step Ctrl-C stopped");
    assert!(!dir.join("summary.json").exists(), "stopped before the end");

    let (code, _, err) = resume(&dir);
    assert_eq!(code, 0, "{err}");
    assert_same_run(&reference, &dir);
    let _ = std::fs::remove_dir_all(root);
}

fn config(steps: u64) -> TrainConfig {
    let overrides: Vec<String> = sets(steps, 2_000, &[])
        .into_iter()
        .filter(|s| s != "--set")
        .collect();
    TrainConfig::load(Path::new("configs/cartpole.toml"), &overrides).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn flip_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() * 2 / 3;
    bytes[at] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

/// One flipped byte in each file of the newest checkpoint in turn: the resume names
/// the file, falls back to the checkpoint before, and ends equal to the uninterrupted
/// run. With every kept checkpoint damaged, `train --resume` and `eval` refuse (exit
/// 2) and nothing is written.
#[test]
fn a_damaged_checkpoint_is_caught_and_the_previous_one_used() {
    let root = temp("damaged");
    let reference = root.join("reference");
    Trainer::new(config(6_000), &reference)
        .unwrap()
        .run(None)
        .unwrap()
        .unwrap();
    let stopped = root.join("stopped");
    let early = Trainer::new(config(6_000), &stopped)
        .unwrap()
        .run(Some(5_000))
        .unwrap();
    assert!(early.is_none(), "stopped before the end");
    let kept: Vec<u64> = normrl::checkpoint::complete(&stopped)
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(kept, [4_000, 5_000]);

    let files = [
        "online.safetensors",
        "target.safetensors",
        "optimizer.safetensors",
        "state.bin",
    ];
    for file in files {
        let case = root.join(file);
        copy_dir(&stopped, &case);
        flip_byte(&case.join("checkpoints/step-000000005000").join(file));
        let (code, _, err) = resume(&case);
        assert_eq!(code, 0, "{file}: {err}");
        assert!(
            err.contains(&format!("step-000000005000/{file} is damaged"))
                && err.contains("falling back to the checkpoint at step 4000"),
            "{file}: {err}"
        );
        assert_same_run(&reference, &case);
    }

    let broken = root.join("broken");
    copy_dir(&stopped, &broken);
    flip_byte(&broken.join("checkpoints/step-000000005000/state.bin"));
    flip_byte(&broken.join("checkpoints/step-000000004000/online.safetensors"));
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(&broken)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    let (code, _, err) = resume(&broken);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("has no valid checkpoint"), "{err}");
    let (code, _, err) = normrl(&["eval", "--checkpoint", broken.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("state.bin is damaged"), "{err}");
    assert_eq!(listing(), before, "a refused resume wrote nothing");
    let _ = std::fs::remove_dir_all(root);
}

/// The run directory on a real 1 MB file system (tmpfs, in a mount namespace of its
/// own) that fills mid-run: exit 2, the message names the file and the OS's reason
/// and the checkpoint's size, the last checkpoint is intact, and with space freed
/// (the directory copied to a larger disk) the resume ends equal to an uninterrupted
/// run. Where this machine gives no mount namespaces, the unit tests' injected full
/// disk (`checkpoint::tests`) is what covers it.
#[test]
fn a_full_disk_names_itself_and_the_resume_after_ends_the_same() {
    let namespaces = Command::new("unshare")
        .args(["-rm", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !namespaces {
        eprintln!("skipped: `unshare -rm` is not available here");
        return;
    }
    let root = temp("full-disk");
    let sets = sets(30_000, 5_000, &["replay.capacity=20000"]);
    let reference = root.join("reference");
    let (code, _, err) = run(&train_args(&sets, &reference));
    assert_eq!(code, 0, "{err}");

    let mount = root.join("small");
    std::fs::create_dir_all(&mount).unwrap();
    let copied = root.join("copied");
    let train = train_args(&sets, &mount.join("run"));
    let quoted: Vec<String> = train.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "mount -t tmpfs -o size=1m tmpfs '{m}' && '{bin}' {args}; code=$?; cp -a '{m}/run' '{c}'; exit $code",
        m = mount.display(),
        bin = env!("CARGO_BIN_EXE_normrl"),
        args = quoted.join(" "),
        c = copied.display(),
    );
    let out = Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("was not written (it needs"), "{err}");
    assert!(err.contains("/run/checkpoints/step-"), "{err}");
    assert!(!err.contains("serialize buffer"), "{err}");

    let (code, _, err) = resume(&copied);
    assert_eq!(code, 0, "{err}");
    assert_same_run(&reference, &copied);
    let _ = std::fs::remove_dir_all(root);
}

/// A comparison skips a run another process holds and says so, `status` shows it
/// running under the holder's pid, and once the lock is released the same comparison
/// trains it.
#[test]
fn a_comparison_skips_a_run_another_process_holds() {
    let root = temp("compare");
    let body = format!(
        r#"seeds = 1
[set]
"run.total_steps" = 1000
{}[axes]
norm = ["none", "layer_norm"]
"#,
        common::SHORT_RUNS
    );
    let config = common::cartpole_comparison(&root, "tiny", &body);
    let runs = root.join("runs");
    let held = runs.join("classic_cartpole/none/seed-1");
    let lock = normrl::storage::lock::RunLock::acquire(&held).unwrap();
    let args = [
        "compare",
        "--config",
        config.to_str().unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
    ];
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    let me = format!("is being trained by pid {}", std::process::id());
    assert!(err.contains("skipped") && err.contains(&me), "{err}");
    assert!(
        err.contains("1 runs are being trained by another process"),
        "{err}"
    );
    assert!(!held.join("summary.json").exists());
    assert!(!held.join("error.txt").exists());
    assert!(runs
        .join("classic_cartpole/layer_norm/seed-1/summary.json")
        .exists());
    let (code, out, err) = normrl(&["status", runs.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let running: Vec<&serde_json::Value> = status["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "running")
        .collect();
    assert_eq!(running.len(), 1, "{out}");
    assert_eq!(running[0]["pid"], std::process::id());

    drop(lock);
    let (code, _, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(held.join("summary.json").exists(), "{err}");
    let _ = std::fs::remove_dir_all(root);
}
