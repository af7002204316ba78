//! Space Invaders: a cannon on the bottom row shoots at a marching block of aliens that
//! shoots back (spec §6). The game has no randomness.

use super::{bit, mark, mark_mask, Action, Game, GameRng};

const SHOT_COOLDOWN: u32 = 5;
const MOVE_INTERVAL: u32 = 12;
const MIN_MOVE_INTERVAL: u32 = 6;
const ALIEN_SHOT_INTERVAL: u32 = 10;
/// All 100 cells.
const GRID: u128 = (1u128 << 100) - 1;
/// Rows 0..=3, columns 2..=7.
const ALIEN_BLOCK: u128 = {
    let mut m = 0u128;
    let mut r = 0;
    while r < 4 {
        let mut c = 2;
        while c < 8 {
            m |= bit(r, c);
            c += 1;
        }
        r += 1;
    }
    m
};
const COLUMN_0: u128 = {
    let mut m = 0u128;
    let mut r = 0;
    while r < 10 {
        m |= bit(r, 0);
        r += 1;
    }
    m
};
const COLUMN_9: u128 = COLUMN_0 << 9;
const ROW_9: u128 = ((1u128 << 10) - 1) << 90;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpaceInvaders {
    pub(crate) ramping: bool,
    pub(crate) cannon: i32,
    /// Bit `row * 10 + col` per grid.
    #[serde(with = "super::mask_serde")]
    pub(crate) aliens: u128,
    #[serde(with = "super::mask_serde")]
    pub(crate) player_bullets: u128,
    #[serde(with = "super::mask_serde")]
    pub(crate) enemy_bullets: u128,
    pub(crate) moving_left: bool,
    pub(crate) move_interval: u32,
    pub(crate) move_timer: u32,
    pub(crate) shot_timer: u32,
    pub(crate) ramp_index: u32,
    pub(crate) cooldown: u32,
    pub(crate) terminal: bool,
}

impl SpaceInvaders {
    pub fn cannon(&self) -> i32 {
        self.cannon
    }
    pub fn alien_count(&self) -> u32 {
        self.aliens.count_ones()
    }
    pub fn moving_left(&self) -> bool {
        self.moving_left
    }
    #[cfg(test)]
    pub fn player_bullet_count(&self) -> u32 {
        self.player_bullets.count_ones()
    }
    #[cfg(test)]
    pub fn enemy_bullet_count(&self) -> u32 {
        self.enemy_bullets.count_ones()
    }

    fn cannon_bit(&self) -> u128 {
        bit(9, self.cannon)
    }

    fn march(&mut self) {
        self.move_timer = self.alien_count().min(self.move_interval);
        let at_wall = if self.moving_left {
            self.aliens & COLUMN_0
        } else {
            self.aliens & COLUMN_9
        };
        if at_wall != 0 {
            self.moving_left = !self.moving_left;
            if self.aliens & ROW_9 != 0 {
                self.terminal = true;
            }
            self.aliens = ((self.aliens << 10) & GRID) | (self.aliens >> 90);
        } else if self.moving_left {
            self.aliens >>= 1;
        } else {
            self.aliens <<= 1;
        }
        if self.aliens & self.cannon_bit() != 0 {
            self.terminal = true;
        }
    }

    /// The lowest alien of the column nearest the cannon (ties go left) fires.
    fn alien_shot(&mut self) {
        let has_alien = |c: i32| (self.aliens >> c) & COLUMN_0 != 0;
        let column = (0..10)
            .filter(|&c| has_alien(c))
            .min_by_key(|&c| ((c - self.cannon).abs(), c));
        if let Some(c) = column {
            let lowest = (0..10).rev().find(|&r| self.aliens & bit(r, c) != 0);
            if let Some(r) = lowest {
                self.enemy_bullets |= bit(r, c);
            }
        }
    }
}

impl Game for SpaceInvaders {
    const NAME: &'static str = "space_invaders";
    const CHANNELS: usize = 6;
    const MINIMAL_ACTIONS: &'static [Action] =
        &[Action::Noop, Action::Left, Action::Right, Action::Fire];

    fn new(ramping: bool) -> Self {
        Self {
            ramping,
            cannon: 5,
            aliens: ALIEN_BLOCK,
            player_bullets: 0,
            enemy_bullets: 0,
            moving_left: true,
            move_interval: MOVE_INTERVAL,
            move_timer: MOVE_INTERVAL,
            shot_timer: ALIEN_SHOT_INTERVAL,
            ramp_index: 0,
            cooldown: 0,
            terminal: false,
        }
    }

    fn reset(&mut self, _rng: &mut GameRng) {
        *self = Self::new(self.ramping);
    }

    fn advance(&mut self, action: Action, _rng: &mut GameRng) -> (u32, bool) {
        match action {
            Action::Fire if self.cooldown == 0 => {
                self.player_bullets |= self.cannon_bit();
                self.cooldown = SHOT_COOLDOWN;
            }
            Action::Left => self.cannon = (self.cannon - 1).max(0),
            Action::Right => self.cannon = (self.cannon + 1).min(9),
            _ => {}
        }
        self.player_bullets >>= 10;
        self.enemy_bullets = (self.enemy_bullets << 10) & GRID;
        if self.enemy_bullets & self.cannon_bit() != 0 {
            self.terminal = true;
        }
        if self.aliens & self.cannon_bit() != 0 {
            self.terminal = true;
        }
        if self.move_timer == 0 {
            self.march();
        }
        if self.shot_timer == 0 {
            self.shot_timer = ALIEN_SHOT_INTERVAL;
            self.alien_shot();
        }
        let hits = self.aliens & self.player_bullets;
        self.aliens &= !hits;
        self.player_bullets &= !hits;
        self.cooldown = self.cooldown.saturating_sub(1);
        // Both countdowns are reloaded to at least 1 before they are decremented.
        self.move_timer -= 1;
        self.shot_timer -= 1;
        if self.aliens == 0 {
            if self.ramping && self.move_interval > MIN_MOVE_INTERVAL {
                self.move_interval -= 1;
                self.ramp_index += 1;
            }
            self.aliens = ALIEN_BLOCK;
        }
        (hits.count_ones(), self.terminal)
    }

    fn render(&self, obs: &mut [f32]) {
        mark(obs, 0, 9, self.cannon);
        mark_mask(obs, 1, self.aliens);
        mark_mask(obs, if self.moving_left { 2 } else { 3 }, self.aliens);
        mark_mask(obs, 4, self.player_bullets);
        mark_mask(obs, 5, self.enemy_bullets);
    }

    fn is_terminal(&self) -> bool {
        self.terminal
    }

    fn ramp_index(&self) -> Option<u32> {
        Some(self.ramp_index)
    }
}

#[cfg(test)]
#[path = "space_invaders_tests.rs"]
mod tests;
