//! Keeps episode statistics (return, length, count), like Gymnasium's
//! `RecordEpisodeStatistics`.
//!
//! ```
//! use normrl_envs::{cartpole::CartPole, wrappers::Monitor, Env};
//!
//! let mut env = Monitor::new(CartPole::new());
//! let mut obs = [0.0f32; 4];
//! env.reset(Some(0), &mut obs).unwrap();
//! while !env.step(1, &mut obs).unwrap().done() {}
//! let stats = env.episode_stats().unwrap();
//! assert_eq!(stats.episodes, 1);
//! assert_eq!(stats.last_return, Some(stats.last_length.unwrap() as f64));
//! ```

use crate::{Env, EnvError, EpisodeStats, Step};

pub struct Monitor<E> {
    inner: E,
    stats: EpisodeStats,
}

impl<E: Env> Monitor<E> {
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            stats: EpisodeStats::default(),
        }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }
}

impl<E: Env> Env for Monitor<E> {
    pass_through!(state: stats);

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.stats.current_return = 0.0;
        self.stats.current_length = 0;
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        let step = self.inner.step(action, obs)?;
        let stats = &mut self.stats;
        stats.current_return += f64::from(step.reward);
        stats.current_length += 1;
        stats.total_steps += 1;
        if step.done() {
            stats.episodes += 1;
            stats.last_return = Some(stats.current_return);
            stats.last_length = Some(stats.current_length);
        }
        Ok(step)
    }
    fn episode_stats(&self) -> Option<EpisodeStats> {
        Some(self.stats)
    }
}
