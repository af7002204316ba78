//! The Gymnasium bridge against real Gymnasium and ALE, in the virtual environment that
//! `tests/common` makes under `target/`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use normrl::train::Trainer;
use normrl_envs::cartpole::CartPole;
use normrl_envs::gym::{GymProcess, WorkerSpec};
use normrl_envs::{make, Env};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

fn gym_id(id: &str, options: &str) -> String {
    let sep = if options.is_empty() { "" } else { "&" };
    format!(
        "gym:{id}?python={}{sep}{options}",
        common::python().display()
    )
}

fn worker_spec(id: &str) -> WorkerSpec {
    WorkerSpec {
        gym_id: id.to_string(),
        kwargs: Default::default(),
        preset: None,
        frame_skip: 4,
        python: common::python().display().to_string(),
    }
}

/// From the same start state, Gymnasium's CartPole-v1 (through the bridge) and the
/// native one give the same transitions for the same actions.
#[test]
fn bridged_cartpole_matches_native_cartpole() {
    let mut bridge = make(&gym_id("CartPole-v1", "")).unwrap();
    assert_eq!(bridge.observation_space().shape, [4]);
    assert_eq!(bridge.action_space().n, 2);
    let mut native = CartPole::new();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let (mut a, mut b) = ([0.0f32; 4], [0.0f32; 4]);
    let mut total_steps = 0;
    for episode in 0..10 {
        bridge.reset(Some(episode), &mut a).unwrap();
        // Gymnasium's start state is float64; its observation, float32, is the
        // closest start we can give the native CartPole (differences ~1e-9).
        native.start_from(a.map(f64::from), &mut b).unwrap();
        loop {
            let action = rng.random_range(0..2);
            let sa = bridge.step(action, &mut a).unwrap();
            let sb = native.step(action, &mut b).unwrap();
            total_steps += 1;
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "episode {episode}: {a:?} vs {b:?}"
                );
            }
            assert_eq!(sa, sb, "episode {episode}, step outcome");
            if sa.done() {
                break;
            }
        }
    }
    assert!(total_steps > 100, "{total_steps}");
    assert_eq!(bridge.episode_stats().unwrap().episodes, 10);
}

#[test]
fn ale_breakout_with_the_atari_preset() {
    let id = gym_id("ALE/Breakout-v5", "preset=atari");
    let mut env = make(&id).unwrap();
    let space = env.observation_space();
    assert_eq!(space.shape, [4, 84, 84]);
    assert!(space.bytes);
    assert_eq!(env.action_space().n, 4);
    let frame = 84 * 84;
    let mut obs = vec![0.0f32; 4 * frame];
    env.reset(Some(3), &mut obs).unwrap();
    // The stack starts as four copies of the first frame.
    for k in 1..4 {
        assert_eq!(obs[..frame], obs[k * frame..(k + 1) * frame]);
    }
    assert!(obs
        .iter()
        .all(|&v| (0.0..=1.0).contains(&v) && ((v * 255.0).round() / 255.0 - v).abs() < 1e-7));
    assert!(obs.iter().any(|&v| v > 0.0), "a blank first frame");

    let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
    let mut actions = vec![];
    let mut trace = vec![];
    let (mut life_ends, mut games) = (0, 0);
    let mut prev = obs.clone();
    for _ in 0..1500 {
        let action = rng.random_range(0..4);
        actions.push(action);
        let games_before = env.episode_stats().unwrap().episodes;
        let step = env.step(action, &mut obs).unwrap();
        assert!(
            [-1.0, 0.0, 1.0].contains(&step.reward),
            "clipped reward {}",
            step.reward
        );
        // Frames move down the stack by one each step.
        assert_eq!(obs[..3 * frame], prev[frame..]);
        trace.push((step, obs.iter().map(|&v| f64::from(v)).sum::<f64>()));
        if step.done() {
            if env.episode_stats().unwrap().episodes > games_before {
                games += 1;
            } else {
                life_ends += 1;
            }
            env.reset(None, &mut obs).unwrap();
        }
        prev.copy_from_slice(&obs);
    }
    // Breakout has five lives: each game ends four times before it is over.
    assert!(games >= 1, "no game finished in 1500 random steps");
    assert!(
        life_ends >= 4 * games,
        "{life_ends} lost lives in {games} games"
    );
    let stats = env.episode_stats().unwrap();
    assert!(stats.last_length.unwrap() > 50, "{stats:?}");

    // The same seed and actions give the same game (sticky actions included).
    let mut again = make(&id).unwrap();
    again.reset(Some(3), &mut obs).unwrap();
    for (i, &action) in actions.iter().enumerate() {
        let step = again.step(action, &mut obs).unwrap();
        assert_eq!(
            (step, obs.iter().map(|&v| f64::from(v)).sum::<f64>()),
            trace[i],
            "step {i}"
        );
        if step.done() {
            again.reset(None, &mut obs).unwrap();
        }
    }
}

/// Breakout serves only after FIRE: with `fire_reset` a do-nothing agent loses a life
/// (the ball is served and missed); without it nothing ever happens.
#[test]
fn fire_reset_serves_the_ball() {
    let lost_life_in = |options: &str| {
        let mut env = make(&gym_id("ALE/Breakout-v5", options)).unwrap();
        let mut obs = vec![0.0f32; 4 * 84 * 84];
        env.reset(Some(1), &mut obs).unwrap();
        (1..=400).find(|_| env.step(0, &mut obs).unwrap().terminated)
    };
    assert!(
        lost_life_in("preset=atari").is_some(),
        "no life lost with fire_reset"
    );
    assert_eq!(lost_life_in("preset=atari&fire_reset=false"), None);
}

#[test]
fn a_killed_worker_gives_a_clear_error() {
    let mut env = GymProcess::start("gym:CartPole-v1", worker_spec("CartPole-v1")).unwrap();
    let mut obs = [0.0f32; 4];
    env.reset(Some(0), &mut obs).unwrap();
    env.step(0, &mut obs).unwrap();
    kill(env.worker_pid());
    std::thread::sleep(Duration::from_millis(200));
    let err = env.step(1, &mut obs).unwrap_err().to_string();
    assert!(
        err.contains("Gymnasium worker for 'CartPole-v1'") && err.contains("signal: 9"),
        "{err}"
    );
    // Every later call says the same, at once.
    let again = env.reset(None, &mut obs).unwrap_err().to_string();
    assert_eq!(again, err);
}

#[test]
fn missing_python_packages_and_unknown_ids_say_what_to_do() {
    let bare = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bare-venv");
    if !bare.join("bin/python").exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&bare)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
    let err = make(&format!(
        "gym:CartPole-v1?python={}",
        bare.join("bin/python").display()
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("'gymnasium'") && err.contains("pip install gymnasium"),
        "{err}"
    );

    let err = make(&gym_id("ALE/Breakot-v5", ""))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("Breakot") && err.contains("ALE/Breakout-v5"),
        "{err}"
    );

    let err = make("gym:CartPole-v1?python=/no/such/python")
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("/no/such/python") && err.contains("NORMRL_PYTHON"),
        "{err}"
    );

    let err = make(&gym_id("CartPole-v1", "frame_stack=4"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("preset=atari"), "{err}");
}

/// `normrl train` on a bridged environment: when the worker is killed mid-run the run
/// stops with the worker's error (no hang), and the last checkpoint resumes.
#[test]
fn training_stops_cleanly_when_the_worker_dies_and_resumes() {
    let dir = std::env::temp_dir().join(format!("normrl-gym-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env_id = format!("env.id=\"{}\"", gym_id("CartPole-v1", ""));
    let mut child = Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args(["train", "--config", "configs/cartpole.toml", "--run-dir"])
        .arg(&dir)
        .args(["--set", &env_id])
        .args(["--set", "run.total_steps=1000000"])
        .args(["--set", "checkpoint.interval=500"])
        .args(["--set", "eval.interval=1000000"])
        .args(["--set", "replay.learning_starts=200"])
        .args(["--set", "logging.progress=false"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let latest = dir.join("checkpoints/latest");
    let start = Instant::now();
    while !latest.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpoint after 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let workers = children_of(child.id());
    assert_eq!(workers.len(), 1, "one worker process: {workers:?}");
    Command::new("kill")
        .args(["-9", &workers[0].to_string()])
        .status()
        .unwrap();
    let out = wait_with_timeout(&mut child, Duration::from_secs(60));
    assert!(
        !out.0.success(),
        "normrl exited with success after its worker died"
    );
    assert!(
        out.1.contains("Gymnasium worker") && out.1.contains("last checkpoint is intact"),
        "{}",
        out.1
    );
    let mut resumed = Trainer::resume(&dir).unwrap();
    let from = resumed.step();
    assert!(from >= 500);
    resumed.run(Some(from + 300)).unwrap();
    assert_eq!(resumed.step(), from + 300);
    drop(resumed);
    let _ = std::fs::remove_dir_all(dir);
}

/// SIGKILL, through the shell's built-in `kill`.
fn kill(pid: u32) {
    let status = Command::new("sh")
        .args(["-c", &format!("kill -9 {pid}")])
        .status()
        .unwrap();
    assert!(status.success(), "kill -9 {pid}");
}

/// Process ids whose parent is `pid` (read from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, ...
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            children.push(child);
        }
    }
    children
}

fn wait_with_timeout(
    child: &mut std::process::Child,
    limit: Duration,
) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status, err);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("normrl did not exit within {limit:?} after its worker died");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A run trained without frames (Gymnasium's CartPole made without
/// `render_mode=rgb_array`) is filmed afterwards: `eval --video` adds the option to
/// its id by itself, and the run's files are not changed. `eval --set` asking for
/// another render mode is honoured, and then the missing frames are named, exit 2,
/// nothing written.
#[test]
fn eval_video_films_a_run_trained_without_frames() {
    let dir = std::env::temp_dir().join(format!("normrl-gym-video-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env_id = format!("env.id=\"{}\"", gym_id("CartPole-v1", ""));
    let (code, _, stderr) = common::normrl(&[
        "train",
        "--config",
        "configs/cartpole.toml",
        "--run-dir",
        dir.to_str().unwrap(),
        "--set",
        &env_id,
        "--set",
        "run.total_steps=300",
        "--set",
        "replay.learning_starts=100",
        "--set",
        "eval.episodes=1",
        "--set",
        "logging.progress=false",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let config_before = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(!config_before.contains("render_mode"), "{config_before}");
    let out = dir.join("episode.gif");
    let run = dir.to_str().unwrap();
    let args = ["eval", "--checkpoint", run, "--episodes", "1", "--video"];
    let (code, _, stderr) = common::normrl(&[&args[..], &[out.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{stderr}");
    let frames = common::decode_gif(&std::fs::read(&out).unwrap());
    assert!(frames.len() > 5, "{} frames", frames.len());
    assert_eq!(
        std::fs::read_to_string(dir.join("config.toml")).unwrap(),
        config_before
    );
    std::fs::remove_file(&out).unwrap();

    let human = format!("env.id={}", gym_id("CartPole-v1", "render_mode=ansi"));
    let with = ["--set", human.as_str(), "--video", out.to_str().unwrap()];
    let (code, _, stderr) = common::normrl(&[&args[..5], &with[..]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("CartPole-v1 cannot render frames") && stderr.contains("render_mode"),
        "{stderr}"
    );
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// ALE's games render the emulator's colour screen (210 x 160) whatever the
/// preprocessing feeds the agent.
#[test]
fn atari_renders_the_emulators_colour_screen() {
    let mut env = make(&gym_id("ALE/Breakout-v5", "preset=atari")).unwrap();
    let mut obs = vec![0.0f32; env.observation_space().len()];
    env.reset(Some(3), &mut obs).unwrap();
    let frame = env.render().unwrap();
    assert_eq!((frame.width, frame.height), (160, 210));
    let colours: std::collections::HashSet<_> = frame.rgb.chunks(3).collect();
    assert!(colours.len() > 4, "{} colours", colours.len());
    assert!(frame.rgb.chunks(3).any(|p| p[0] != p[1]), "in colour");
    env.step(1, &mut obs).unwrap();
    assert_eq!(env.render().unwrap().rgb.len(), 160 * 210 * 3);
}
