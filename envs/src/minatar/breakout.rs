//! Breakout: a paddle on the bottom row bounces a ball that breaks bricks (spec §2).

use super::{bit, mark, mark_mask, Action, Game, GameRng};
use rand::Rng;

/// Rows 1, 2 and 3 full of bricks.
const BRICK_ROWS: u128 = ((1u128 << 30) - 1) << 10;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Breakout {
    pub(crate) paddle: i32,
    pub(crate) ball: (i32, i32),
    /// Row and column change per step; each is -1 or +1.
    pub(crate) dir: (i32, i32),
    pub(crate) trail: (i32, i32),
    /// Bit `row * 10 + col` set where a brick stands.
    #[serde(with = "super::mask_serde")]
    pub(crate) bricks: u128,
    pub(crate) strike: bool,
    pub(crate) terminal: bool,
}

impl Breakout {
    pub fn paddle(&self) -> i32 {
        self.paddle
    }
    /// The ball's `(row, col)`.
    pub fn ball(&self) -> (i32, i32) {
        self.ball
    }
    pub fn trail(&self) -> (i32, i32) {
        self.trail
    }
    #[cfg(test)]
    pub fn brick_count(&self) -> u32 {
        self.bricks.count_ones()
    }
    pub fn strike(&self) -> bool {
        self.strike
    }
    fn has_brick(&self, row: i32, col: i32) -> bool {
        (0..10).contains(&row) && self.bricks & bit(row, col) != 0
    }
}

impl Game for Breakout {
    const NAME: &'static str = "breakout";
    const CHANNELS: usize = 4;
    const MINIMAL_ACTIONS: &'static [Action] = &[Action::Noop, Action::Left, Action::Right];

    fn new(_ramping: bool) -> Self {
        Self {
            paddle: 4,
            ball: (3, 0),
            dir: (1, 1),
            trail: (3, 0),
            bricks: BRICK_ROWS,
            strike: false,
            terminal: false,
        }
    }

    fn reset(&mut self, rng: &mut GameRng) {
        let from_right = rng.random_range(0..2) == 1;
        let (col, dir) = if from_right {
            (9, (1, -1))
        } else {
            (0, (1, 1))
        };
        *self = Self {
            paddle: 4,
            ball: (3, col),
            dir,
            trail: (3, col),
            bricks: BRICK_ROWS,
            strike: false,
            terminal: false,
        };
    }

    fn advance(&mut self, action: Action, _rng: &mut GameRng) -> (u32, bool) {
        match action {
            Action::Left => self.paddle = (self.paddle - 1).max(0),
            Action::Right => self.paddle = (self.paddle + 1).min(9),
            _ => {}
        }
        let (y0, x0) = self.ball;
        self.trail = self.ball;
        let (mut dy, mut dx) = self.dir;
        let mut row = y0 + dy;
        let mut col = x0 + dx;
        if !(0..10).contains(&col) {
            col = x0;
            dx = -dx;
        }
        let mut reward = 0;
        let mut touched_brick = false;
        if row == -1 {
            row = 0;
            dy = -dy;
        } else if self.has_brick(row, col) {
            touched_brick = true;
            if !self.strike {
                reward = 1;
                self.strike = true;
                self.bricks &= !bit(row, col);
                row = y0;
                dy = -dy;
            }
        } else if row == 9 {
            if self.bricks == 0 {
                self.bricks = BRICK_ROWS;
            }
            if self.paddle == x0 {
                dy = -dy;
                row = y0;
            } else if self.paddle == col {
                dy = -dy;
                dx = -dx;
                row = y0;
            } else {
                self.terminal = true;
            }
        }
        if !touched_brick {
            self.strike = false;
        }
        self.dir = (dy, dx);
        self.ball = (row, col);
        (reward, self.terminal)
    }

    fn render(&self, obs: &mut [f32]) {
        mark(obs, 0, 9, self.paddle);
        mark(obs, 1, self.ball.0, self.ball.1);
        mark(obs, 2, self.trail.0, self.trail.1);
        mark_mask(obs, 3, self.bricks);
    }

    fn is_terminal(&self) -> bool {
        self.terminal
    }
}

#[cfg(test)]
#[path = "breakout_tests.rs"]
mod tests;
