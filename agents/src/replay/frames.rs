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
                let n = out.len().min(self.obs_len);
                unpack_bits(frame, &mut out[..n]);
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
/// Each byte's 8 bits as `0.0`/`1.0`, the least significant first.
static BYTE_BITS: [[f32; 8]; 256] = byte_bits();

const fn byte_bits() -> [[f32; 8]; 256] {
    let mut table = [[0f32; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut bit = 0;
        while bit < 8 {
            if (byte >> bit) & 1 == 1 {
                table[byte][bit] = 1.0;
            }
            bit += 1;
        }
        byte += 1;
    }
    table
}

/// A bit-packed frame's first `out.len()` values as `0.0`/`1.0`, eight at a time from
/// a table: a batch of 32 MinAtar transitions unpacked bit by bit took 33 us of a
/// 600 us update (`docs/performance.md`, "Few rows").
fn unpack_bits(frame: &[u64], out: &mut [f32]) {
    let n = out.len();
    let mut eights = out.chunks_exact_mut(8);
    for (i, eight) in (&mut eights).enumerate() {
        let byte = (frame[i / 8] >> ((i % 8) * 8)) as u8;
        eight.copy_from_slice(&BYTE_BITS[usize::from(byte)]);
    }
    let rest = eights.into_remainder();
    let start = n - rest.len();
    for (o, bit) in rest.iter_mut().zip(bits(frame, n).skip(start)) {
        *o = f32::from(bit);
    }
}

fn bits(frame: &[u64], n: usize) -> impl Iterator<Item = u8> + '_ {
    (0..n).map(move |i| ((frame[i / 64] >> (i % 64)) & 1) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's unpacking equals the bit-by-bit one, for lengths that end inside a
    /// byte and a word.
    #[test]
    fn unpacked_bits_are_the_bits() {
        let frame = [
            0x9e37_79b9_7f4a_7c15u64,
            0xd1b5_4a32_d192_ed03,
            0x0123_4567_89ab_cdef,
        ];
        for n in [1, 7, 8, 63, 64, 100, 141, 192] {
            let mut out = vec![-1f32; n];
            unpack_bits(&frame, &mut out);
            let want: Vec<f32> = bits(&frame, n).map(f32::from).collect();
            assert_eq!(out, want, "{n} values");
        }
    }
}
