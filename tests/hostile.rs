//! Hostile input and interrupted runs: each class of bad input gets exit 2, a message
//! naming the key, and nothing written; a finished run is final; a checkpoint holds only
//! the filled replay.

use std::path::{Path, PathBuf};

use normrl::config::TrainConfig;
use normrl::train::Trainer;
use normrl_agents::replay::{Batch, ReplayBuffer, Sampler};
use rand::SeedableRng;

mod common;

/// The binary's exit status and everything it printed.
fn normrl(args: &[&str]) -> (i32, String) {
    let (code, out, err) = common::normrl(args);
    (code, out + &err)
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn parse(overrides: &[&str]) -> Result<TrainConfig, String> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_toml_str("", &overrides).map_err(|e| format!("{e:#}"))
}

/// `normrl train` with `overrides` must exit 2 with a message holding every piece of
/// `expect`, and create nothing.
fn refused(name: &str, overrides: &[&str], expect: &[&str]) {
    let dir = temp(name);
    let run = dir.join("run");
    let mut args = vec!["train", "--config", "configs/cartpole.toml", "--run-dir"];
    args.push(run.to_str().unwrap());
    for o in overrides {
        args.extend(["--set", o]);
    }
    let (code, text) = normrl(&args);
    assert_eq!(code, 2, "{overrides:?}: {text}");
    assert!(!text.contains("panicked"), "{overrides:?}: {text}");
    for piece in expect {
        assert!(
            text.contains(piece),
            "{overrides:?}: '{piece}' not in: {text}"
        );
    }
    assert!(!run.exists(), "{overrides:?}: nothing may be written");
}

#[test]
fn inputs_that_panicked_or_aborted_are_refused_with_the_key() {
    // A hidden layer of width 0 panicked in the initializer.
    refused(
        "width0",
        &["network.architecture={type=\"mlp\",hidden=[64,0]}"],
        &["network.architecture.hidden", "positive"],
    );
    // Capacities that overflowed or aborted the allocator, and a layer of 10^9 units:
    // refused by the memory estimate, with the numbers, before anything is written.
    for capacity in ["1000000000000", "9223372036854775000"] {
        let set = format!("replay.capacity={capacity}");
        refused(
            "capacity",
            &[&set],
            &["needs about", "replay.capacity", "GiB"],
        );
    }
    refused(
        "wide",
        &["network.architecture={type=\"mlp\",hidden=[1000000000]}"],
        &["needs about", "network.architecture"],
    );
    // A convolutional network on observations that are not [C, H, W] (the memory
    // estimate once indexed their missing dimensions).
    refused(
        "conv-on-vector",
        &["network.architecture={type=\"minatar_cnn\"}"],
        &["convolutional network needs [channels, height, width]"],
    );
    // A run name that climbs out of runs/.
    refused("name", &["run.name=../../x"], &["run.name", "plain name"]);
}

#[test]
fn conflicting_and_odd_values_name_their_keys() {
    let err = parse(&[
        "replay.sampler={type=\"sequential\"}",
        "replay.batch_size=64",
        "replay.learning_starts=10",
    ])
    .unwrap_err();
    assert!(
        err.contains("replay.learning_starts") && err.contains("batch_size"),
        "{err}"
    );
    // Odd but legal: refused with the reason, accepted with run.allow_odd.
    let odd: [(&[&str], &str); 5] = [
        (&["replay.learning_starts=200000"], "never train"),
        (
            &[
                "run.total_steps=1000",
                "replay.learning_starts=500",
                "replay.train_frequency=600",
            ],
            "train at most once",
        ),
        (
            &["replay.sampler={type=\"recent\",window=500000}"],
            "replay.capacity",
        ),
        (
            &["exploration.start=0.1", "exploration.end=0.5"],
            "epsilon would rise",
        ),
        (&["eval.episodes=0"], "eval.episodes"),
    ];
    for (overrides, reason) in odd {
        let err = parse(overrides).unwrap_err();
        assert!(
            err.contains(reason) && err.contains("allow_odd"),
            "{overrides:?}: {err}"
        );
        let mut allowed = overrides.to_vec();
        allowed.push("run.allow_odd=true");
        parse(&allowed).unwrap_or_else(|e| panic!("{allowed:?}: {e}"));
    }
    // Every key of a table is optional, and tagged tables take only their own keys.
    let partial = parse(&["exploration.steps=500"]).unwrap();
    assert_eq!(
        (partial.exploration.start, partial.exploration.steps),
        (1.0, 500)
    );
    for (set, key) in [
        (
            "replay.sampler={type=\"uniform\",window=5}",
            "replay.sampler.window",
        ),
        (
            "network.architecture={type=\"minatar_cnn\",hidden=[3]}",
            "network.architecture.hidden",
        ),
    ] {
        let err = parse(&[set]).unwrap_err();
        assert!(
            err.contains(key) && err.contains("unknown key"),
            "{set}: {err}"
        );
    }
    let (code, text) = normrl(&["eval", "--checkpoint", "/no/run", "--episodes", "0"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--episodes"), "{text}");
}

fn tiny_run(dir: &Path) -> normrl::train::RunSummary {
    let overrides = [
        "run.total_steps=600",
        "replay.learning_starts=100",
        "eval.interval=0",
        "eval.episodes=2",
        "checkpoint.interval=300",
        "logging.progress=false",
    ];
    let config = common::train_config("configs/cartpole.toml", &overrides);
    Trainer::new(config, dir)
        .unwrap()
        .run(None)
        .unwrap()
        .unwrap()
}

fn event_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("events.out.tfevents")
        })
        .count()
}

#[test]
fn a_finished_run_is_final_and_a_resume_completes_only_what_is_missing() {
    let dir = temp("final").join("run");
    let summary = tiny_run(&dir);
    let written = std::fs::read(dir.join("summary.json")).unwrap();
    // Resuming a finished run changes nothing and evaluates nothing.
    let (code, text) = normrl(&["train", "--resume", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("finished run"), "{text}");
    assert_eq!(std::fs::read(dir.join("summary.json")).unwrap(), written);
    assert_eq!(event_files(&dir), 1);
    // Killed after the final checkpoint, before summary.json: the resume writes it from
    // what was saved, with the same final evaluation (not a second one).
    std::fs::remove_file(dir.join("summary.json")).unwrap();
    let completed = Trainer::resume(&dir).unwrap().run(None).unwrap().unwrap();
    assert_eq!(completed.eval_curve, summary.eval_curve);
    assert_eq!(completed.final_eval_return, summary.final_eval_return);
    assert_eq!(completed.train_curve, summary.train_curve);
}

/// A tiny run in `name`'s directory made unfinished (its summary removed): the run's
/// directory and its latest checkpoint.
fn unfinished_run(name: &str) -> (PathBuf, PathBuf) {
    let dir = temp(name).join("run");
    tiny_run(&dir);
    std::fs::remove_file(dir.join("summary.json")).unwrap();
    let latest = normrl::checkpoint::latest(&dir).unwrap().unwrap();
    (dir, latest)
}

/// Every kept checkpoint of the run, newest last.
fn kept_checkpoints(dir: &Path) -> Vec<PathBuf> {
    normrl::checkpoint::complete(dir)
        .into_iter()
        .map(|(_, d)| d)
        .collect()
}

/// Every kept checkpoint's `state.bin` zeroed: the checksums name it and the resume
/// is refused; without checksums (an older normrl's checkpoint) the decoder still
/// catches it. A failed resume writes nothing.
#[test]
fn a_corrupt_checkpoint_is_named_and_a_failed_resume_writes_nothing() {
    let (dir, _) = unfinished_run("corrupt");
    let kept = kept_checkpoints(&dir);
    assert_eq!(kept.len(), 2, "checkpoint.keep = last_two");
    for ckpt in &kept {
        let state = ckpt.join("state.bin");
        let len = std::fs::metadata(&state).unwrap().len() as usize;
        std::fs::write(&state, vec![0u8; len]).unwrap();
    }
    let (code, text) = normrl(&["train", "--resume", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("has no valid checkpoint") && text.contains("state.bin is damaged"),
        "{text}"
    );
    for ckpt in &kept {
        std::fs::remove_file(ckpt.join("manifest.json")).unwrap();
    }
    for _ in 0..2 {
        let (code, text) = normrl(&["train", "--resume", dir.to_str().unwrap()]);
        assert_eq!(code, 2, "{text}");
        assert!(
            text.contains("is corrupt") && !text.contains("changed"),
            "{text}"
        );
        assert!(text.contains("has no checksums"), "{text}");
    }
    assert_eq!(event_files(&dir), 1, "a failed resume adds no events file");
}

/// A checkpoint whose network file is cut short: the resume names the file and leaves
/// the run directory as it was (no new TensorBoard file); `eval` of a checkpoint made by
/// another architecture says so in one message, without a backtrace even when
/// RUST_BACKTRACE asks for one.
#[test]
fn a_truncated_or_foreign_checkpoint_is_refused_and_changes_nothing() {
    let (dir, _) = unfinished_run("truncated");
    let kept = kept_checkpoints(&dir);
    let files: Vec<PathBuf> = kept.iter().map(|c| c.join("online.safetensors")).collect();
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    for (online, bytes) in files.iter().zip(&originals) {
        std::fs::write(online, &bytes[..bytes.len() / 2]).unwrap();
    }
    let listing = |d: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing(&dir);
    let (code, text) = normrl(&["train", "--resume", dir.to_str().unwrap()]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("online.safetensors"), "{text}");
    assert_eq!(
        listing(&dir),
        before,
        "a failed resume changed the run directory"
    );
    assert_eq!(event_files(&dir), 1);

    for (online, bytes) in files.iter().zip(&originals) {
        std::fs::write(online, bytes).unwrap();
    }
    let config = dir.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let mut table: toml::Table = text.parse().unwrap();
    table["network"]["architecture"]["hidden"] = toml::Value::Array(vec![32.into(), 32.into()]);
    let wider = table.to_string();
    assert_ne!(wider, text, "the config names its hidden widths: {text}");
    std::fs::write(&config, wider).unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let vars = [("RUST_BACKTRACE", "1"), ("PATH", path.as_str())];
    let (code, text) = normrl_with_env(&["eval", "--checkpoint", dir.to_str().unwrap()], &vars);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("does not hold a network of this run's config"),
        "{text}"
    );
    assert!(
        !text.contains("backtrace") && !text.contains("  0: "),
        "{text}"
    );
}

#[test]
fn a_comparison_plan_is_checked_before_anything_runs() {
    let dir = temp("plan");
    let base = std::fs::canonicalize("configs/cartpole.toml").unwrap();
    let write = |name: &str, body: &str| {
        let path = dir.join(name);
        let text = format!(
            "name = \"{name}\"\nbase = \"{}\"\nseeds = 1\n{body}",
            base.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let cases = [
        (
            write(
                "same-label",
                "[[variants]]\nname = \"a\"\nset = {}\n[[variants]]\nname = \"a\"\nset = {}\n",
            ),
            "both go to",
        ),
        (
            write(
                "no-baseline",
                "[axes]\nnorm = [\"none\"]\n[report]\nbaseline = \"bn\"\n",
            ),
            "report.baseline = 'bn'",
        ),
    ];
    for (config, expect) in &cases {
        let runs = dir.join("runs");
        let line = format!(
            "compare --config {} --runs-dir {}",
            config.display(),
            runs.display()
        );
        let (code, text) = normrl(&line.split(' ').collect::<Vec<_>>());
        assert_eq!(code, 2, "{text}");
        assert!(text.contains(expect), "{expect}: {text}");
        assert!(!runs.exists(), "nothing created");
    }
    let config = cases[1].0.to_str().unwrap();
    // 0 jobs, and a count of threads no machine has (each started up front).
    for jobs in ["0", "100000000"] {
        let (code, text) = normrl(&["compare", "--config", config, "--jobs", jobs, "--dry-run"]);
        assert_eq!(code, 2, "{text}");
        assert!(
            text.contains("--jobs must be a positive integer up to 4096"),
            "{text}"
        );
    }
    // A NaN threshold counted no run as running; 0 steps printed a rate of inf.
    let (code, text) = normrl(&["status", dir.to_str().unwrap(), "--stale-after", "nan"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--stale-after = NaN must be a positive number"),
        "{text}"
    );
    let (code, text) = normrl(&["env", "bench", "--env", "classic/cartpole", "--steps", "0"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--steps"), "{text}");
}

/// Comparisons that wrote outside their directory, overflowed, or trained what their
/// labels do not say: each refused with exit 2, naming the key, before anything is
/// written (the runs directory is not made).
#[test]
fn a_comparison_that_escapes_overflows_or_mislabels_is_refused() {
    let dir = temp("escape");
    let base = std::fs::canonicalize("configs/cartpole.toml").unwrap();
    let cases = [
        // The comparison's own directory would be the runs directory or its parent.
        ("name = \"..\"\nseeds = 1\n", "name = '..' must use only"),
        ("name = \".\"\nseeds = 1\n", "not be empty, '.' or '..'"),
        // Two environments' runs of a variant '..' both went to runs/x/seed-1.
        (
            "name = \"x\"\nseeds = 1\n[[variants]]\nname = \"..\"\nset = {}\n",
            "label '..' names no directory",
        ),
        // A count expanded into a list before anything checked it.
        (
            "name = \"x\"\nseeds = 9223372036854775807\n",
            "seeds must be a count from 1 to 100000",
        ),
        // An empty list wrote a plan of 0 runs, which then refused the corrected one.
        ("name = \"x\"\nseeds = []\n", "or a list of 1 to 100000 seeds"),
        // One agent trained, a population's config written.
        (
            "name = \"x\"\nseeds = 1\n[set]\n\"run.population\" = 2\n",
            "run.population = 2 is for `normrl train`",
        ),
        // Ranges that zero or flip every normalized score.
        (
            "name = \"x\"\nseeds = 1\n[report]\nscores = { \"classic/cartpole\" = { random = 500.0, reference = 22.0 } }\n",
            "report.scores.\"classic/cartpole\" = { random = 500, reference = 22 }",
        ),
        (
            "name = \"x\"\nseeds = 1\n[report]\nthresholds = { \"classic/cartpole\" = nan }\n",
            "report.thresholds.\"classic/cartpole\" = NaN must be a finite number",
        ),
    ];
    for (i, (body, expect)) in cases.iter().enumerate() {
        let config = dir.join(format!("c{i}.toml"));
        let text = format!("base = \"{}\"\n{body}", base.display());
        std::fs::write(&config, text).unwrap();
        let runs = dir.join("runs");
        let args = [
            "compare",
            "--config",
            config.to_str().unwrap(),
            "--runs-dir",
        ];
        let (code, text) = normrl(&[&args[..], &[runs.to_str().unwrap()]].concat());
        assert_eq!(code, 2, "{body}: {text}");
        assert!(text.contains(expect), "{body}: '{expect}' not in: {text}");
        assert!(!runs.exists(), "{body}: nothing may be written");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_holds_only_the_filled_replay() {
    let mut replay = ReplayBuffer::new(1_000_000, 4, false);
    replay.start_episode(&[0.0; 4]);
    for t in 0..2000u32 {
        let obs = [t as f32, 1.0, -1.0, 0.5];
        replay.push((t % 2) as usize, 1.0, t % 97 == 96, false, &obs);
        if t % 97 == 96 {
            replay.start_episode(&obs);
        }
    }
    let bytes = postcard::to_allocvec(&replay).unwrap();
    // 2,021 frames of 4 floats and their slots, not 10^6 of them (about 26 MB).
    assert!(bytes.len() < 100_000, "{} bytes", bytes.len());
    let back: ReplayBuffer = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(back, replay);
    let (mut a, mut b) = (Batch::new(64, 4), Batch::new(64, 4));
    let mut r1 = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(9);
    let mut r2 = r1.clone();
    replay.sample(Sampler::Uniform, &mut a, &mut r1).unwrap();
    back.sample(Sampler::Uniform, &mut b, &mut r2).unwrap();
    assert_eq!(a, b);
    // A cut-off buffer is an error, not a panic.
    assert!(postcard::from_bytes::<ReplayBuffer>(&bytes[..bytes.len() / 2]).is_err());
}

/// A stored replay whose counters contradict its slots (an older checkpoint, without
/// checksums, damaged) is refused as it is read, saying which: each of these read back
/// and then panicked, sampling from an empty range, asserting an observation's length
/// or underflowing the transition count on eviction.
#[test]
fn a_replay_whose_counters_contradict_its_slots_is_refused() {
    let mut replay = ReplayBuffer::new(50, 100, true);
    replay.start_episode(&[1.0; 100]);
    for t in 0..30 {
        replay.push(t % 3, 1.0, false, false, &[0.0; 100]);
    }
    let good = serde_json::to_value(&replay).unwrap();
    let back: ReplayBuffer = serde_json::from_value(good.clone()).unwrap();
    assert_eq!(back, replay);
    let damaged = |field: &str, value: serde_json::Value| {
        let mut v = good.clone();
        *v.pointer_mut(field).unwrap() = value;
        serde_json::from_value::<ReplayBuffer>(v)
            .unwrap_err()
            .to_string()
    };
    for (field, value, why) in [
        ("/written", 0.into(), "transition count disagrees"),
        ("/transitions", 31.into(), "transition count disagrees"),
        ("/transitions", 29.into(), "transition count disagrees"),
        ("/written", 60.into(), "more frames written than it stores"),
        ("/head", 3.into(), "newest slot disagrees"),
        ("/obs_len", 200.into(), "do not fit its observation length"),
    ] {
        let err = damaged(field, value);
        assert!(err.contains(why), "{field}: {err}");
    }
}

#[test]
fn a_diverged_run_stops_says_where_and_reports_count_it_apart() {
    let dir = temp("diverge");
    let run = dir.join("run");
    // Adam moves each weight by about the learning rate: 1e38 overflows at once.
    let line = format!(
        "train --config configs/cartpole.toml --run-dir {} --set optimizer.lr=1e38 --set run.total_steps=2000 --set replay.learning_starts=100 --set logging.progress=false",
        run.display()
    );
    let (code, text) = normrl(&line.split(' ').collect::<Vec<_>>());
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("diverged at step"), "{text}");
    let summary = normrl::train::finished_summary(&run).unwrap().unwrap();
    let d = summary
        .diverged
        .clone()
        .expect("the summary records the divergence");
    assert!(
        d.step > 100 && d.step < 2000 && summary.steps == d.step,
        "{d:?}"
    );
    // Finished is final for a diverged run too.
    let (code, text) = normrl(&["train", "--resume", run.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    // The report counts it apart and averages nothing in for it.
    let records =
        normrl::report::load_runs(std::slice::from_ref(&dir), &Default::default()).unwrap();
    let report = normrl::report::build(records, &Default::default()).unwrap();
    let stats = &report.per_env[0];
    assert_eq!((stats.runs, stats.diverged_runs), (0, 1));
    assert!(
        stats.final_iqm.is_nan(),
        "no finished run, no score: {}",
        stats.final_iqm
    );
    assert!(normrl::report::markdown(&report).contains("| 0 | 1 |"));
}

/// `normrl` with an environment of only `vars` (no PATH unless given): exit status and
/// output.
fn normrl_with_env(args: &[&str], vars: &[(&str, &str)]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args(args)
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// Comparisons of two CartPole runs and their `compare` command lines, in a
/// directory of their own.
struct Comparisons {
    dir: PathBuf,
    runs: PathBuf,
}

impl Comparisons {
    fn new(name: &str) -> Self {
        let dir = temp(name);
        let runs = dir.join("runs");
        Self { dir, runs }
    }

    /// A comparison named `name` with `body` after its header.
    fn config(&self, name: &str, body: &str) -> PathBuf {
        let base = std::fs::canonicalize("configs/cartpole.toml").unwrap();
        let path = self.dir.join(format!("{name}.toml"));
        let text = format!(
            "name = \"{name}\"\nbase = \"{}\"\nseeds = 2\n{body}",
            base.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Two methods, two runs per array task: tasks 0 and 1.
    fn good(&self) -> PathBuf {
        let body = "[axes]\nnorm = [\"none\", \"weight_norm\"]\n[slurm]\nruns_per_task = 2\n";
        self.config("good", body)
    }

    fn args(&self, config: &Path, extra: &[&str]) -> Vec<String> {
        let fixed = [
            "compare",
            "--config",
            config.to_str().unwrap(),
            "--runs-dir",
        ];
        let mut args: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
        args.push(self.runs.to_str().unwrap().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// `normrl` with these arguments and only `vars` in its environment.
    fn run(&self, args: &[String], vars: &[(&str, &str)]) -> (i32, String) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        normrl_with_env(&args, vars)
    }
}

/// A command line, the environment it runs with, and what its error must say.
type Refused<'a> = (Vec<String>, &'a [(&'a str, &'a str)], &'a str);

#[test]
fn bad_cluster_input_is_refused_before_anything_is_written_or_submitted() {
    let c = Comparisons::new("cluster");
    let good = c.good();
    let unknown = c.config("unknown", "[slurm]\nruns_per_task = 2\nqueue = \"long\"\n");
    let zero = c.config("zero", "[slurm]\ncpus_per_task = 0\n");
    let k8s_index = [("JOB_COMPLETION_INDEX", "7")];
    let no_sbatch = [("PATH", "/nonexistent")];
    let cases: [Refused; 7] = [
        (c.args(&unknown, &["--slurm"]), &[], "unknown field `queue`"),
        (
            c.args(&zero, &["--slurm"]),
            &[],
            "slurm.cpus_per_task: a positive integer",
        ),
        (
            c.args(&good, &["--task", "2"]),
            &[],
            "--task = '2': the plan has tasks 0 to 1",
        ),
        (c.args(&good, &["--task", "x"]), &[], "--task = 'x'"),
        (
            c.args(&good, &["--task", "auto"]),
            &[],
            "neither SLURM_ARRAY_TASK_ID",
        ),
        // A Kubernetes index past the plan's end.
        (
            c.args(&good, &["--task", "auto"]),
            &k8s_index,
            "JOB_COMPLETION_INDEX = '7'",
        ),
        // Nothing written, nothing submitted.
        (
            c.args(&good, &["--slurm", "--submit"]),
            &no_sbatch,
            "sbatch is not on the PATH",
        ),
    ];
    for (args, vars, expect) in &cases {
        let (code, text) = c.run(args, vars);
        assert_eq!(code, 2, "{args:?}: {text}");
        assert!(text.contains(expect), "{expect}: {text}");
        assert!(!c.runs.exists(), "{args:?}: nothing written");
    }
    let _ = std::fs::remove_dir_all(&c.dir);
}

#[test]
fn a_written_plan_refuses_another_grid_or_grouping() {
    let c = Comparisons::new("plan-fixed");
    let good = c.good();
    let (code, text) = c.run(&c.args(&good, &["--slurm"]), &[]);
    assert_eq!(code, 0, "{text}");
    let script = std::fs::read_to_string(c.runs.join("slurm/array.sbatch")).unwrap();
    assert!(
        script.contains("#SBATCH --array=0-1\n") && script.contains("--task auto"),
        "{script}"
    );
    let (code, text) = c.run(&c.args(&good, &["--slurm", "--runs-per-task", "1"]), &[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("groups 2 runs per task, not 1"), "{text}");
    let longer = c.args(&good, &["--task", "0", "--set", "run.total_steps=9999"]);
    let (code, text) = c.run(&longer, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("was written for another plan") && text.contains("run.total_steps=9999"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&c.dir);
}
