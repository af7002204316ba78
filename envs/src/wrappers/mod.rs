//! Wrappers that add behaviour around any [`Env`](crate::Env).

/// Writes the `Env` methods a wrapper passes through to its `inner` environment (id,
/// spaces and rendering), and its `save_state`/`load_state`: the inner state under `"inner"`
/// and the wrapper's own field under that field's name.
macro_rules! pass_through {
    (state: $field:ident) => {
        fn id(&self) -> &str {
            self.inner.id()
        }

        fn observation_space(&self) -> $crate::ObservationSpace {
            self.inner.observation_space()
        }

        fn action_space(&self) -> $crate::ActionSpace {
            self.inner.action_space()
        }

        fn render(&mut self) -> Result<$crate::Frame, $crate::EnvError> {
            self.inner.render()
        }

        fn save_state(&self) -> Result<serde_json::Value, $crate::EnvError> {
            let inner = self.inner.save_state()?;
            Ok(serde_json::json!({ "inner": inner, stringify!($field): self.$field }))
        }

        fn load_state(&mut self, state: &serde_json::Value) -> Result<(), $crate::EnvError> {
            self.$field = $crate::env::from_state(&state[stringify!($field)])?;
            self.inner.load_state(&state["inner"])
        }
    };
}

mod monitor;
mod time_limit;

pub use monitor::Monitor;
pub use time_limit::TimeLimit;

#[cfg(test)]
mod tests {
    use super::{Monitor, TimeLimit};
    use crate::cartpole::CartPole;
    use crate::Env;

    #[test]
    fn wrapped_state_round_trips_with_each_wrappers_own_field() {
        let mut env = Monitor::new(TimeLimit::new(CartPole::new(), 500));
        let mut obs = [0.0f32; 4];
        env.reset(Some(3), &mut obs).unwrap();
        for action in [0, 1, 1, 0, 1] {
            env.step(action, &mut obs).unwrap();
        }
        let state = env.save_state().unwrap();
        assert_eq!(state["stats"]["current_length"], 5);
        assert_eq!(state["inner"]["elapsed"], 5);
        let mut again = Monitor::new(TimeLimit::new(CartPole::new(), 500));
        again.load_state(&state).unwrap();
        assert_eq!(again.save_state().unwrap(), state);
        let mut other = [0.0f32; 4];
        let (a, b) = (
            env.step(1, &mut obs).unwrap(),
            again.step(1, &mut other).unwrap(),
        );
        assert_eq!((a.reward, obs), (b.reward, other));
        assert_eq!(env.episode_stats(), again.episode_stats());
    }
}
