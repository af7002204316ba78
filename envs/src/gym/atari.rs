//! DQN's standard Atari preprocessing, on the Rust side of the bridge: no-op starts,
//! 84x84 area-averaged grayscale frames stacked four deep, life loss as the end of an
//! episode for learning, and rewards clipped to their sign.
//!
//! The frame skip (4, with the maximum of the last two frames) runs inside the worker,
//! next to the emulator, so one pipe round trip carries one agent step. The statistics
//! of the wrapped [`Monitor`] stay those of the real game: whole games (all lives) and
//! unclipped scores, which is what papers report.

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::process::GymProcess;
use crate::wrappers::Monitor;
use crate::{ActionSpace, Env, EnvError, EpisodeStats, ObservationSpace, Step};

/// The preprocessing's settings (the DQN Nature paper's, and Gymnasium's
/// `AtariPreprocessing` defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AtariConfig {
    /// Up to this many no-op actions (action 0) after a reset, drawn uniformly from
    /// 1..=noop_max; 0 turns them off.
    pub noop_max: u32,
    pub screen_size: usize,
    pub frame_stack: usize,
    /// A lost life ends the episode for the learner (the game goes on).
    pub terminal_on_life_loss: bool,
    /// Rewards become -1, 0 or +1 for the learner; the monitor keeps the raw score.
    pub clip_rewards: bool,
    /// Press FIRE when a game starts and after each lost life, in games that have it
    /// (Breakout waits for FIRE to serve; an early policy that never fires would stall
    /// until the time limit). CleanRL's and Stable-Baselines3's `FireResetEnv`.
    pub fire_reset: bool,
}

impl Default for AtariConfig {
    fn default() -> Self {
        Self {
            noop_max: 30,
            screen_size: 84,
            frame_stack: 4,
            terminal_on_life_loss: true,
            clip_rewards: true,
            fire_reset: true,
        }
    }
}

pub struct AtariPreprocessing {
    inner: Monitor<GymProcess>,
    config: AtariConfig,
    resize: AreaResize,
    /// The emulator's grayscale frame, as the worker sends it.
    raw: Vec<f32>,
    /// `frame_stack` frames of `screen_size²`, oldest first.
    stack: Vec<f32>,
    rng: Xoshiro256PlusPlus,
    lives: Option<u32>,
    /// The game itself is over (not just a life): the next reset restarts it.
    game_over: bool,
    /// The FIRE action, where the game has one and `fire_reset` is on.
    fire: Option<usize>,
}

impl AtariPreprocessing {
    pub fn new(inner: Monitor<GymProcess>, config: AtariConfig) -> Result<Self, EnvError> {
        let space = inner.observation_space();
        let [height, width] = space.shape[..] else {
            return Err(EnvError::External(format!(
                "the atari preset needs 2-D grayscale frames; '{}' gives the shape {:?}",
                inner.id(),
                space.shape
            )));
        };
        let size = config.screen_size;
        let fire = config
            .fire_reset
            .then(|| {
                inner
                    .inner()
                    .action_meanings()
                    .iter()
                    .position(|m| m == "FIRE")
            })
            .flatten();
        Ok(Self {
            fire,
            resize: AreaResize::new(height, width, size, size),
            raw: vec![0.0; height * width],
            stack: vec![0.0; config.frame_stack * size * size],
            rng: Xoshiro256PlusPlus::seed_from_u64(0),
            lives: None,
            game_over: true,
            inner,
            config,
        })
    }

    fn frame_len(&self) -> usize {
        self.config.screen_size * self.config.screen_size
    }

    /// Resizes the raw frame into the newest stack slot.
    fn push_frame(&mut self) {
        let n = self.frame_len();
        self.stack.copy_within(n.., 0);
        let newest = self.stack.len() - n;
        self.resize.apply(&self.raw, &mut self.stack[newest..]);
    }

    /// Starts the game afresh: reset, then the no-ops.
    fn restart_game(&mut self, seed: Option<u64>) -> Result<(), EnvError> {
        let mut seed = seed;
        loop {
            self.inner.reset(seed.take(), &mut self.raw)?;
            let noops = if self.config.noop_max == 0 {
                0
            } else {
                self.rng.random_range(1..=self.config.noop_max)
            };
            let mut over = false;
            for _ in 0..noops {
                if self.inner.step(0, &mut self.raw)?.done() {
                    over = true;
                    break;
                }
            }
            if !over && !self.press_fire()? {
                return Ok(());
            }
        }
    }

    /// Presses FIRE if the game has it; true when that ended the game.
    fn press_fire(&mut self) -> Result<bool, EnvError> {
        match self.fire {
            Some(fire) => Ok(self.inner.step(fire, &mut self.raw)?.done()),
            None => Ok(false),
        }
    }
}

impl Env for AtariPreprocessing {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn observation_space(&self) -> ObservationSpace {
        let size = self.config.screen_size;
        ObservationSpace {
            shape: vec![self.config.frame_stack, size, size],
            low: 0.0,
            high: 1.0,
            binary: false,
            bytes: true,
        }
    }

    fn action_space(&self) -> ActionSpace {
        self.inner.action_space()
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        crate::env::check_obs_len(self.stack.len(), obs)?;
        if let Some(seed) = seed {
            self.rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        }
        if seed.is_some() || self.game_over {
            self.restart_game(seed)?;
        } else {
            // Only a life was lost: the game goes on from where it is, after one no-op
            // (the frame of the loss is not shown twice).
            let step = self.inner.step(0, &mut self.raw)?;
            if step.done() || self.press_fire()? {
                self.restart_game(None)?;
            }
        }
        self.game_over = false;
        self.lives = self.inner.inner().lives();
        self.push_frame();
        let n = self.frame_len();
        let newest = self.stack.len() - n;
        for k in 0..self.config.frame_stack - 1 {
            self.stack.copy_within(newest.., k * n);
        }
        obs.copy_from_slice(&self.stack);
        Ok(())
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        crate::env::check_obs_len(self.stack.len(), obs)?;
        let step = self.inner.step(action, &mut self.raw)?;
        self.push_frame();
        obs.copy_from_slice(&self.stack);
        let lives = self.inner.inner().lives();
        let life_lost = matches!((self.lives, lives), (Some(before), Some(now)) if now < before);
        self.lives = lives;
        self.game_over = step.done();
        Ok(Step {
            reward: if self.config.clip_rewards {
                step.reward.signum() * f32::from(step.reward != 0.0)
            } else {
                step.reward
            },
            terminated: step.terminated
                || (self.config.terminal_on_life_loss && life_lost && !step.truncated),
            truncated: step.truncated,
        })
    }

    fn episode_stats(&self) -> Option<EpisodeStats> {
        self.inner.episode_stats()
    }

    /// The emulator's colour screen, not the preprocessed observation.
    fn render(&mut self) -> Result<crate::Frame, EnvError> {
        self.inner.render()
    }
}

/// Area-averaging resize (OpenCV's `INTER_AREA` when shrinking): each output pixel is
/// the mean of the input it covers, partly covered pixels weighted by the covered
/// fraction; the result is rounded to 8 bits and scaled to [0, 1].
#[derive(Debug, Clone)]
pub struct AreaResize {
    in_width: usize,
    rows: Vec<Vec<(usize, f32)>>,
    cols: Vec<Vec<(usize, f32)>>,
    /// The input resized horizontally: `in_height x out_width`.
    narrow: Vec<f32>,
}

impl AreaResize {
    pub fn new(in_height: usize, in_width: usize, out_height: usize, out_width: usize) -> Self {
        Self {
            in_width,
            rows: area_weights(in_height, out_height),
            cols: area_weights(in_width, out_width),
            narrow: vec![0.0; in_height * out_width],
        }
    }

    /// `input`: `in_height x in_width` values in 0..=255; `out`: `out_height x out_width`.
    pub fn apply(&mut self, input: &[f32], out: &mut [f32]) {
        let out_width = self.cols.len();
        for (line, narrow) in input
            .chunks_exact(self.in_width)
            .zip(self.narrow.chunks_exact_mut(out_width))
        {
            for (n, col_weights) in narrow.iter_mut().zip(&self.cols) {
                *n = col_weights.iter().map(|&(x, wx)| wx * line[x]).sum();
            }
        }
        for (out_row, row_weights) in out.chunks_exact_mut(out_width).zip(&self.rows) {
            out_row.fill(0.0);
            for &(y, wy) in row_weights {
                let narrow = &self.narrow[y * out_width..(y + 1) * out_width];
                for (o, n) in out_row.iter_mut().zip(narrow) {
                    *o += wy * n;
                }
            }
            for o in out_row.iter_mut() {
                *o = o.round() / 255.0;
            }
        }
    }
}

/// For each output index, the input indices it covers and their weights (summing to 1).
fn area_weights(input: usize, output: usize) -> Vec<Vec<(usize, f32)>> {
    let scale = input as f64 / output as f64;
    (0..output)
        .map(|o| {
            let (start, end) = (o as f64 * scale, (o + 1) as f64 * scale);
            let mut weights = vec![];
            let mut i = start.floor() as usize;
            while (i as f64) < end && i < input {
                let covered = (end.min(i as f64 + 1.0) - start.max(i as f64)).max(0.0);
                if covered > 1e-9 {
                    weights.push((i, (covered / scale) as f32));
                }
                i += 1;
            }
            weights
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_weights_cover_the_input_once() {
        for (input, output) in [(210, 84), (160, 84), (10, 5), (7, 7)] {
            let w = area_weights(input, output);
            let mut coverage = vec![0.0f64; input];
            for row in &w {
                let sum: f32 = row.iter().map(|p| p.1).sum();
                assert!((sum - 1.0).abs() < 1e-5, "{input}->{output}: {sum}");
                for &(i, wt) in row {
                    coverage[i] += f64::from(wt) * input as f64 / output as f64;
                }
            }
            assert!(coverage.iter().all(|c| (c - 1.0).abs() < 1e-5));
        }
        // 210 -> 84 is a factor of 2.5: output row 0 = rows 0, 1 and half of row 2.
        assert_eq!(area_weights(210, 84)[0], vec![(0, 0.4), (1, 0.4), (2, 0.2)]);
    }

    #[test]
    fn resize_averages_blocks() {
        // 4x4 -> 2x2 averages 2x2 blocks exactly.
        let input: Vec<f32> = (0..16).map(|v| (v * 10) as f32).collect();
        let mut out = vec![0.0; 4];
        AreaResize::new(4, 4, 2, 2).apply(&input, &mut out);
        let expect = [25.0f32, 45.0, 105.0, 125.0].map(|v| v / 255.0);
        for (o, e) in out.iter().zip(expect) {
            assert!((o - e).abs() < 1e-6);
        }
        // A constant frame stays constant at any scale.
        let mut out = vec![0.0; 84 * 84];
        AreaResize::new(210, 160, 84, 84).apply(&vec![142.0; 210 * 160], &mut out);
        assert!(out.iter().all(|&v| (v - 142.0 / 255.0).abs() < 1e-6));
    }
}
