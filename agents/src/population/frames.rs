//! The members' replay frames on the population's device (the device replay):
//! each member's ring mirrored as bytes, `[P * capacity, obs]`, written with one scatter
//! per step (every member's new frames at once) and read with one gather per batch
//! (every member's sampled slots, observations and next observations at once). The
//! host replay stays the record: it draws the slots with each member's own generator
//! and holds actions, rewards and flags, so an update uploads those and the slot
//! indices instead of `2 P B obs` floats. Frames of floats (CartPole) are not mirrored.

use candle_core::{DType, Device, Result, Tensor};

use crate::replay::{Batch, ReplayBuffer};

pub struct DeviceFrames {
    /// `[P * capacity, obs]`, `u8`.
    frames: Tensor,
    capacity: usize,
    obs_len: usize,
    /// 8-bit images: a byte `b` is the value `b / 255`; else the byte is the value.
    images: bool,
    /// The member whose batch comes first in [`Self::rows`] (a shard's first).
    first_member: usize,
    /// 255, on the device (made once: an image's bytes are divided by it).
    scale: Tensor,
}

impl DeviceFrames {
    /// Mirrors every member's whole ring on `device` (at the start, and on resuming:
    /// the mirror is rebuilt from the host replays, never saved). `None` when the
    /// frames are floats, or the members' rings differ in shape.
    pub fn mirror(replays: &[&ReplayBuffer], device: &Device) -> Result<Option<Self>> {
        let Some(first) = replays.first() else {
            return Ok(None);
        };
        let (capacity, obs_len) = (first.capacity(), first.obs_len());
        let alike = replays.iter().all(|r| {
            (r.capacity(), r.obs_len(), r.frames_are_images())
                == (capacity, obs_len, first.frames_are_images())
        });
        if !alike || !first.frames_are_bytes() {
            return Ok(None);
        }
        // Only the frames stored so far (none in a fresh run): the rest are zeros,
        // allocated on the device without a copy from the host.
        let rows = replays.len() * capacity;
        let frames = Tensor::zeros((rows, obs_len), DType::U8, device)?;
        let mut mirror = Self {
            frames,
            capacity,
            obs_len,
            images: first.frames_are_images(),
            first_member: 0,
            scale: Tensor::new(255f32, device)?,
        };
        // A fresh member holds its first frame, a resumed one up to its whole ring:
        // few frames are scattered into their rows, a ring that is mostly full is one
        // contiguous copy of its rows.
        let mut ring = Vec::with_capacity(obs_len);
        for (member, replay) in replays.iter().enumerate() {
            if replay.stored_slots().len() < capacity / 2 {
                ring.clear();
                for slot in replay.stored_slots() {
                    replay.append_frame_bytes(slot, &mut ring);
                }
                let rows: Vec<u32> = replay
                    .stored_slots()
                    .map(|s| mirror.row(member, s))
                    .collect();
                mirror.write(&rows, &ring)?;
                continue;
            }
            ring.clear();
            for slot in 0..capacity {
                replay.append_frame_bytes(slot, &mut ring);
            }
            let values = Tensor::from_slice(&ring, (capacity, obs_len), device)?;
            mirror.frames.slice_set(&values, 0, member * capacity)?;
        }
        Ok(Some(mirror))
    }

    /// The frames' tensor's id: the same for every view of one mirror
    /// ([`Self::members_from`]), another for a new mirror.
    pub fn id(&self) -> candle_core::TensorId {
        self.frames.id()
    }

    /// Row of member `member`'s ring slot `slot`, for [`Self::write`].
    pub fn row(&self, member: usize, slot: usize) -> u32 {
        (member * self.capacity + slot) as u32
    }

    /// Writes new frames into their rows (`rows[k]`, from [`Self::row`], gets frame
    /// `k` of `bytes`, `obs_len` bytes each), in one scatter that touches only them.
    pub fn write(&mut self, rows: &[u32], bytes: &[u8]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let n = self.obs_len;
        let index: Vec<u32> = rows
            .iter()
            .flat_map(|&r| std::iter::repeat_n(r, n))
            .collect();
        let device = self.frames.device();
        let index = Tensor::from_vec(index, (rows.len(), n), device)?;
        let values = Tensor::from_slice(bytes, (rows.len(), n), device)?;
        self.frames.scatter_set(&index, &values, 0)
    }
    /// The same frames, read for the members from `first` on (a shard's): in
    /// [`Self::rows`] `batches[i]` is then member `first + i`'s.
    pub fn members_from(&self, first: usize) -> Self {
        Self {
            frames: self.frames.clone(),
            scale: self.scale.clone(),
            first_member: first,
            ..*self
        }
    }

    /// The frames' rows of every member's batch (`batches[i]` is member `i`'s, its
    /// `slots` drawn on the host): the observations' rows, then the next ones', `2 P B`.
    pub fn rows(&self, batches: &[&Batch]) -> Vec<u32> {
        let b = batches.first().map_or(0, |x| x.size);
        let rows = |next: bool| {
            batches.iter().enumerate().flat_map(move |(member, batch)| {
                let base = (self.first_member + member) * self.capacity;
                let slots = batch.slots[..b].to_vec();
                slots
                    .into_iter()
                    .map(move |slot| (base + (slot + usize::from(next)) % self.capacity) as u32)
            })
        };
        rows(false).chain(rows(true)).collect()
    }

    /// The observations and next observations at `rows` ([`Self::rows`], on the
    /// device) of `p` members' batches of `b`, `[P, B, obs]` each, by one gather of both.
    pub fn gather_rows(&self, rows: &Tensor, p: usize, b: usize) -> Result<(Tensor, Tensor)> {
        let x = self.frames.index_select(rows, 0)?.to_dtype(DType::F32)?;
        let x = match self.images {
            // The host's `b / 255`, as a division (a product by 1/255 rounds apart).
            true => x.broadcast_div(&self.scale)?,
            false => x,
        };
        let both = x.reshape((2, p, b, self.obs_len))?;
        Ok((both.get(0)?, both.get(1)?))
    }
}
