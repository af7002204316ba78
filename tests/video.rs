//! `normrl eval --video`: the GIF it writes, decoded with the `gif` crate, holds one
//! frame a step plus the first observation's, and that first frame is the
//! environment's own picture of its first observation; what cannot make a video fails
//! before writing anything.

mod common;

use std::path::{Path, PathBuf};

use candle_core::Device;
use normrl::config::TrainConfig;
use normrl::logging::video::{check_renders, FrameInfo, Video, EVAL_VIDEO};
use normrl::run::evaluate::first_game_seed;
use normrl::train::{evaluate_in, Trainer};
use normrl_envs::{make, ActionSpace, Env, EnvError, ObservationSpace, Step};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-video-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A few hundred steps of training: a checkpoint to evaluate.
fn tiny_run(config: &str, dir: &Path) {
    let overrides: Vec<String> = [
        "run.total_steps=300",
        "replay.learning_starts=100",
        "eval.interval=0",
        "eval.episodes=1",
        "logging.progress=false",
        "checkpoint.replay=false",
    ]
    .map(String::from)
    .to_vec();
    let config = TrainConfig::load(Path::new(config), &overrides).unwrap();
    Trainer::new(config, dir).unwrap().run(None).unwrap();
}

/// The episode's length, from the same evaluation (seed 0, one episode) played again
/// in this process.
fn episode_length(run: &Path) -> u64 {
    let mut config = TrainConfig::load(&run.join("config.toml"), &[]).unwrap();
    config.eval.episodes = 1;
    config.run.seed = 0;
    let ckpt = normrl::checkpoint::latest(run).unwrap().unwrap();
    let agent = normrl::checkpoint::agent_from_checkpoint(&config, &ckpt, &Device::Cpu).unwrap();
    let mut env = make(&config.env.id).unwrap();
    evaluate_in(env.as_mut(), &agent, &config, 0, None).unwrap();
    env.episode_stats().unwrap().last_length.unwrap()
}

#[test]
fn eval_video_has_a_frame_a_step_and_starts_at_the_first_observation() {
    for (config, id) in [
        ("configs/minatar/breakout.toml", "minatar/breakout"),
        ("configs/cartpole.toml", "classic/cartpole"),
    ] {
        let dir = temp_dir(&id.replace('/', "-"));
        tiny_run(config, &dir);
        let out = dir.join("episode.gif");
        let args = ["eval", "--checkpoint", dir.to_str().unwrap()];
        let video = ["--episodes", "1", "--video", out.to_str().unwrap()];
        let (code, _, stderr) = common::normrl(&[&args[..], &video[..]].concat());
        assert_eq!(code, 0, "{stderr}");
        let frames = common::decode_gif(&std::fs::read(&out).unwrap());
        assert_eq!(frames.len() as u64, episode_length(&dir) + 1, "{id}");

        // The first frame is the whole canvas: the picture of the episode's first
        // observation, scaled, above its caption.
        let mut env = make(id).unwrap();
        let mut obs = vec![0.0; env.observation_space().len()];
        env.reset(Some(first_game_seed(0, 0)), &mut obs).unwrap();
        let want = env.render().unwrap().fit(EVAL_VIDEO.side);
        let first = &frames[0];
        assert_eq!((first.left, first.top, first.width), (0, 0, want.width));
        assert!(first.height > want.height, "a caption under the picture");
        assert!(first.rgb[..want.rgb.len()] == want.rgb[..], "{id}");
        let caption = &first.rgb[want.rgb.len()..];
        assert!(caption.chunks(3).any(|p| p[0] > 200), "light text");
        assert!(caption.chunks(3).any(|p| p == [0, 0, 0]), "on black");
        // Later frames lie inside the canvas.
        for f in &frames[1..] {
            assert!(f.left + f.width <= first.width && f.top + f.height <= first.height);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_bad_video_path_is_refused_before_anything_is_written() {
    let dir = temp_dir("paths");
    tiny_run("configs/cartpole.toml", &dir);
    let run = dir.to_str().unwrap();
    for (path, says) in [
        (dir.join("episode.mp4"), "name a .gif file"),
        (dir.join("no/such/dir/episode.gif"), "does not exist"),
    ] {
        let args = [
            "eval",
            "--checkpoint",
            run,
            "--video",
            path.to_str().unwrap(),
        ];
        let (code, _, stderr) = common::normrl(&args);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("--video") && stderr.contains(says),
            "{stderr}"
        );
        assert!(!path.exists());
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn eval_video_on_a_gymnasium_id_without_frames_is_refused_at_the_start() {
    let dir = temp_dir("gym-config");
    let args = [
        "train",
        "--config",
        "configs/cartpole.toml",
        "--set",
        "env.id=gym:CartPole-v1",
        "--set",
        "eval.video=true",
        "--run-dir",
        dir.to_str().unwrap(),
    ];
    let (code, _, stderr) = common::normrl(&args);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("eval.video") && stderr.contains("render_mode=rgb_array"),
        "{stderr}"
    );
    assert!(!dir.exists(), "nothing written");
}

/// An environment with no render method of its own.
struct Blind;

impl Env for Blind {
    fn id(&self) -> &str {
        "test/blind"
    }
    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace::floats(vec![1], 0.0, 1.0)
    }
    fn action_space(&self) -> ActionSpace {
        ActionSpace { n: 1 }
    }
    fn reset(&mut self, _seed: Option<u64>, _obs: &mut [f32]) -> Result<(), EnvError> {
        Ok(())
    }
    fn step(&mut self, _action: usize, _obs: &mut [f32]) -> Result<Step, EnvError> {
        Ok(Step::default())
    }
}

#[test]
fn an_environment_that_cannot_render_is_named() {
    let e = check_renders(&mut Blind).unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("'test/blind' cannot render frames"), "{text}");
    let mut video = Video::new(EVAL_VIDEO);
    let at = FrameInfo {
        episode: 0,
        step: 0,
        return_so_far: 0.0,
    };
    assert!(video.frame(&mut Blind, at).is_err());
    assert!(video.finish().unwrap().is_none(), "no GIF without frames");
}
