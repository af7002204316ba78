//! Adapter for environments written against the `gymnasium-rs` crate (its
//! `Env<Array1<f32>, i32>` trait): any of them runs through normrl's [`Env`] trait,
//! with no change to the agent. Behind the `gymnasium-rs` cargo feature, since the crate
//! brings pyo3 and needs a `python3` at build time.
//!
//! ```ignore
//! use normrl_envs::gymnasium_rs::GymnasiumRs;
//! use normrl_envs::Env;
//!
//! // Their CartPole differs from Gymnasium's: an adapter target, not normrl's CartPole.
//! let mut env = GymnasiumRs::new("gymnasium-rs/cartpole", gymnasium_rs::envs::cartpole::CartPole::new()).unwrap();
//! let mut obs = [0.0f32; 4];
//! env.reset(Some(1), &mut obs).unwrap();
//! env.step(1, &mut obs).unwrap();
//! ```

use std::collections::HashMap;

use gymnasium_rs::core::{Env as GymEnv, Space};
use ndarray::Array1;

use crate::env::check_obs_len;
use crate::{ActionSpace, Env, EnvError, ObservationSpace, Step};

pub struct GymnasiumRs<E> {
    id: String,
    env: E,
    obs_len: usize,
    low: f32,
    high: f32,
    n_actions: usize,
}

impl<E: GymEnv<Array1<f32>, i32> + Send> GymnasiumRs<E> {
    /// Wraps `env`, which must have a `Discrete` action space and a `Box` observation
    /// space.
    pub fn new(id: &str, env: E) -> Result<Self, EnvError> {
        let n_actions = match env.action_space() {
            Space::Discrete(n) if n > 0 => n as usize,
            other => {
                return Err(EnvError::External(format!(
                    "{id}: the action space is {other:?}; normrl's DQN needs Discrete(n)"
                )))
            }
        };
        let (low, high) = match env.observation_space() {
            Space::Box { low, high } if low.len() == high.len() && !low.is_empty() => (low, high),
            other => {
                return Err(EnvError::External(format!(
                    "{id}: the observation space is {other:?}; normrl needs a Box"
                )))
            }
        };
        Ok(Self {
            id: id.to_string(),
            obs_len: low.len(),
            low: low.iter().copied().fold(f32::INFINITY, f32::min),
            high: high.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            n_actions,
            env,
        })
    }

    fn write(&self, from: &Array1<f32>, obs: &mut [f32]) -> Result<(), EnvError> {
        if from.len() != self.obs_len {
            return Err(EnvError::External(format!(
                "{}: the environment returned {} values, its space says {}",
                self.id,
                from.len(),
                self.obs_len
            )));
        }
        for (o, v) in obs.iter_mut().zip(from.iter()) {
            *o = *v;
        }
        Ok(())
    }
}

impl<E: GymEnv<Array1<f32>, i32> + Send> Env for GymnasiumRs<E> {
    fn id(&self) -> &str {
        &self.id
    }

    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace::floats(vec![self.obs_len], self.low, self.high)
    }

    fn action_space(&self) -> ActionSpace {
        ActionSpace { n: self.n_actions }
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(self.obs_len, obs)?;
        // Their seeds are i32: fold the u64 into the non-negative range.
        let seed = seed.map(|s| (s % i32::MAX as u64) as i32);
        let (first, _) = self.env.reset(seed, HashMap::new());
        self.write(&first, obs)
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        check_obs_len(self.obs_len, obs)?;
        self.action_space().check(action)?;
        let (next, reward, terminated, truncated, _) = self.env.step(action as i32);
        self.write(&next, obs)?;
        Ok(Step {
            reward,
            terminated,
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gymnasium_rs::envs::cartpole::CartPole;

    #[test]
    fn their_cartpole_runs_through_our_trait() {
        let mut env: Box<dyn Env> =
            Box::new(GymnasiumRs::new("gymnasium-rs/cartpole", CartPole::new()).unwrap());
        assert_eq!(env.observation_space().shape, [4]);
        assert_eq!(env.action_space().n, 2);
        let (mut obs, mut again) = ([0.0f32; 4], [0.0f32; 4]);
        env.reset(Some(3), &mut again).unwrap();
        env.reset(Some(3), &mut obs).unwrap();
        assert_eq!(obs, again, "same seed, same start");
        assert!(obs.iter().all(|v| v.abs() <= 0.05), "{obs:?}");
        // Always pushing right tips the pole over within a few dozen steps.
        let steps = (1..=200)
            .find(|_| env.step(1, &mut obs).unwrap().terminated)
            .expect("the pole never fell");
        assert!(steps < 60, "{steps}");
        assert!(env.step(2, &mut obs).is_err(), "action 2 of 2 accepted");
        let mut short = [0.0f32; 3];
        assert!(env.reset(None, &mut short).is_err());
    }
}
