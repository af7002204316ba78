//! Seaquest: a two-cell submarine shoots enemies, rescues divers and must surface for
//! oxygen (spec §5).

use super::{mark, uniform, Action, Game, GameRng};
use rand::Rng;

const MAX_OXYGEN: i32 = 200;
const ENEMY_SPAWN_INTERVAL: u32 = 20;
const DIVER_SPAWN_INTERVAL: u32 = 30;
const ENEMY_MOVE_INTERVAL: u32 = 5;
const SHOT_COOLDOWN: u32 = 5;
const ENEMY_SHOT_INTERVAL: u32 = 10;
const DIVER_MOVE_INTERVAL: u32 = 5;
const MAX_DIVERS: i32 = 6;

/// A bullet, fish, enemy sub or diver: its cell, direction and countdowns (unused ones
/// stay 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Mover {
    pub(crate) row: i32,
    pub(crate) col: i32,
    pub(crate) right: bool,
    pub(crate) move_timer: u32,
    pub(crate) shot_timer: u32,
}

impl Mover {
    fn new(row: i32, col: i32, right: bool) -> Self {
        Self {
            row,
            col,
            right,
            move_timer: 0,
            shot_timer: 0,
        }
    }

    /// Moves one column; returns false when that leaves the grid.
    fn advance(&mut self) -> bool {
        self.col += if self.right { 1 } else { -1 };
        (0..10).contains(&self.col)
    }

    fn at(&self, cell: (i32, i32)) -> bool {
        (self.row, self.col) == cell
    }

    fn behind(&self) -> i32 {
        if self.right {
            self.col - 1
        } else {
            self.col + 1
        }
    }
}

/// Index of the oldest entry on `cell`.
fn oldest_at(list: &[Mover], cell: (i32, i32)) -> Option<usize> {
    list.iter().position(|m| m.at(cell))
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seaquest {
    pub(crate) ramping: bool,
    pub(crate) oxygen: i32,
    /// Signed: a full load leaves -1 after surfacing (spec §8).
    pub(crate) divers_aboard: i32,
    pub(crate) player: (i32, i32),
    pub(crate) facing_right: bool,
    pub(crate) surfaced: bool,
    pub(crate) shot_cooldown: u32,
    pub(crate) enemy_spawn_interval: u32,
    pub(crate) enemy_spawn_timer: u32,
    pub(crate) diver_spawn_timer: u32,
    pub(crate) enemy_move_interval: u32,
    pub(crate) ramp_index: u32,
    pub(crate) terminal: bool,
    pub(crate) player_bullets: Vec<Mover>,
    pub(crate) enemy_bullets: Vec<Mover>,
    pub(crate) fish: Vec<Mover>,
    pub(crate) subs: Vec<Mover>,
    pub(crate) divers: Vec<Mover>,
}

impl Seaquest {
    pub fn oxygen(&self) -> i32 {
        self.oxygen
    }
    pub fn divers_aboard(&self) -> i32 {
        self.divers_aboard
    }
    pub fn player(&self) -> (i32, i32) {
        self.player
    }

    fn spawn_enemy(&mut self, rng: &mut GameRng) {
        let right = uniform(rng) < 0.5;
        let is_sub = uniform(rng) < 1.0 / 3.0;
        let row = rng.random_range(1..=8);
        let blocked = self
            .fish
            .iter()
            .chain(&self.subs)
            .any(|e| e.row == row && e.right != right);
        if blocked {
            return;
        }
        let mut enemy = Mover::new(row, if right { 0 } else { 9 }, right);
        enemy.move_timer = self.enemy_move_interval;
        if is_sub {
            enemy.shot_timer = ENEMY_SHOT_INTERVAL;
            self.subs.push(enemy);
        } else {
            self.fish.push(enemy);
        }
    }

    fn spawn_diver(&mut self, rng: &mut GameRng) {
        let right = uniform(rng) < 0.5;
        let row = rng.random_range(1..=8);
        let mut diver = Mover::new(row, if right { 0 } else { 9 }, right);
        diver.move_timer = DIVER_MOVE_INTERVAL;
        self.divers.push(diver);
    }

    fn act(&mut self, action: Action) {
        let (row, col) = &mut self.player;
        match action {
            Action::Fire if self.shot_cooldown == 0 => {
                let bullet = Mover::new(*row, *col, self.facing_right);
                self.player_bullets.push(bullet);
                self.shot_cooldown = SHOT_COOLDOWN;
            }
            Action::Left => {
                *col = (*col - 1).max(0);
                self.facing_right = false;
            }
            Action::Right => {
                *col = (*col + 1).min(9);
                self.facing_right = true;
            }
            Action::Up => *row = (*row - 1).max(0),
            Action::Down => *row = (*row + 1).min(8),
            _ => {}
        }
    }

    fn move_player_bullets(&mut self) -> u32 {
        let mut reward = 0;
        for i in (0..self.player_bullets.len()).rev() {
            let bullet = &mut self.player_bullets[i];
            if !bullet.advance() {
                self.player_bullets.remove(i);
                continue;
            }
            let cell = (bullet.row, bullet.col);
            if let Some(j) = oldest_at(&self.fish, cell) {
                self.fish.remove(j);
            } else if let Some(j) = oldest_at(&self.subs, cell) {
                self.subs.remove(j);
            } else {
                continue;
            }
            self.player_bullets.remove(i);
            reward += 1;
        }
        reward
    }

    /// Tries to take the diver at `i` aboard; true when it was removed.
    fn rescue(&mut self, i: usize) -> bool {
        if self.divers[i].at(self.player) && self.divers_aboard < MAX_DIVERS {
            self.divers.remove(i);
            self.divers_aboard += 1;
            true
        } else {
            false
        }
    }

    fn move_divers(&mut self) {
        for i in (0..self.divers.len()).rev() {
            if self.rescue(i) {
                continue;
            }
            let diver = &mut self.divers[i];
            if diver.move_timer == 0 {
                diver.move_timer = DIVER_MOVE_INTERVAL;
                if !diver.advance() {
                    self.divers.remove(i);
                } else {
                    self.rescue(i);
                }
            } else {
                diver.move_timer -= 1;
            }
        }
    }

    /// Phases 6a-6b (subs) and 8 (fish): contact, motion, collision with a player
    /// bullet. Returns the reward; sets `terminal` on contact.
    fn move_enemies(&mut self, subs: bool) -> u32 {
        let mut reward = 0;
        let len = if subs {
            self.subs.len()
        } else {
            self.fish.len()
        };
        for i in (0..len).rev() {
            let list = if subs { &mut self.subs } else { &mut self.fish };
            let enemy = &mut list[i];
            if enemy.at(self.player) {
                self.terminal = true;
            }
            if enemy.move_timer == 0 {
                enemy.move_timer = self.enemy_move_interval;
                if !enemy.advance() {
                    let mut gone = list.remove(i);
                    if subs {
                        self.fire_if_ready(&mut gone);
                    }
                    continue;
                }
                if enemy.at(self.player) {
                    self.terminal = true;
                } else if let Some(j) = oldest_at(&self.player_bullets, (enemy.row, enemy.col)) {
                    let mut gone = list.remove(i);
                    self.player_bullets.remove(j);
                    reward += 1;
                    if subs {
                        self.fire_if_ready(&mut gone);
                    }
                    continue;
                }
            } else {
                enemy.move_timer -= 1;
            }
            if subs {
                let mut sub = self.subs[i];
                self.fire_if_ready(&mut sub);
                self.subs[i] = sub;
            }
        }
        reward
    }

    /// Phase 6c, also for a sub removed in 6b this step: it fires when its countdown is
    /// 0, else counts down.
    fn fire_if_ready(&mut self, sub: &mut Mover) {
        if sub.shot_timer == 0 {
            sub.shot_timer = ENEMY_SHOT_INTERVAL;
            self.enemy_bullets
                .push(Mover::new(sub.row, sub.col, sub.right));
        } else {
            sub.shot_timer -= 1;
        }
    }

    fn move_enemy_bullets(&mut self) {
        for i in (0..self.enemy_bullets.len()).rev() {
            let bullet = &mut self.enemy_bullets[i];
            if bullet.at(self.player) {
                self.terminal = true;
            }
            if !bullet.advance() {
                self.enemy_bullets.remove(i);
            } else if bullet.at(self.player) {
                self.terminal = true;
            }
        }
    }

    /// Phase 10: oxygen, surfacing, and the ramp at each surfacing event.
    fn breathe(&mut self) -> u32 {
        let mut reward = 0;
        if self.oxygen <= 0 {
            self.terminal = true;
        }
        if self.player.0 > 0 {
            self.oxygen -= 1;
            self.surfaced = false;
        } else if !self.surfaced {
            if self.divers_aboard == 0 {
                self.terminal = true;
            } else {
                self.surfaced = true;
                if self.divers_aboard == MAX_DIVERS {
                    self.divers_aboard = 0;
                    reward = (self.oxygen * 10 / MAX_OXYGEN) as u32;
                }
                self.oxygen = MAX_OXYGEN;
                self.divers_aboard -= 1;
                self.ramp();
            }
        }
        reward
    }

    fn ramp(&mut self) {
        if self.ramping && (self.enemy_spawn_interval > 1 || self.enemy_move_interval > 2) {
            if self.enemy_move_interval > 2 && self.ramp_index % 2 == 1 {
                self.enemy_move_interval -= 1;
            }
            if self.enemy_spawn_interval > 1 {
                self.enemy_spawn_interval -= 1;
            }
            self.ramp_index += 1;
        }
    }
}

impl Game for Seaquest {
    const NAME: &'static str = "seaquest";
    const CHANNELS: usize = 10;
    const MINIMAL_ACTIONS: &'static [Action] = &Action::ALL;

    fn new(ramping: bool) -> Self {
        Self {
            ramping,
            oxygen: MAX_OXYGEN,
            divers_aboard: 0,
            player: (0, 5),
            facing_right: false,
            surfaced: true,
            shot_cooldown: 0,
            enemy_spawn_interval: ENEMY_SPAWN_INTERVAL,
            enemy_spawn_timer: ENEMY_SPAWN_INTERVAL,
            diver_spawn_timer: DIVER_SPAWN_INTERVAL,
            enemy_move_interval: ENEMY_MOVE_INTERVAL,
            ramp_index: 0,
            terminal: false,
            player_bullets: Vec::with_capacity(16),
            enemy_bullets: Vec::with_capacity(16),
            fish: Vec::with_capacity(16),
            subs: Vec::with_capacity(16),
            divers: Vec::with_capacity(16),
        }
    }

    fn reset(&mut self, _rng: &mut GameRng) {
        // Keep the lists' allocations across episodes.
        let mut lists = [
            std::mem::take(&mut self.player_bullets),
            std::mem::take(&mut self.enemy_bullets),
            std::mem::take(&mut self.fish),
            std::mem::take(&mut self.subs),
            std::mem::take(&mut self.divers),
        ];
        lists.iter_mut().for_each(Vec::clear);
        let [player_bullets, enemy_bullets, fish, subs, divers] = lists;
        *self = Self {
            player_bullets,
            enemy_bullets,
            fish,
            subs,
            divers,
            ..Self::new(self.ramping)
        };
    }

    fn advance(&mut self, action: Action, rng: &mut GameRng) -> (u32, bool) {
        if self.enemy_spawn_timer == 0 {
            self.spawn_enemy(rng);
            self.enemy_spawn_timer = self.enemy_spawn_interval;
        }
        if self.diver_spawn_timer == 0 {
            self.spawn_diver(rng);
            self.diver_spawn_timer = DIVER_SPAWN_INTERVAL;
        }
        self.act(action);
        let mut reward = self.move_player_bullets();
        self.move_divers();
        reward += self.move_enemies(true);
        self.move_enemy_bullets();
        reward += self.move_enemies(false);
        self.enemy_spawn_timer = self.enemy_spawn_timer.saturating_sub(1);
        self.diver_spawn_timer = self.diver_spawn_timer.saturating_sub(1);
        self.shot_cooldown = self.shot_cooldown.saturating_sub(1);
        reward += self.breathe();
        (reward, self.terminal)
    }

    fn render(&self, obs: &mut [f32]) {
        let (row, col) = self.player;
        mark(obs, 0, row, col);
        mark(
            obs,
            1,
            row,
            if self.facing_right { col - 1 } else { col + 1 },
        );
        for b in &self.player_bullets {
            mark(obs, 2, b.row, b.col);
        }
        for b in &self.enemy_bullets {
            mark(obs, 4, b.row, b.col);
        }
        for (channel, list) in [(5, &self.fish), (6, &self.subs), (9, &self.divers)] {
            for m in list {
                mark(obs, channel, m.row, m.col);
                mark(obs, 3, m.row, m.behind());
            }
        }
        let gauge = self.oxygen.max(0) * 10 / MAX_OXYGEN;
        for c in 0..gauge {
            mark(obs, 7, 9, c);
        }
        for c in (9 - self.divers_aboard.max(0))..9 {
            mark(obs, 8, 9, c);
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
#[path = "seaquest_tests.rs"]
mod tests;
