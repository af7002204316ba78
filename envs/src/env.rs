//! The environment trait that every native game and every adapter implements.

use crate::{ActionSpace, EnvError, Frame, ObservationSpace};

/// The outcome of one step. Time-limit truncation is kept apart from termination:
/// a learner bootstraps from the next observation after truncation, not after
/// termination.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Step {
    pub reward: f32,
    /// The episode ended inside the environment (ball lost, pole fell).
    pub terminated: bool,
    /// The episode was cut from outside (a time limit); the state is not terminal.
    pub truncated: bool,
}

impl Step {
    /// True when the episode is over for either reason: the caller must reset.
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// Running statistics of the episodes an environment has played, kept by the
/// [`Monitor`](crate::wrappers::Monitor) wrapper that the registry puts outermost.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct EpisodeStats {
    /// Episodes finished (terminated or truncated).
    pub episodes: u64,
    /// Steps taken over all episodes.
    pub total_steps: u64,
    /// Return and length of the episode in progress.
    pub current_return: f64,
    pub current_length: u64,
    /// Return and length of the last finished episode, if any.
    pub last_return: Option<f64>,
    pub last_length: Option<u64>,
}

/// A Gymnasium-shaped environment with a discrete action space.
///
/// Observations are written into a caller-provided buffer of
/// `observation_space().len()` elements, so stepping allocates nothing. The trait is
/// object-safe: the registry hands out `Box<dyn Env>`.
pub trait Env: Send {
    /// The id this environment was built from (e.g. `minatar/breakout`).
    fn id(&self) -> &str;

    fn observation_space(&self) -> ObservationSpace;

    fn action_space(&self) -> ActionSpace;

    /// Starts a new episode and writes its first observation into `obs`. With a seed,
    /// the environment's random stream is replaced by a freshly seeded one first; the
    /// same seed then gives the same episode.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError>;

    /// Takes one action and writes the next observation into `obs`.
    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError>;

    /// Episode statistics, where a wrapper keeps them.
    fn episode_stats(&self) -> Option<EpisodeStats> {
        None
    }

    /// [`Env::step`], and whether a whole game ended with it. Where a lost life ends
    /// the learner's episode (the Atari preset) the game goes on after the next reset;
    /// the [`Monitor`](crate::wrappers::Monitor) counts games. Without a monitor every
    /// episode end is a game end.
    fn step_game(&mut self, action: usize, obs: &mut [f32]) -> Result<(Step, bool), EnvError> {
        let games_before = self.episode_stats().map(|s| s.episodes);
        let step = self.step(action, obs)?;
        let games_after = self.episode_stats().map(|s| s.episodes);
        let game_over = step.done() && (games_after.is_none() || games_after != games_before);
        Ok((step, game_over))
    }

    /// The full state (random stream included), so that a run can stop and resume
    /// exactly. Environments that cannot say so return an error.
    fn save_state(&self) -> Result<serde_json::Value, EnvError> {
        Err(EnvError::External(format!(
            "{} cannot save its state",
            self.id()
        )))
    }

    /// Restores what [`Env::save_state`] returned.
    fn load_state(&mut self, _state: &serde_json::Value) -> Result<(), EnvError> {
        Err(EnvError::External(format!(
            "{} cannot restore a saved state",
            self.id()
        )))
    }

    /// A picture of the current state (for videos of the agent), at the environment's
    /// own scale. Environments that cannot draw themselves keep this default, an error
    /// naming them; an adapter adds its own by overriding it.
    fn render(&mut self) -> Result<Frame, EnvError> {
        Err(EnvError::CannotRender {
            id: self.id().to_string(),
        })
    }
}

/// `save_state` for environments whose whole state is one serde value.
pub(crate) fn to_state<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, EnvError> {
    serde_json::to_value(value).map_err(|e| EnvError::External(format!("saving state: {e}")))
}

/// `load_state` counterpart of [`to_state`].
pub(crate) fn from_state<T: serde::de::DeserializeOwned>(
    state: &serde_json::Value,
) -> Result<T, EnvError> {
    T::deserialize(state).map_err(|e| EnvError::External(format!("restoring state: {e}")))
}

/// Writes `save_state` and `load_state` for an environment whose whole state (its
/// random stream included) is the one serde value `Self`.
macro_rules! whole_state {
    () => {
        fn save_state(&self) -> Result<serde_json::Value, $crate::EnvError> {
            $crate::env::to_state(self)
        }

        fn load_state(&mut self, state: &serde_json::Value) -> Result<(), $crate::EnvError> {
            *self = $crate::env::from_state(state)?;
            Ok(())
        }
    };
}
pub(crate) use whole_state;

impl<E: Env + ?Sized> Env for Box<E> {
    fn id(&self) -> &str {
        (**self).id()
    }
    fn observation_space(&self) -> ObservationSpace {
        (**self).observation_space()
    }
    fn action_space(&self) -> ActionSpace {
        (**self).action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        (**self).reset(seed, obs)
    }
    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        (**self).step(action, obs)
    }
    fn episode_stats(&self) -> Option<EpisodeStats> {
        (**self).episode_stats()
    }
    fn save_state(&self) -> Result<serde_json::Value, EnvError> {
        (**self).save_state()
    }
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), EnvError> {
        (**self).load_state(state)
    }
    fn render(&mut self) -> Result<Frame, EnvError> {
        (**self).render()
    }
}

/// Checks the observation buffer's length, with an error that says what was expected.
pub(crate) fn check_obs_len(expected: usize, obs: &[f32]) -> Result<(), EnvError> {
    if obs.len() == expected {
        Ok(())
    } else {
        Err(EnvError::ObservationBuffer {
            expected,
            got: obs.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cartpole::CartPole;
    use crate::wrappers::Monitor;

    /// Ends an episode every step; its monitor counts a game only every third.
    struct Lives {
        steps: u64,
    }

    impl Env for Lives {
        fn id(&self) -> &str {
            "lives"
        }
        fn observation_space(&self) -> ObservationSpace {
            CartPole::new().observation_space()
        }
        fn action_space(&self) -> ActionSpace {
            ActionSpace { n: 1 }
        }
        fn reset(&mut self, _seed: Option<u64>, _obs: &mut [f32]) -> Result<(), EnvError> {
            Ok(())
        }
        fn step(&mut self, _action: usize, _obs: &mut [f32]) -> Result<Step, EnvError> {
            self.steps += 1;
            Ok(Step {
                terminated: true,
                ..Step::default()
            })
        }
        fn episode_stats(&self) -> Option<EpisodeStats> {
            Some(EpisodeStats {
                episodes: self.steps / 3,
                ..EpisodeStats::default()
            })
        }
    }

    #[test]
    fn step_game_tells_game_ends_from_episode_ends() {
        let mut env = Lives { steps: 0 };
        let mut obs = [0.0f32; 4];
        let over: Vec<bool> = (0..6)
            .map(|_| env.step_game(0, &mut obs).unwrap().1)
            .collect();
        assert_eq!(over, [false, false, true, false, false, true]);
        // It has no render method: the default error names it.
        let e = Box::new(Lives { steps: 0 }).render().unwrap_err();
        assert_eq!(e, EnvError::CannotRender { id: "lives".into() });
        assert!(e.to_string().contains("'lives' cannot render"), "{e}");

        // With a plain monitor every episode end is a game end, and only those.
        let mut env = Monitor::new(CartPole::new());
        env.reset(Some(0), &mut obs).unwrap();
        loop {
            let (step, over) = env.step_game(1, &mut obs).unwrap();
            assert_eq!(over, step.done());
            if over {
                break;
            }
        }
    }
}
