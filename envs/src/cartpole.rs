//! CartPole, exactly as Gymnasium's `CartPole-v1` (the 500-step time limit is added by
//! the registry's [`TimeLimit`](crate::wrappers::TimeLimit), as Gymnasium's `make` does).
//!
//! ```
//! use normrl_envs::{cartpole::CartPole, Env};
//!
//! let mut env = CartPole::new();
//! let mut obs = [0.0f32; 4];
//! env.reset(Some(1), &mut obs).unwrap();
//! assert!(obs.iter().all(|v| v.abs() <= 0.05));
//! let step = env.step(1, &mut obs).unwrap();
//! assert_eq!(step.reward, 1.0);
//! ```

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::env::{check_obs_len, whole_state};
use crate::render::Frame;
use crate::{ActionSpace, Env, EnvError, ObservationSpace, Step};

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_CART + MASS_POLE;
/// Half the pole's length.
const LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
pub const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
pub const X_THRESHOLD: f64 = 2.4;

/// Cart position, cart velocity, pole angle, pole angular velocity. Kept in `f64` as
/// Gymnasium does; observations are rounded to `f32`.
pub type State = [f64; 4];

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CartPole {
    state: State,
    rng: Xoshiro256PlusPlus,
    /// None before the first reset; Some(true) once the episode has terminated.
    terminated: Option<bool>,
}

impl Default for CartPole {
    fn default() -> Self {
        Self::new()
    }
}

impl CartPole {
    pub fn new() -> Self {
        Self {
            state: [0.0; 4],
            rng: Xoshiro256PlusPlus::seed_from_u64(0),
            terminated: None,
        }
    }

    /// Starts an episode from a given state `[x, x_dot, theta, theta_dot]` instead of
    /// a random one (to replay another implementation's trajectory).
    pub fn start_from(&mut self, state: [f64; 4], obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(4, obs)?;
        self.state = state;
        self.terminated = Some(false);
        self.write_obs(obs);
        Ok(())
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// One Euler step of the dynamics, Gymnasium's equations verbatim.
    pub fn dynamics(state: State, action: usize) -> State {
        let [x, x_dot, theta, theta_dot] = state;
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        let (sin, cos) = theta.sin_cos();
        let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
        let theta_acc = (GRAVITY * sin - cos * temp)
            / (LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
        let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
        [
            x + TAU * x_dot,
            x_dot + TAU * x_acc,
            theta + TAU * theta_dot,
            theta_dot + TAU * theta_acc,
        ]
    }

    /// Gymnasium's picture of `state` (`CartPole.render`, 600 x 400, the same sizes and
    /// colours), without its anti-aliased edges: every pixel is one of five colours.
    pub fn draw(state: State) -> Frame {
        const WIDTH: f64 = 600.0;
        const HEIGHT: f64 = 400.0;
        const SCALE: f64 = WIDTH / (2.0 * X_THRESHOLD);
        const CART_Y: f64 = 100.0;
        const POLE_WIDTH: f64 = 10.0;
        const POLE_LEN: f64 = SCALE * 2.0 * LENGTH;
        const BLACK: [u8; 3] = [0, 0, 0];
        let [x, _, theta, _] = state;
        let mut frame = Frame::filled(WIDTH as usize, HEIGHT as usize, [255, 255, 255]);
        // Gymnasium draws with y up and flips the surface; `up` is that y of a row.
        let up = |row: f64| HEIGHT - row;
        let cart_x = x * SCALE + WIDTH / 2.0;
        let track = up(CART_Y) as i64;
        frame.paint((0, 600), (track, track + 1), BLACK, |_, _| true);
        let (cx, cy) = (cart_x as i64, up(CART_Y) as i64);
        frame.paint((cx - 25, cx + 25), (cy - 15, cy + 15), BLACK, |_, _| true);
        // The pole, rotated by theta about the axle: a pixel is on it when its offset
        // from the axle, turned back by theta, lies in the upright pole's rectangle.
        let (ax, ay) = (cart_x, CART_Y + 30.0 / 4.0);
        let (sin, cos) = theta.sin_cos();
        let reach = (POLE_LEN + POLE_WIDTH) as i64;
        let (px, py) = (ax as i64, up(ay) as i64);
        frame.paint(
            (px - reach, px + reach),
            (py - reach, py + reach),
            [202, 152, 101],
            |col, row| {
                let (dx, dy) = (col - ax, up(row) - ay);
                let along = dx * sin + dy * cos;
                let across = dx * cos - dy * sin;
                across.abs() <= POLE_WIDTH / 2.0
                    && (-POLE_WIDTH / 2.0..=POLE_LEN - POLE_WIDTH / 2.0).contains(&along)
            },
        );
        let r = POLE_WIDTH / 2.0;
        frame.paint(
            (px - 6, px + 7),
            (py - 6, py + 7),
            [129, 132, 203],
            |col, row| (col - ax).powi(2) + (up(row) - ay).powi(2) <= r * r,
        );
        frame
    }

    fn write_obs(&self, obs: &mut [f32]) {
        for (o, s) in obs.iter_mut().zip(self.state) {
            *o = s as f32;
        }
    }
}

impl Env for CartPole {
    fn id(&self) -> &str {
        "classic/cartpole"
    }

    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace::floats(vec![4], f32::NEG_INFINITY, f32::INFINITY)
    }

    fn action_space(&self) -> ActionSpace {
        ActionSpace { n: 2 }
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_len(4, obs)?;
        if let Some(seed) = seed {
            self.rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        }
        for s in &mut self.state {
            *s = self.rng.random_range(-0.05..0.05);
        }
        self.terminated = Some(false);
        self.write_obs(obs);
        Ok(())
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        check_obs_len(4, obs)?;
        self.action_space().check(action)?;
        match self.terminated {
            None => return Err(EnvError::NeedsReset("CartPole stepped before reset".into())),
            Some(true) => {
                return Err(EnvError::NeedsReset(
                    "CartPole stepped after its episode terminated".into(),
                ))
            }
            Some(false) => {}
        }
        self.state = Self::dynamics(self.state, action);
        let [x, _, theta, _] = self.state;
        let terminated = !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
            || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta);
        self.terminated = Some(terminated);
        self.write_obs(obs);
        Ok(Step {
            reward: 1.0,
            terminated,
            truncated: false,
        })
    }

    whole_state!();

    fn render(&mut self) -> Result<Frame, EnvError> {
        Ok(Self::draw(self.state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_matches_hand_computed_gymnasium_equations() {
        // From state (0, 0, 0.1, 0) pushing right (action 1), by hand:
        // sin(0.1) = 0.0998334166, cos(0.1) = 0.9950041653
        // temp = (10 + 0.05*0*sin)/1.1 = 9.0909090909
        // theta_acc = (9.8*0.0998334166 - 0.9950041653*9.0909090909)
        //             / (0.5*(4/3 - 0.1*0.9900332889/1.1))
        //           = (0.9783674827 - 9.0454924118) / (0.5*(1.3333333333 - 0.0900030263))
        //           = -8.0671249291 / 0.6216651535 = -12.976641...
        // x_acc = 9.0909090909 - 0.05*(-12.976641)*0.9950041653/1.1 = 9.6778...
        let next = CartPole::dynamics([0.0, 0.0, 0.1, 0.0], 1);
        let theta_acc = -8.067_124_929_1 / 0.621_665_153_5;
        let x_acc = 9.090_909_090_9 - 0.05 * theta_acc * 0.995_004_165_3 / 1.1;
        assert!((next[0] - 0.0).abs() < 1e-12, "x uses the old velocity");
        assert!((next[1] - 0.02 * x_acc).abs() < 1e-9, "{next:?}");
        assert!(
            (next[2] - 0.1).abs() < 1e-12,
            "theta uses the old angular velocity"
        );
        assert!((next[3] - 0.02 * theta_acc).abs() < 1e-9, "{next:?}");
        assert!((theta_acc + 12.976_6).abs() < 1e-3);
    }

    #[test]
    fn left_push_is_mirror_of_right_push() {
        let s = [0.01, -0.02, 0.03, 0.04];
        let mirrored = [-0.01, 0.02, -0.03, -0.04];
        let a = CartPole::dynamics(s, 1);
        let b = CartPole::dynamics(mirrored, 0);
        for i in 0..4 {
            assert!((a[i] + b[i]).abs() < 1e-15);
        }
    }

    #[test]
    fn terminates_past_thresholds_with_reward_one() {
        let mut env = CartPole::new();
        let mut obs = [0.0f32; 4];
        // Just inside the angle threshold and falling: the next step crosses it.
        env.start_from([0.0, 0.0, THETA_THRESHOLD - 1e-4, 0.5], &mut obs)
            .unwrap();
        let step = env.step(1, &mut obs).unwrap();
        assert!(step.terminated);
        assert_eq!(step.reward, 1.0);
        assert!(matches!(
            env.step(1, &mut obs),
            Err(EnvError::NeedsReset(_))
        ));
        // Cart position threshold.
        env.start_from([X_THRESHOLD - 1e-3, 1.0, 0.0, 0.0], &mut obs)
            .unwrap();
        assert!(env.step(0, &mut obs).unwrap().terminated);
        // Exactly on the threshold is not terminal (Gymnasium tests x < -2.4 or x > 2.4).
        env.start_from([X_THRESHOLD, 0.0, 0.0, 0.0], &mut obs)
            .unwrap();
        let step = env.step(1, &mut obs).unwrap();
        assert!(!step.terminated, "x stays 2.4 after one step from rest");
    }

    #[test]
    fn reset_is_uniform_in_small_box_and_seeded() {
        let mut env = CartPole::new();
        let mut a = [0.0f32; 4];
        let mut b = [0.0f32; 4];
        env.reset(Some(42), &mut a).unwrap();
        env.reset(Some(42), &mut b).unwrap();
        assert_eq!(a, b);
        let mut min = [f64::MAX; 4];
        let mut max = [f64::MIN; 4];
        for _ in 0..2000 {
            env.reset(None, &mut a).unwrap();
            for i in 0..4 {
                min[i] = min[i].min(env.state()[i]);
                max[i] = max[i].max(env.state()[i]);
            }
        }
        for i in 0..4 {
            assert!(min[i] >= -0.05 && min[i] < -0.049, "{min:?}");
            assert!(max[i] < 0.05 && max[i] > 0.049, "{max:?}");
        }
    }

    #[test]
    fn draws_the_cart_and_the_pole_where_the_state_puts_them() {
        let upright = CartPole::draw([0.0, 0.0, 0.0, 0.0]);
        assert_eq!((upright.width, upright.height), (600, 400));
        assert_eq!(upright.pixel(280, 310), [0, 0, 0], "the cart, centred");
        assert_eq!(
            upright.pixel(300, 200),
            [202, 152, 101],
            "the pole, straight up"
        );
        assert_eq!(upright.pixel(300, 293), [129, 132, 203], "the axle");
        assert_eq!(upright.pixel(20, 300), [0, 0, 0], "the track");
        assert_eq!(upright.pixel(20, 200), [255, 255, 255]);
        // Cart at x = 1 (125 px right), pole leaning right by 0.2 rad: its top is
        // 100 px up along it is 100 * sin(0.2) = 20 px right of the axle.
        let moved = CartPole::draw([1.0, 0.0, 0.2, 0.0]);
        assert_eq!(moved.pixel(405, 310), [0, 0, 0]);
        assert_eq!(moved.pixel(280, 310), [255, 255, 255]);
        assert_eq!(moved.pixel(444, 194), [202, 152, 101]);
        assert_eq!(moved.pixel(425, 194), [255, 255, 255]);
    }

    #[test]
    fn always_right_falls_after_known_number_of_steps() {
        // From rest, pushing right tips the pole left; by integrating the equations the
        // angle passes -12 degrees on step 9 (checked with Gymnasium's own formula).
        let mut env = CartPole::new();
        let mut obs = [0.0f32; 4];
        env.start_from([0.0; 4], &mut obs).unwrap();
        let mut steps = 0;
        loop {
            steps += 1;
            if env.step(1, &mut obs).unwrap().terminated {
                break;
            }
        }
        assert_eq!(steps, 9);
        assert!(env.state()[2] < -THETA_THRESHOLD);
    }
}
