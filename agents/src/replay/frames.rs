//! How a slot's observation frame is stored and read: bit-packed for 0/1 observations,
//! bytes for 8-bit images, `f32` otherwise; and the frames as bytes for a device's
//! mirror of the ring.

use serde::Deserialize;

use super::ReplayBuffer;

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
pub(super) enum Frames {
    Bits {
        words_per_frame: usize,
        words: Vec<u64>,
    },
    Floats(Vec<f32>),
    Bytes(Vec<u8>),
}

impl ReplayBuffer {
    pub(super) fn write_frame(&mut self, slot: usize, obs: &[f32]) {
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

    pub(super) fn read_frame(&self, slot: usize, out: &mut [f32]) {
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

    /// A frame's values as bytes appended to `out`, as a device mirror of the ring
    /// stores them: `0`/`1` for bit-packed frames, the stored byte for 8-bit images
    /// (`value * 255`); false, and nothing appended, for float frames.
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

    /// Whether a byte of [`Self::append_frame_bytes`] stands for `byte / 255` (8-bit images)
    /// rather than the value itself (0/1 frames).
    pub fn frames_are_images(&self) -> bool {
        matches!(self.frames, Frames::Bytes(_))
    }
}

/// The first `n` bits of a bit-packed frame (bit `i` in word `i / 64`), 0 or 1 each.
fn bits(frame: &[u64], n: usize) -> impl Iterator<Item = u8> + '_ {
    (0..n).map(move |i| ((frame[i / 64] >> (i % 64)) & 1) as u8)
}
