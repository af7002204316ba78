//! Batches drawn from the ring: `uniform` (i.i.d.-ish), or deliberately correlated
//! (`recent`, `sequential`, `online`).

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{ReplayBuffer, ReplayError};

/// How a batch is drawn from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", deny_unknown_fields)]
pub enum Sampler {
    /// Uniform over every stored transition (classic replay).
    Uniform,
    /// Uniform over only the newest `window` transitions.
    Recent { window: usize },
    /// One run of consecutive transitions starting at a uniform position.
    Sequential,
    /// No replay: the newest transitions, in order.
    Online,
}

impl Sampler {
    /// Every kind, `recent` with a window of 1000 (the benches').
    pub const ALL: [Sampler; 4] = [
        Sampler::Uniform,
        Sampler::Recent { window: 1000 },
        Sampler::Sequential,
        Sampler::Online,
    ];

    /// The sampler of i.i.d. batches: what the others (correlated batches) are compared
    /// with in reports.
    pub const IID: Sampler = Sampler::Uniform;

    /// The kind's name in configs and labels.
    pub const fn name(&self) -> &'static str {
        match self {
            Sampler::Uniform => "uniform",
            Sampler::Recent { .. } => "recent",
            Sampler::Sequential => "sequential",
            Sampler::Online => "online",
        }
    }

    /// The sampler takes a whole batch of consecutive transitions, so the first update
    /// needs `batch_size` of them stored.
    pub fn needs_whole_batch(&self) -> bool {
        matches!(self, Sampler::Sequential | Sampler::Online)
    }

    /// Range problems of its settings, each as `(field, what is allowed)`.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            Sampler::Recent { window: 0 } => vec![("sampler.window", "a positive integer")],
            _ => vec![],
        }
    }
}

/// A sampled minibatch, reused between updates.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub obs: Vec<f32>,
    pub next_obs: Vec<f32>,
    pub actions: Vec<u32>,
    pub rewards: Vec<f32>,
    /// 1.0 where the transition ended the episode by termination (no bootstrap).
    pub terminated: Vec<f32>,
    /// Ring slots of the sampled transitions.
    pub slots: Vec<usize>,
    pub size: usize,
    /// Observations for weight norm's data-dependent init, rows of `obs`'s width, at
    /// the run's first update only (else empty: the init then measures `obs`). A
    /// training batch of one or a few rows has no spread to measure: over one row
    /// every unit's standard deviation is 0 and the init's gains `1 / (std + eps)`
    /// are 1e6 (`ReplayBuffer::spread_observations`).
    pub init_obs: Vec<f32>,
}

impl Batch {
    pub fn new(size: usize, obs_len: usize) -> Self {
        Self {
            obs: vec![0.0; size * obs_len],
            next_obs: vec![0.0; size * obs_len],
            actions: vec![0; size],
            rewards: vec![0.0; size],
            terminated: vec![0.0; size],
            slots: vec![0; size],
            size,
            init_obs: vec![],
        }
    }

    /// A batch that takes its transitions' slots, actions, rewards and ends but not
    /// their frames, for a learner that reads the frames elsewhere (a population's
    /// mirror on the device): sampling then copies no observation.
    pub fn without_frames(size: usize) -> Self {
        Self {
            obs: vec![],
            next_obs: vec![],
            ..Self::new(size, 0)
        }
    }
}

/// How many observations weight norm's data-dependent init measures, at most (the
/// trainer takes `replay.learning_starts` where that is fewer): a minibatch of the size
/// Salimans and Kingma's init used, whatever the training batch.
pub const INIT_OBSERVATIONS: usize = 256;

impl ReplayBuffer {
    /// Up to `n` stored observations evenly spaced from the oldest to the newest,
    /// into `out` (replaced): the data-dependent init's batch. No random draw, so the
    /// training batches' draws are the same with and without it.
    pub fn spread_observations(&self, n: usize, out: &mut Vec<f32>) {
        let (stored, oldest) = self.stored();
        let rows = n.min(stored);
        let len = self.obs_len;
        out.clear();
        out.resize(rows * len, 0.0);
        for (i, row) in out.chunks_exact_mut(len.max(1)).enumerate().take(rows) {
            let slot = (oldest + i * stored / rows) % self.capacity;
            self.read_frame(slot, row);
        }
    }

    pub(super) fn fill(&self, batch: &mut Batch, row: usize, slot: usize) {
        let n = self.obs_len;
        let next = (slot + 1) % self.capacity;
        // A batch without frames (`Batch::without_frames`) takes only the slots.
        if !batch.obs.is_empty() {
            self.read_frame(slot, &mut batch.obs[row * n..(row + 1) * n]);
            self.read_frame(next, &mut batch.next_obs[row * n..(row + 1) * n]);
        }
        batch.actions[row] = self.actions[slot];
        batch.rewards[row] = self.rewards[slot];
        batch.terminated[row] = if self.terminated[slot] { 1.0 } else { 0.0 };
        batch.slots[row] = slot;
    }

    /// The slot `back` frames before the newest (1 = the one before it).
    pub(super) fn back(&self, back: usize) -> usize {
        (self.head + self.capacity - back) % self.capacity
    }

    /// Fills `batch` (all `batch.size` rows) with the sampler's choice.
    pub fn sample<R: Rng>(
        &self,
        sampler: Sampler,
        batch: &mut Batch,
        rng: &mut R,
    ) -> Result<(), ReplayError> {
        let need = match sampler {
            Sampler::Uniform | Sampler::Recent { .. } => 1,
            Sampler::Sequential | Sampler::Online => batch.size.max(1),
        };
        if self.transitions < need {
            return Err(ReplayError::TooFew {
                have: self.transitions,
                need,
                sampler: sampler.name(),
            });
        }
        match sampler {
            Sampler::Uniform => self.sample_uniform(batch, rng),
            Sampler::Recent { window } => self.sample_recent(window, batch, rng),
            Sampler::Sequential => self.sample_sequential(batch, rng),
            Sampler::Online => self.sample_online(batch),
        }
        Ok(())
    }

    /// How many frames are stored, and the slot of the oldest.
    pub(super) fn stored(&self) -> (usize, usize) {
        let stored = (self.written as usize).min(self.capacity);
        let oldest = (self.head + self.capacity + 1 - stored) % self.capacity;
        (stored, oldest)
    }

    /// A slot drawn by `draw` until it holds a transition: rejection keeps the draw
    /// uniform over transitions (at most one slot per episode lacks one).
    pub(super) fn draw_transition(&self, mut draw: impl FnMut() -> usize) -> usize {
        loop {
            let s = draw();
            if self.has_transition[s] {
                return s;
            }
        }
    }

    pub(super) fn sample_uniform<R: Rng>(&self, batch: &mut Batch, rng: &mut R) {
        let (stored, oldest) = self.stored();
        for row in 0..batch.size {
            let slot =
                self.draw_transition(|| (oldest + rng.random_range(0..stored)) % self.capacity);
            self.fill(batch, row, slot);
        }
    }

    pub(super) fn sample_recent<R: Rng>(&self, window: usize, batch: &mut Batch, rng: &mut R) {
        // How many slots back the newest `window` transitions reach (episode ends add
        // slots without transitions).
        let window = window.clamp(1, self.transitions);
        let mut slots_back = 0;
        let mut found = 0;
        while found < window {
            slots_back += 1;
            if self.has_transition[self.back(slots_back)] {
                found += 1;
            }
        }
        for row in 0..batch.size {
            let slot = self.draw_transition(|| self.back(rng.random_range(1..=slots_back)));
            self.fill(batch, row, slot);
        }
    }

    /// A uniform start among transitions followed by at least `size - 1` more;
    /// rejection keeps it uniform.
    pub(super) fn sample_sequential<R: Rng>(&self, batch: &mut Batch, rng: &mut R) {
        let (stored, oldest) = self.stored();
        'draw: loop {
            let mut slot = (oldest + rng.random_range(0..stored)) % self.capacity;
            if !self.has_transition[slot] {
                continue;
            }
            let mut row = 0;
            loop {
                if self.has_transition[slot] {
                    self.fill(batch, row, slot);
                    row += 1;
                    if row == batch.size {
                        return;
                    }
                }
                slot = (slot + 1) % self.capacity;
                if slot == self.head {
                    continue 'draw;
                }
            }
        }
    }

    /// The newest `size` transitions, oldest first.
    pub(super) fn sample_online(&self, batch: &mut Batch) {
        let mut row = batch.size;
        let mut back = 0;
        while row > 0 {
            back += 1;
            let slot = self.back(back);
            if self.has_transition[slot] {
                row -= 1;
                self.fill(batch, row, slot);
            }
        }
    }
}
