//! Environments for normrl.
//!
//! One small, object-safe [`Env`] trait that every environment implements (native games
//! and adapters to outside ones), a [`registry`] that builds an environment from a string
//! id, and the native environments: Gymnasium's CartPole-v1 and the five MinAtar-style
//! games, and a bridge to Python's Gymnasium ([`gym`]). This crate knows nothing of
//! machine learning.
//!
//! ```
//! use normrl_envs::{make, Env};
//!
//! let mut env = make("minatar/breakout?sticky=0").unwrap();
//! let mut obs = vec![0.0f32; env.observation_space().len()];
//! env.reset(Some(7), &mut obs).unwrap();
//! let step = env.step(0, &mut obs).unwrap();
//! assert!(!step.terminated);
//! assert_eq!(obs.len(), 4 * 10 * 10);
//! ```

pub mod cartpole;
mod env;
mod error;
pub mod gym;
#[cfg(feature = "gymnasium-rs")]
pub mod gymnasium_rs;
pub mod minatar;
pub mod registry;
pub mod render;
mod spaces;
pub mod wrappers;

pub use env::{Env, EpisodeStats, Step};
pub use error::EnvError;
pub use registry::{known_ids, make};
pub use render::Frame;
pub use spaces::{ActionSpace, ObservationSpace};
