//! The five MinAtar-style games (Breakout, Asterix, Freeway, Seaquest, Space Invaders),
//! written from a description of MinAtar's rules (not from its source; see
//! `docs/environments.md` for how they are checked against it), and the common wrapper that adds sticky
//! actions and seeding.
//!
//! Observations are `[C, 10, 10]` channels-first `f32` grids of 0.0 and 1.0.
//!
//! ```
//! use normrl_envs::minatar::{Breakout, MinAtar, MinAtarConfig};
//! use normrl_envs::Env;
//!
//! let mut env = MinAtar::<Breakout>::new(MinAtarConfig { sticky: 0.0, ..Default::default() });
//! let mut obs = vec![0.0f32; 400];
//! env.reset(Some(3), &mut obs).unwrap();
//! let paddle = &obs[9 * 10..10 * 10]; // channel 0, row 9
//! assert_eq!(paddle[4], 1.0);
//! ```

mod asterix;
mod breakout;
pub mod display;
mod freeway;
mod seaquest;
mod space_invaders;
#[cfg(test)]
mod test_support;

pub use asterix::Asterix;
pub use breakout::Breakout;
pub use freeway::Freeway;
pub use seaquest::Seaquest;
pub use space_invaders::SpaceInvaders;

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::env::{check_obs_len, whole_state};
use crate::{ActionSpace, Env, EnvError, Frame, ObservationSpace, Step};

/// The random stream shared by the wrapper's sticky draws and the game's draws.
pub type GameRng = Xoshiro256PlusPlus;

/// Serializes 100-bit grid masks as decimal strings: JSON numbers stop at 64 bits.
pub(crate) mod mask_serde {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mask: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&mask.to_string())
    }

    /// Also reads plain numbers, which states saved before this format hold.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Mask {
            Text(String),
            Number(u64),
        }
        match Mask::deserialize(d)? {
            Mask::Text(s) => s.parse().map_err(D::Error::custom),
            Mask::Number(n) => Ok(u128::from(n)),
        }
    }
}

/// Grid side length.
pub const SIZE: usize = 10;
const CELLS: usize = SIZE * SIZE;

/// The six actions every game accepts, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Action {
    Noop = 0,
    Left = 1,
    Up = 2,
    Right = 3,
    Down = 4,
    Fire = 5,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::Noop,
        Action::Left,
        Action::Up,
        Action::Right,
        Action::Down,
        Action::Fire,
    ];
}

/// One game's rules. The wrapper [`MinAtar`] drives it.
pub trait Game: Clone + Send + serde::Serialize + serde::de::DeserializeOwned + 'static {
    const NAME: &'static str;
    const CHANNELS: usize;
    /// The action indices that can matter in this game.
    const MINIMAL_ACTIONS: &'static [Action];

    fn new(ramping: bool) -> Self;
    /// Re-initializes the state, drawing from `rng` where the game's rules say so.
    fn reset(&mut self, rng: &mut GameRng);
    /// One game step: a no-op returning `(0, true)` once terminal (a finished game is
    /// frozen), else [`Game::advance`].
    fn step(&mut self, action: Action, rng: &mut GameRng) -> (u32, bool) {
        if self.is_terminal() {
            return (0, true);
        }
        self.advance(action, rng)
    }
    /// One step of a game that has not ended: its reward, and whether it ended now.
    fn advance(&mut self, action: Action, rng: &mut GameRng) -> (u32, bool);
    /// Sets the cells of this state in `obs` (`[C, 10, 10]`), which is all zeros on
    /// entry.
    fn render(&self, obs: &mut [f32]);
    fn is_terminal(&self) -> bool;
    /// The difficulty level, for games that ramp.
    fn ramp_index(&self) -> Option<u32> {
        None
    }
}

/// Marks cell `(row, col)` of `channel`; cells outside the grid are not drawn.
#[inline]
pub(crate) fn mark(obs: &mut [f32], channel: usize, row: i32, col: i32) {
    if (0..SIZE as i32).contains(&row) && (0..SIZE as i32).contains(&col) {
        obs[channel * CELLS + row as usize * SIZE + col as usize] = 1.0;
    }
}

/// Marks every set bit of a 100-bit grid mask (bit `row * 10 + col`) in `channel`.
#[inline]
pub(crate) fn mark_mask(obs: &mut [f32], channel: usize, mut mask: u128) {
    let plane = &mut obs[channel * CELLS..(channel + 1) * CELLS];
    while mask != 0 {
        plane[mask.trailing_zeros() as usize] = 1.0;
        mask &= mask - 1;
    }
}

/// The bit of cell `(row, col)` in a 100-bit grid mask.
#[inline]
pub(crate) const fn bit(row: i32, col: i32) -> u128 {
    1u128 << (row as u32 * SIZE as u32 + col as u32)
}

/// Construction options of the wrapper.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinAtarConfig {
    /// Probability that the previously executed action repeats instead of the chosen one.
    pub sticky: f64,
    /// Difficulty ramping (Asterix, Seaquest, Space Invaders).
    pub ramping: bool,
    /// Expose only the game's minimal action set (action `i` means its `i`-th entry).
    pub minimal_actions: bool,
}

impl Default for MinAtarConfig {
    fn default() -> Self {
        Self {
            sticky: 0.1,
            ramping: true,
            minimal_actions: false,
        }
    }
}

/// A game plus sticky actions and a seeded random stream (the spec's section 1).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MinAtar<G> {
    game: G,
    rng: GameRng,
    sticky: f64,
    minimal_actions: bool,
    previous_action: Action,
    id: String,
    has_reset: bool,
}

impl<G: Game> MinAtar<G> {
    pub fn new(config: MinAtarConfig) -> Self {
        Self {
            game: G::new(config.ramping),
            rng: GameRng::seed_from_u64(0),
            sticky: config.sticky,
            minimal_actions: config.minimal_actions,
            previous_action: Action::Noop,
            id: format!("minatar/{}", G::NAME),
            has_reset: false,
        }
    }

    pub fn game(&self) -> &G {
        &self.game
    }

    /// The action executed last (after the sticky replacement).
    pub fn previous_action(&self) -> Action {
        self.previous_action
    }

    fn draw(&self, obs: &mut [f32]) {
        obs.fill(0.0);
        self.game.render(obs);
    }

    /// Maps an agent's action index to a game action, rejecting out-of-range indices.
    fn decode(&self, action: usize) -> Result<Action, EnvError> {
        self.action_space().check(action)?;
        Ok(if self.minimal_actions {
            G::MINIMAL_ACTIONS[action]
        } else {
            Action::ALL[action]
        })
    }
}

impl<G: Game> Env for MinAtar<G> {
    fn id(&self) -> &str {
        &self.id
    }

    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace {
            shape: vec![G::CHANNELS, SIZE, SIZE],
            low: 0.0,
            high: 1.0,
            binary: true,
            bytes: false,
        }
    }

    fn action_space(&self) -> ActionSpace {
        ActionSpace {
            n: if self.minimal_actions {
                G::MINIMAL_ACTIONS.len()
            } else {
                Action::ALL.len()
            },
        }
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(G::CHANNELS * CELLS, obs)?;
        if let Some(seed) = seed {
            self.rng = GameRng::seed_from_u64(seed);
        }
        self.game.reset(&mut self.rng);
        self.has_reset = true;
        self.draw(obs);
        Ok(())
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        check_obs_len(G::CHANNELS * CELLS, obs)?;
        let mut action = self.decode(action)?;
        if !self.has_reset {
            return Err(EnvError::NeedsReset(format!(
                "{} stepped before reset",
                self.id
            )));
        }
        // The sticky draw happens on every call, whatever p is and also after the end.
        let u: f64 = self.rng.random();
        if u < self.sticky {
            action = self.previous_action;
        }
        self.previous_action = action;
        let (reward, terminal) = self.game.step(action, &mut self.rng);
        self.draw(obs);
        Ok(Step {
            reward: reward as f32,
            terminated: terminal,
            truncated: false,
        })
    }

    whole_state!();

    /// The observation's picture ([`display`]): one pixel a cell.
    fn render(&mut self) -> Result<Frame, EnvError> {
        let mut obs = vec![0.0; G::CHANNELS * CELLS];
        self.draw(&mut obs);
        Ok(display::observation_frame(&obs, G::CHANNELS))
    }
}

/// Uniform draw in [0, 1), the form of every "uniform" in the spec.
#[inline]
pub(crate) fn uniform(rng: &mut GameRng) -> f64 {
    rng.random()
}

#[cfg(test)]
mod tests {
    use super::test_support::started;
    use super::*;

    #[test]
    fn sticky_repeats_previous_executed_action_and_survives_reset() {
        let (mut env, mut obs) = started::<Breakout>(1.0, 0);
        // p = 1: the previous action (no-op at creation) is always executed.
        env.step(3, &mut obs).unwrap();
        assert_eq!(env.previous_action(), Action::Noop);
        assert_eq!(env.game().paddle(), 4, "right was replaced by no-op");

        let (mut env, mut obs) = started::<Breakout>(0.0, 0);
        env.step(1, &mut obs).unwrap();
        assert_eq!(env.previous_action(), Action::Left);
        env.sticky = 1.0;
        env.reset(None, &mut obs).unwrap();
        env.step(3, &mut obs).unwrap();
        assert_eq!(env.game().paddle(), 3, "left carried over the reset");
    }

    #[test]
    fn sticky_rate_is_p() {
        let mut env = MinAtar::<Breakout>::new(MinAtarConfig::default());
        let mut obs = vec![0.0; 400];
        env.reset(Some(5), &mut obs).unwrap();
        let (mut repeats, n) = (0, 20_000);
        for i in 0..n {
            // Alternate two actions so that a repeat is visible.
            let a = if i % 2 == 0 { 1 } else { 3 };
            let before = env.previous_action();
            env.step(a, &mut obs).unwrap();
            if env.previous_action() != Action::ALL[a] {
                assert_eq!(env.previous_action(), before);
                repeats += 1;
            }
            if env.game().is_terminal() {
                env.reset(None, &mut obs).unwrap();
            }
        }
        // Repeats of the same action are invisible, so the visible rate is p * P(differ).
        let rate = repeats as f64 / n as f64;
        assert!((0.06..0.11).contains(&rate), "visible repeat rate {rate}");
    }

    #[test]
    fn minimal_actions_map_to_game_actions_and_range_is_checked() {
        let mut env = MinAtar::<Breakout>::new(MinAtarConfig {
            sticky: 0.0,
            minimal_actions: true,
            ..Default::default()
        });
        assert_eq!(env.action_space().n, 3);
        let mut obs = vec![0.0; 400];
        env.reset(Some(0), &mut obs).unwrap();
        env.step(2, &mut obs).unwrap(); // minimal index 2 = right
        assert_eq!(env.game().paddle(), 5);
        let err = env.step(3, &mut obs).unwrap_err();
        assert_eq!(err, EnvError::InvalidAction { action: 3, n: 3 });
        assert!(err.to_string().contains("0..3"));
        let mut short = vec![0.0; 10];
        assert!(matches!(
            env.step(0, &mut short),
            Err(EnvError::ObservationBuffer {
                expected: 400,
                got: 10
            })
        ));
    }

    fn check_resume<G: Game>() {
        let config = MinAtarConfig::default();
        let mut env = MinAtar::<G>::new(config);
        let mut obs = vec![0.0; G::CHANNELS * 100];
        env.reset(Some(2), &mut obs).unwrap();
        // Play into the game (resetting at episode ends) so that late-game state such
        // as bullets on row 9 exists, then save and compare the continuations.
        for i in 0..400 {
            if env.step((i * 7 + i / 3) % 6, &mut obs).unwrap().terminated {
                env.reset(None, &mut obs).unwrap();
            }
        }
        let saved = env.save_state().unwrap();
        let mut copy = MinAtar::<G>::new(config);
        copy.load_state(&serde_json::from_str(&saved.to_string()).unwrap())
            .unwrap();
        let mut obs2 = obs.clone();
        for i in 0..300 {
            let a = env.step(i % 5, &mut obs).unwrap();
            let b = copy.step(i % 5, &mut obs2).unwrap();
            assert_eq!((a, &obs), (b, &obs2), "{}", G::NAME);
            if a.terminated {
                env.reset(None, &mut obs).unwrap();
                copy.reset(None, &mut obs2).unwrap();
            }
        }
    }

    #[test]
    fn saved_state_resumes_the_same_episode_in_every_game() {
        check_resume::<Breakout>();
        check_resume::<Asterix>();
        check_resume::<Freeway>();
        check_resume::<Seaquest>();
        check_resume::<SpaceInvaders>();
        // Masks with bits above 64 survive the round trip.
        let mut si = MinAtar::<SpaceInvaders>::new(MinAtarConfig::default());
        si.game.enemy_bullets = bit(9, 9) | bit(0, 0);
        let mut back = MinAtar::<SpaceInvaders>::new(MinAtarConfig::default());
        back.load_state(&si.save_state().unwrap()).unwrap();
        assert_eq!(back.game().enemy_bullet_count(), 2);
        assert_eq!(back.game().enemy_bullets, si.game.enemy_bullets);
    }

    #[test]
    fn step_before_reset_is_an_error() {
        let mut env = MinAtar::<Asterix>::new(MinAtarConfig::default());
        let mut obs = vec![0.0; 400];
        assert!(matches!(
            env.step(0, &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
    }
}
