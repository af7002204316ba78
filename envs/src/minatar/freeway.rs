//! Freeway: a chicken crosses eight lanes of traffic from the bottom to the top (spec §4).

use super::{mark, uniform, Action, Game, GameRng};
use rand::Rng;

const CHICKEN_COL: i32 = 4;
const COOLDOWN: u32 = 3;
const TIME_LIMIT: i32 = 2500;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Car {
    pub(crate) col: i32,
    pub(crate) timer: u32,
    /// Signed velocity: `|v|` in 1..=5 is the speed, the sign the direction (+ = right).
    pub(crate) v: i32,
}

impl Car {
    fn speed(&self) -> u32 {
        self.v.unsigned_abs()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Freeway {
    pub(crate) chicken_row: i32,
    pub(crate) cooldown: u32,
    pub(crate) time: i32,
    /// Car `i` drives on row `i + 1`.
    pub(crate) cars: [Car; 8],
    pub(crate) terminal: bool,
}

impl Freeway {
    pub fn chicken_row(&self) -> i32 {
        self.chicken_row
    }

    /// New speeds and directions for every car; columns are kept.
    fn randomize_cars(&mut self, rng: &mut GameRng) {
        let mut speeds = [0i32; 8];
        for s in &mut speeds {
            *s = rng.random_range(1..=5);
        }
        for (car, speed) in self.cars.iter_mut().zip(speeds) {
            let right = uniform(rng) > 0.5;
            car.v = if right { speed } else { -speed };
            car.timer = speed as u32;
        }
    }

    fn on_chicken(&self, car: &Car, lane: usize) -> bool {
        lane as i32 + 1 == self.chicken_row && car.col == CHICKEN_COL
    }
}

impl Game for Freeway {
    const NAME: &'static str = "freeway";
    const CHANNELS: usize = 7;
    const MINIMAL_ACTIONS: &'static [Action] = &[Action::Noop, Action::Up, Action::Down];

    fn new(_ramping: bool) -> Self {
        Self {
            chicken_row: 9,
            cooldown: COOLDOWN,
            time: TIME_LIMIT,
            cars: [Car {
                col: 0,
                timer: 1,
                v: 1,
            }; 8],
            terminal: false,
        }
    }

    fn reset(&mut self, rng: &mut GameRng) {
        *self = Self::new(false);
        self.randomize_cars(rng);
    }

    fn advance(&mut self, action: Action, rng: &mut GameRng) -> (u32, bool) {
        let mut reward = 0;
        if self.cooldown == 0 {
            match action {
                Action::Up => {
                    self.cooldown = COOLDOWN;
                    self.chicken_row = (self.chicken_row - 1).max(0);
                }
                Action::Down => {
                    self.cooldown = COOLDOWN;
                    self.chicken_row = (self.chicken_row + 1).min(9);
                }
                _ => {}
            }
        }
        if self.chicken_row == 0 {
            reward += 1;
            self.randomize_cars(rng);
            self.chicken_row = 9;
        }
        for lane in 0..8 {
            let mut car = self.cars[lane];
            if self.on_chicken(&car, lane) {
                self.chicken_row = 9;
            }
            if car.timer == 0 {
                car.timer = car.speed();
                car.col = (car.col + car.v.signum()).rem_euclid(10);
                if self.on_chicken(&car, lane) {
                    self.chicken_row = 9;
                }
            } else {
                car.timer -= 1;
            }
            self.cars[lane] = car;
        }
        self.cooldown = self.cooldown.saturating_sub(1);
        self.time -= 1;
        if self.time < 0 {
            self.terminal = true;
        }
        (reward, self.terminal)
    }

    fn render(&self, obs: &mut [f32]) {
        mark(obs, 0, self.chicken_row, CHICKEN_COL);
        for (lane, car) in self.cars.iter().enumerate() {
            let row = lane as i32 + 1;
            mark(obs, 1, row, car.col);
            let behind = (car.col - car.v.signum()).rem_euclid(10);
            mark(obs, 1 + car.speed() as usize, row, behind);
        }
    }

    fn is_terminal(&self) -> bool {
        self.terminal
    }
}

#[cfg(test)]
#[path = "freeway_tests.rs"]
mod tests;
