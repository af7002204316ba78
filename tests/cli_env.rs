//! The `normrl env` commands as a user runs them.

mod common;

use common::{json_lines, normrl};

#[test]
fn rollout_prints_episodes_and_is_deterministic() {
    // The command line as a user types it.
    let line = "env rollout --env minatar/breakout --episodes 3 --seed 4 --json";
    let args: Vec<&str> = line.split(' ').collect();
    let (code, out, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    let episodes = json_lines(&out);
    assert_eq!(episodes.len(), 3);
    assert!(episodes.iter().all(|e| e["length"].as_u64().unwrap() > 0));
    assert_eq!(normrl(&args).1, out, "same seed, same output");
}

#[test]
fn noop_space_invaders_episode_lasts_17_steps() {
    let (code, out, _) = normrl(&[
        "env",
        "rollout",
        "--env",
        "minatar/space_invaders?sticky=0",
        "--policy",
        "noop",
        "--json",
    ]);
    assert_eq!(code, 0);
    let e: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(e["length"], 17);
    assert_eq!(e["terminated"], true);
}

#[test]
fn trace_and_action_file() {
    let dir = std::env::temp_dir().join(format!("normrl-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("actions.txt");
    std::fs::write(&file, "1, 1 0\n1").unwrap();
    let policy = format!("actions:{}", file.display());
    let (code, out, err) = normrl(&[
        "env",
        "rollout",
        "--env",
        "classic/cartpole",
        "--policy",
        &policy,
        "--trace",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut steps = json_lines(&out);
    steps.retain(|v| v.get("action").is_some());
    let actions: Vec<u64> = steps
        .iter()
        .map(|s| s["action"].as_u64().unwrap())
        .collect();
    assert_eq!(actions, [1, 1, 0, 1]);
    assert!(err.contains("ran out"), "{err}");
}

#[test]
fn bad_input_is_a_clear_error_with_exit_code_2() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["env", "rollout", "--env", "minatar/pong"],
            "known environments",
        ),
        (
            &["env", "rollout", "--env", "minatar/breakout?sticky=2"],
            "[0, 1]",
        ),
        (
            &[
                "env",
                "rollout",
                "--env",
                "minatar/breakout",
                "--policy",
                "fixed:9",
            ],
            "0..6",
        ),
        (
            &[
                "env",
                "rollout",
                "--env",
                "classic/cartpole",
                "--policy",
                "greedy",
            ],
            "random, noop",
        ),
        (
            &[
                "env",
                "rollout",
                "--env",
                "classic/cartpole",
                "--policy",
                "actions:/no/such/file",
            ],
            "cannot read",
        ),
        (
            &["env", "bench", "--env", "atari/pong", "--steps", "10"],
            "unknown environment",
        ),
    ];
    for (args, needle) in cases {
        let (code, _, err) = normrl(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn bench_prints_a_row_per_environment() {
    let (code, out, err) = normrl(&["env", "bench", "--steps", "1000"]);
    assert_eq!(code, 0, "{err}");
    for id in normrl_envs::known_ids() {
        assert!(out.contains(&id), "{out}");
    }
}

#[test]
fn bench_nn_filters_by_method_and_case_and_reports_median_and_min() {
    let (code, out, err) = normrl(&[
        "bench",
        "nn",
        "--method",
        "batch_norm",
        "--case",
        "mlp 4-64-64-2 b32",
        "--iters",
        "5",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let rows = json_lines(&out);
    let names: Vec<String> = rows
        .iter()
        .map(|r| format!("{} / {}", r["bench"], r["case"]))
        .collect();
    assert_eq!(
        names,
        [
            "\"update batch_norm\" / \"mlp 4-64-64-2 b32\"",
            "\"act batch_norm\" / \"mlp 4-64-64-2 b1\""
        ]
    );
    for row in &rows {
        let (median, min) = (row["value"].as_f64().unwrap(), row["min"].as_f64().unwrap());
        assert!(min > 0.0 && min <= median, "{row}");
    }
    // The same in three fresh processes: each row's launches summarized; a failing
    // launch's error is the benchmark's.
    let mut args = vec!["bench", "nn", "--method", "batch_norm", "--case"];
    args.extend([
        "mlp 4-64-64-2 b32",
        "--iters",
        "5",
        "--launches",
        "3",
        "--json",
    ]);
    let (code, out, err) = normrl(&args);
    assert_eq!(code, 0, "{err}");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for row in &rows {
        let [min, median, max] = ["min", "median", "max"].map(|k| row[k].as_f64().unwrap());
        assert_eq!(row["launches"], 3, "{row}");
        assert!(min > 0.0 && min <= median && median <= max, "{row}");
        assert!(row["best_min"].as_f64().unwrap() <= min, "{row}");
    }
    let (code, _, err) = normrl(&["bench", "nn", "--case", "transformer", "--launches", "2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no case matches"), "{err}");

    let (code, _, err) = normrl(&["bench", "nn", "--method", "batchnorm"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("unknown method 'batchnorm'") && err.contains("batch_norm"),
        "{err}"
    );
    let (code, _, err) = normrl(&["bench", "nn", "--case", "transformer"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no case matches"), "{err}");
}
