//! The ring itself: its slots, how a step is recorded and the oldest frame evicted,
//! and its checkpoint form (only the filled slots).

use serde::{Deserialize, Serialize};

use super::frames::{FrameEncoding, Frames};

/// Checkpoints hold only the filled slots ([`StoredReplay`]): a fresh buffer of 2M
/// frames is mostly zeros.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayBuffer {
    pub(super) capacity: usize,
    pub(super) obs_len: usize,
    pub(super) frames: Frames,
    pub(super) actions: Vec<u32>,
    pub(super) rewards: Vec<f32>,
    pub(super) terminated: Vec<bool>,
    /// True where the slot starts a stored transition (its next frame is in the ring).
    pub(super) has_transition: Vec<bool>,
    /// Slot of the newest frame.
    pub(super) head: usize,
    /// Frames written so far (saturates at capacity in meaning: `len()`).
    pub(super) written: u64,
    pub(super) transitions: usize,
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
        if let Frames::Bits {
            words_per_frame, ..
        } = &s.frames
        {
            if *words_per_frame != s.obs_len.div_ceil(64) {
                return Err(bad("bit-packed frames do not fit its observation length"));
            }
        }
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
        if let Some(why) = counters_problem(&s, filled) {
            return Err(bad(why));
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

/// Why a stored replay's counters cannot be its own: sampling and appending trust them
/// (a transition count above the marked slots underflowed on eviction; frames written
/// with no slot filled drew from an empty range). A checksummed checkpoint never
/// fails these; an older one without checksums may.
fn counters_problem<Fr>(
    s: &StoredReplay<Fr, Vec<u32>, Vec<f32>, Vec<bool>>,
    filled: usize,
) -> Option<&'static str> {
    let capacity = s.capacity as u64;
    let marked = s.has_transition.iter().filter(|&&t| t).count();
    if marked != s.transitions || s.transitions as u64 > s.written {
        return Some("its transition count disagrees with its marked slots");
    }
    if (s.written.min(capacity) as usize) > filled {
        return Some("more frames written than it stores");
    }
    // Each append moves the head one slot on from `capacity - 1`.
    if s.head as u64 != (s.written % capacity + capacity - 1) % capacity {
        return Some("its newest slot disagrees with the frames written");
    }
    None
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

    /// Appends a frame, evicting the oldest (and the transition that started there).
    pub(super) fn append(&mut self, obs: &[f32]) {
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
}
