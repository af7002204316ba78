//! Truncates episodes after a fixed number of steps.
//!
//! ```
//! use normrl_envs::{cartpole::CartPole, wrappers::TimeLimit, Env};
//!
//! let mut env = TimeLimit::new(CartPole::new(), 3);
//! let mut obs = [0.0f32; 4];
//! env.reset(Some(0), &mut obs).unwrap();
//! env.step(1, &mut obs).unwrap();
//! env.step(0, &mut obs).unwrap();
//! let last = env.step(1, &mut obs).unwrap();
//! assert!(last.truncated && !last.terminated);
//! ```

use crate::{Env, EnvError, EpisodeStats, Step};

/// Sets `truncated` on the step that reaches `max_steps` (unless the episode terminated
/// on that same step, in which case termination wins and truncation is also reported,
/// as Gymnasium does).
pub struct TimeLimit<E> {
    inner: E,
    max_steps: u64,
    elapsed: u64,
}

impl<E: Env> TimeLimit<E> {
    pub fn new(inner: E, max_steps: u64) -> Self {
        Self {
            inner,
            max_steps,
            elapsed: 0,
        }
    }

    /// Steps taken in the current episode.
    pub fn elapsed(&self) -> u64 {
        self.elapsed
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }
}

impl<E: Env> Env for TimeLimit<E> {
    pass_through!(state: elapsed);

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.elapsed = 0;
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut step = self.inner.step(action, obs)?;
        self.elapsed += 1;
        if self.elapsed >= self.max_steps {
            step.truncated = true;
        }
        Ok(step)
    }
    fn episode_stats(&self) -> Option<EpisodeStats> {
        self.inner.episode_stats()
    }
}
