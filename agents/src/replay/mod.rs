//! A preallocated ring of observation frames with the transitions between them, and
//! pluggable samplers that make batches i.i.d.-ish (`uniform`) or deliberately
//! correlated (`recent`, `sequential`, `online`).
//!
//! Each slot holds one observation frame; the slot's action, reward and flags describe
//! the step from that frame to the next slot's frame, so next observations are not
//! stored twice. The last frame of an episode (terminated or truncated) holds no
//! transition; the next episode's first frame follows it. Binary observations (MinAtar)
//! are stored bit-packed.
//!
//! ```
//! use normrl_agents::replay::{Batch, ReplayBuffer, Sampler};
//! use rand::SeedableRng;
//!
//! let mut replay = ReplayBuffer::new(100, 2, false);
//! replay.start_episode(&[0.0, 0.0]);
//! replay.push(1, 1.0, false, false, &[1.0, 1.0]);
//! replay.push(0, 2.0, true, false, &[2.0, 2.0]);
//! assert_eq!(replay.transitions(), 2);
//! let mut batch = Batch::new(2, 2);
//! let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(0);
//! replay.sample(Sampler::Sequential, &mut batch, &mut rng).unwrap();
//! assert_eq!(batch.obs, [0.0, 0.0, 1.0, 1.0]);
//! assert_eq!(batch.next_obs, [1.0, 1.0, 2.0, 2.0]);
//! assert_eq!(batch.terminated, [0.0, 1.0]);
//! ```

use rand::Rng;
use serde::{Deserialize, Serialize};

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
    pub fn name(&self) -> &'static str {
        match self {
            Sampler::Uniform => "uniform",
            Sampler::Recent { .. } => "recent",
            Sampler::Sequential => "sequential",
            Sampler::Online => "online",
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

/// How frames are stored: what the observation space promises about its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameEncoding {
    /// Any `f32`.
    Float,
    /// Every value 0 or 1 (MinAtar): one bit each.
    Bits,
    /// Every value `k / 255` (8-bit images scaled to [0, 1], Atari): one byte each.
    Bytes,
}

impl FrameEncoding {
    pub fn of(space: &normrl_envs::ObservationSpace) -> Self {
        if space.binary {
            Self::Bits
        } else if space.bytes {
            Self::Bytes
        } else {
            Self::Float
        }
    }
}

/// Frame storage: bit-packed for 0/1 observations, bytes for 8-bit images, `f32`
/// otherwise.
#[derive(Debug, Clone, PartialEq, Deserialize)]
enum Frames {
    Bits {
        words_per_frame: usize,
        words: Vec<u64>,
    },
    Floats(Vec<f32>),
    Bytes(Vec<u8>),
}

/// Checkpoints hold only the filled slots ([`StoredReplay`]): a fresh buffer of 2M
/// frames is mostly zeros.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayBuffer {
    capacity: usize,
    obs_len: usize,
    frames: Frames,
    actions: Vec<u32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    /// True where the slot starts a stored transition (its next frame is in the ring).
    has_transition: Vec<bool>,
    /// Slot of the newest frame.
    head: usize,
    /// Frames written so far (saturates at capacity in meaning: `len()`).
    written: u64,
    transitions: usize,
}

/// The filled part of a [`ReplayBuffer`] as a checkpoint stores it: slots fill from 0
/// upward, so the first `min(written, capacity)` slots of every per-slot vector. Written
/// from borrowed slices, read back into vectors (older checkpoints, which held every
/// slot, read the same way).
#[derive(Serialize, Deserialize)]
struct StoredReplay<Fr, U, F, B> {
    capacity: usize,
    obs_len: usize,
    frames: Fr,
    actions: U,
    rewards: F,
    terminated: B,
    has_transition: B,
    head: usize,
    written: u64,
    transitions: usize,
}

/// [`Frames`] borrowed and cut to the filled slots (the same serialized form).
#[derive(Serialize)]
enum FramesRef<'a> {
    Bits {
        words_per_frame: usize,
        words: &'a [u64],
    },
    Floats(&'a [f32]),
    Bytes(&'a [u8]),
}

impl Serialize for ReplayBuffer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let filled = (self.written as usize).min(self.capacity);
        let frames = match &self.frames {
            Frames::Bits {
                words_per_frame,
                words,
            } => FramesRef::Bits {
                words_per_frame: *words_per_frame,
                words: &words[..filled * words_per_frame],
            },
            Frames::Floats(v) => FramesRef::Floats(&v[..filled * self.obs_len]),
            Frames::Bytes(v) => FramesRef::Bytes(&v[..filled * self.obs_len]),
        };
        StoredReplay {
            capacity: self.capacity,
            obs_len: self.obs_len,
            frames,
            actions: &self.actions[..filled],
            rewards: &self.rewards[..filled],
            terminated: &self.terminated[..filled],
            has_transition: &self.has_transition[..filled],
            head: self.head,
            written: self.written,
            transitions: self.transitions,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ReplayBuffer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        type Owned = StoredReplay<Frames, Vec<u32>, Vec<f32>, Vec<bool>>;
        let s = Owned::deserialize(deserializer)?;
        let bad = |what: &str| serde::de::Error::custom(format!("replay buffer: {what}"));
        let filled = s.actions.len();
        let per_frame = match &s.frames {
            Frames::Bits {
                words_per_frame, ..
            } => *words_per_frame,
            _ => s.obs_len,
        };
        let frame_values = match &s.frames {
            Frames::Bits { words, .. } => words.len(),
            Frames::Floats(v) => v.len(),
            Frames::Bytes(v) => v.len(),
        };
        let lengths_agree = [s.rewards.len(), s.terminated.len(), s.has_transition.len()]
            .iter()
            .all(|&n| n == filled);
        if s.capacity < 2 || filled > s.capacity || s.head >= s.capacity || !lengths_agree {
            return Err(bad("slot counts do not fit its capacity"));
        }
        if frame_values != filled * per_frame {
            return Err(bad("frames do not fit its slots"));
        }
        let capacity = s.capacity;
        let mut frames = s.frames;
        match &mut frames {
            Frames::Bits { words, .. } => words.resize(capacity * per_frame, 0),
            Frames::Floats(v) => v.resize(capacity * per_frame, 0.0),
            Frames::Bytes(v) => v.resize(capacity * per_frame, 0),
        }
        let grow = |mut v: Vec<bool>| {
            v.resize(capacity, false);
            v
        };
        let (mut actions, mut rewards) = (s.actions, s.rewards);
        actions.resize(capacity, 0);
        rewards.resize(capacity, 0.0);
        Ok(Self {
            capacity,
            obs_len: s.obs_len,
            frames,
            actions,
            rewards,
            terminated: grow(s.terminated),
            has_transition: grow(s.has_transition),
            head: s.head,
            written: s.written,
            transitions: s.transitions,
        })
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error(
        "the replay buffer holds {have} transitions; the {sampler} sampler needs at least {need}"
    )]
    TooFew {
        have: usize,
        need: usize,
        sampler: &'static str,
    },
}

impl ReplayBuffer {
    /// A ring of `capacity` frames of `obs_len` values (`binary`: every value 0 or 1).
    pub fn new(capacity: usize, obs_len: usize, binary: bool) -> Self {
        let encoding = if binary {
            FrameEncoding::Bits
        } else {
            FrameEncoding::Float
        };
        Self::with_encoding(capacity, obs_len, encoding)
    }

    /// A ring of `capacity` frames of `obs_len` values stored as `encoding` says.
    pub fn with_encoding(capacity: usize, obs_len: usize, encoding: FrameEncoding) -> Self {
        let capacity = capacity.max(2);
        let frames = match encoding {
            FrameEncoding::Bits => {
                let words_per_frame = obs_len.div_ceil(64);
                Frames::Bits {
                    words_per_frame,
                    words: vec![0; capacity * words_per_frame],
                }
            }
            FrameEncoding::Float => Frames::Floats(vec![0.0; capacity * obs_len]),
            FrameEncoding::Bytes => Frames::Bytes(vec![0; capacity * obs_len]),
        };
        Self {
            capacity,
            obs_len,
            frames,
            actions: vec![0; capacity],
            rewards: vec![0.0; capacity],
            terminated: vec![false; capacity],
            has_transition: vec![false; capacity],
            head: capacity - 1,
            written: 0,
            transitions: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stored transitions.
    pub fn transitions(&self) -> usize {
        self.transitions
    }

    fn write_frame(&mut self, slot: usize, obs: &[f32]) {
        match &mut self.frames {
            Frames::Bits {
                words_per_frame,
                words,
            } => {
                let frame = &mut words[slot * *words_per_frame..(slot + 1) * *words_per_frame];
                frame.fill(0);
                for (i, &v) in obs.iter().enumerate() {
                    if v != 0.0 {
                        frame[i / 64] |= 1 << (i % 64);
                    }
                }
            }
            Frames::Floats(data) => {
                data[slot * self.obs_len..(slot + 1) * self.obs_len].copy_from_slice(obs)
            }
            Frames::Bytes(data) => {
                let frame = &mut data[slot * self.obs_len..(slot + 1) * self.obs_len];
                for (b, &v) in frame.iter_mut().zip(obs) {
                    *b = (v * 255.0).round().clamp(0.0, 255.0) as u8;
                }
            }
        }
    }

    fn read_frame(&self, slot: usize, out: &mut [f32]) {
        match &self.frames {
            Frames::Bits {
                words_per_frame,
                words,
            } => {
                let frame = &words[slot * words_per_frame..(slot + 1) * words_per_frame];
                for (o, bit) in out.iter_mut().zip(bits(frame, self.obs_len)) {
                    *o = f32::from(bit);
                }
            }
            Frames::Floats(data) => {
                out.copy_from_slice(&data[slot * self.obs_len..(slot + 1) * self.obs_len])
            }
            Frames::Bytes(data) => {
                let frame = &data[slot * self.obs_len..(slot + 1) * self.obs_len];
                for (o, &b) in out.iter_mut().zip(frame) {
                    *o = f32::from(b) / 255.0;
                }
            }
        }
    }

    /// Appends a frame, evicting the oldest (and the transition that started there).
    fn append(&mut self, obs: &[f32]) {
        assert_eq!(obs.len(), self.obs_len, "observation length");
        self.head = (self.head + 1) % self.capacity;
        if self.has_transition[self.head] {
            self.has_transition[self.head] = false;
            self.transitions -= 1;
        }
        // The frame before the oldest one is gone: nothing can point into it.
        self.write_frame(self.head, obs);
        self.written += 1;
    }

    /// Slot of the newest frame.
    pub fn head(&self) -> usize {
        self.head
    }

    /// Frames written so far (also those since evicted).
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn obs_len(&self) -> usize {
        self.obs_len
    }

    /// A frame's values as bytes, as a device mirror of the ring stores them: `0`/`1`
    /// for bit-packed frames, the stored byte for 8-bit images (`value * 255`); `None`
    /// for frames of floats.
    pub fn frame_bytes(&self, slot: usize) -> Option<Vec<u8>> {
        let mut bytes = Vec::with_capacity(self.obs_len);
        self.append_frame_bytes(slot, &mut bytes).then_some(bytes)
    }

    /// [`Self::frame_bytes`] appended to `out` (no allocation per frame); false, and
    /// nothing appended, for float frames.
    pub fn append_frame_bytes(&self, slot: usize, out: &mut Vec<u8>) -> bool {
        match &self.frames {
            Frames::Floats(_) => return false,
            Frames::Bytes(data) => {
                out.extend_from_slice(&data[slot * self.obs_len..(slot + 1) * self.obs_len])
            }
            Frames::Bits {
                words_per_frame,
                words,
            } => {
                let frame = &words[slot * words_per_frame..(slot + 1) * words_per_frame];
                out.extend(bits(frame, self.obs_len));
            }
        }
        true
    }

    /// Whether frames are stored as bytes (and so can be mirrored as bytes).
    pub fn frames_are_bytes(&self) -> bool {
        !matches!(self.frames, Frames::Floats(_))
    }

    /// The slots that hold a frame, oldest first.
    pub fn stored_slots(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        let (stored, oldest) = self.stored();
        (0..stored).map(move |k| (oldest + k) % self.capacity)
    }

    /// Whether a byte of [`Self::frame_bytes`] stands for `byte / 255` (8-bit images)
    /// rather than the value itself (0/1 frames).
    pub fn frames_are_images(&self) -> bool {
        matches!(self.frames, Frames::Bytes(_))
    }

    /// Starts an episode with its first observation.
    pub fn start_episode(&mut self, obs: &[f32]) {
        self.append(obs);
    }

    /// Records the step taken from the newest frame: its action, reward and flags, and
    /// the observation it led to (the final one when the episode ended).
    pub fn push(
        &mut self,
        action: usize,
        reward: f32,
        terminated: bool,
        _truncated: bool,
        next_obs: &[f32],
    ) {
        let from = self.head;
        self.actions[from] = action as u32;
        self.rewards[from] = reward;
        self.terminated[from] = terminated;
        self.append(next_obs);
        // With capacity >= 2 the frame `from` survives this append.
        self.has_transition[from] = true;
        self.transitions += 1;
    }

    fn fill(&self, batch: &mut Batch, row: usize, slot: usize) {
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
    fn back(&self, back: usize) -> usize {
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
    fn stored(&self) -> (usize, usize) {
        let stored = (self.written as usize).min(self.capacity);
        let oldest = (self.head + self.capacity + 1 - stored) % self.capacity;
        (stored, oldest)
    }

    /// A slot drawn by `draw` until it holds a transition: rejection keeps the draw
    /// uniform over transitions (at most one slot per episode lacks one).
    fn draw_transition(&self, mut draw: impl FnMut() -> usize) -> usize {
        loop {
            let s = draw();
            if self.has_transition[s] {
                return s;
            }
        }
    }

    fn sample_uniform<R: Rng>(&self, batch: &mut Batch, rng: &mut R) {
        let (stored, oldest) = self.stored();
        for row in 0..batch.size {
            let slot =
                self.draw_transition(|| (oldest + rng.random_range(0..stored)) % self.capacity);
            self.fill(batch, row, slot);
        }
    }

    fn sample_recent<R: Rng>(&self, window: usize, batch: &mut Batch, rng: &mut R) {
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
    fn sample_sequential<R: Rng>(&self, batch: &mut Batch, rng: &mut R) {
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
    fn sample_online(&self, batch: &mut Batch) {
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

/// The first `n` bits of a bit-packed frame (bit `i` in word `i / 64`), 0 or 1 each.
fn bits(frame: &[u64], n: usize) -> impl Iterator<Item = u8> + '_ {
    (0..n).map(move |i| ((frame[i / 64] >> (i % 64)) & 1) as u8)
}
