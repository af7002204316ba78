//! Environments from Python's Gymnasium, real Atari among them, through a worker
//! process: `gym:CartPole-v1`, `gym:ALE/Breakout-v5?preset=atari`.
//!
//! Each environment runs in its own `python` process (the interpreter is `python3`, or
//! `NORMRL_PYTHON`, or the id's `python=` option) started with a small script that ships
//! inside this crate. Observations cross the pipe as raw arrays; the Atari preset's
//! preprocessing runs here in Rust ([`AtariPreprocessing`]).
//!
//! ```no_run
//! use normrl_envs::{make, Env};
//!
//! // Needs `pip install gymnasium ale-py` in the interpreter the bridge starts.
//! let mut env = make("gym:ALE/Breakout-v5?preset=atari").unwrap();
//! assert_eq!(env.observation_space().shape, [4, 84, 84]);
//! let mut obs = vec![0.0f32; 4 * 84 * 84];
//! env.reset(Some(1), &mut obs).unwrap();
//! env.step(1, &mut obs).unwrap();
//! ```

mod atari;
mod process;

pub use atari::{AreaResize, AtariConfig, AtariPreprocessing};
pub use process::{GymProcess, WorkerSpec};
