//! Asterix: the player moves freely while enemies and gold cross the screen in eight
//! lanes; gold gives reward, enemies kill (spec §3).

use super::{mark, uniform, Action, Game, GameRng};
use rand::Rng;

const SPAWN_INTERVAL: u32 = 10;
const MOVE_INTERVAL: u32 = 5;
const RAMP_PERIOD: i32 = 100;

/// An enemy or a piece of gold in a lane; its row is the lane's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Entity {
    pub(crate) col: i32,
    pub(crate) right: bool,
    pub(crate) gold: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Asterix {
    pub(crate) ramping: bool,
    pub(crate) player: (i32, i32),
    /// Lane `i` is row `i + 1`.
    pub(crate) lanes: [Option<Entity>; 8],
    pub(crate) spawn_interval: u32,
    pub(crate) spawn_timer: u32,
    pub(crate) move_interval: u32,
    pub(crate) move_timer: u32,
    pub(crate) ramp_timer: i32,
    pub(crate) ramp_index: u32,
    pub(crate) terminal: bool,
}

impl Asterix {
    pub fn player(&self) -> (i32, i32) {
        self.player
    }
    /// (spawn interval, move interval).
    pub fn intervals(&self) -> (u32, u32) {
        (self.spawn_interval, self.move_interval)
    }

    fn spawn(&mut self, rng: &mut GameRng) {
        let right = uniform(rng) < 0.5;
        let gold = uniform(rng) < 1.0 / 3.0;
        let free = self.lanes.iter().filter(|l| l.is_none()).count();
        if free == 0 {
            return;
        }
        let k = rng.random_range(0..free);
        let lane = self
            .lanes
            .iter_mut()
            .filter(|l| l.is_none())
            .nth(k)
            .expect("k < number of free lanes");
        *lane = Some(Entity {
            col: if right { 0 } else { 9 },
            right,
            gold,
        });
    }

    /// Resolves an entity on the player's cell: gold is collected, an enemy kills.
    fn contact(&mut self, lane: usize, reward: &mut u32) {
        if let Some(e) = self.lanes[lane] {
            if (lane as i32 + 1, e.col) == self.player {
                if e.gold {
                    self.lanes[lane] = None;
                    *reward += 1;
                } else {
                    self.terminal = true;
                }
            }
        }
    }
}

impl Game for Asterix {
    const NAME: &'static str = "asterix";
    const CHANNELS: usize = 4;
    const MINIMAL_ACTIONS: &'static [Action] = &[
        Action::Noop,
        Action::Left,
        Action::Up,
        Action::Right,
        Action::Down,
    ];

    fn new(ramping: bool) -> Self {
        Self {
            ramping,
            player: (5, 5),
            lanes: [None; 8],
            spawn_interval: SPAWN_INTERVAL,
            spawn_timer: SPAWN_INTERVAL,
            move_interval: MOVE_INTERVAL,
            move_timer: MOVE_INTERVAL,
            ramp_timer: RAMP_PERIOD,
            ramp_index: 0,
            terminal: false,
        }
    }

    fn reset(&mut self, _rng: &mut GameRng) {
        *self = Self::new(self.ramping);
    }

    fn advance(&mut self, action: Action, rng: &mut GameRng) -> (u32, bool) {
        let mut reward = 0;
        if self.spawn_timer == 0 {
            self.spawn(rng);
            self.spawn_timer = self.spawn_interval;
        }
        let (row, col) = &mut self.player;
        match action {
            Action::Left => *col = (*col - 1).max(0),
            Action::Right => *col = (*col + 1).min(9),
            Action::Up => *row = (*row - 1).max(1),
            Action::Down => *row = (*row + 1).min(8),
            _ => {}
        }
        for lane in 0..8 {
            self.contact(lane, &mut reward);
        }
        if self.move_timer == 0 {
            self.move_timer = self.move_interval;
            for lane in 0..8 {
                if let Some(e) = &mut self.lanes[lane] {
                    e.col += if e.right { 1 } else { -1 };
                    if !(0..10).contains(&e.col) {
                        self.lanes[lane] = None;
                    } else {
                        self.contact(lane, &mut reward);
                    }
                }
            }
        }
        // Countdowns reach 0 exactly on the step before they fire, so they never wrap.
        self.spawn_timer -= 1;
        self.move_timer -= 1;
        if self.ramping && (self.spawn_interval > 1 || self.move_interval > 1) {
            if self.ramp_timer >= 0 {
                self.ramp_timer -= 1;
            } else {
                if self.move_interval > 1 && self.ramp_index % 2 == 1 {
                    self.move_interval -= 1;
                }
                if self.spawn_interval > 1 {
                    self.spawn_interval -= 1;
                }
                self.ramp_index += 1;
                self.ramp_timer = RAMP_PERIOD;
            }
        }
        (reward, self.terminal)
    }

    fn render(&self, obs: &mut [f32]) {
        mark(obs, 0, self.player.0, self.player.1);
        for (lane, e) in self.lanes.iter().enumerate() {
            if let Some(e) = e {
                let row = lane as i32 + 1;
                mark(obs, if e.gold { 3 } else { 1 }, row, e.col);
                mark(obs, 2, row, if e.right { e.col - 1 } else { e.col + 1 });
            }
        }
    }

    fn is_terminal(&self) -> bool {
        self.terminal
    }

    fn ramp_index(&self) -> Option<u32> {
        Some(self.ramp_index)
    }
}

#[cfg(test)]
#[path = "asterix_tests.rs"]
mod tests;
