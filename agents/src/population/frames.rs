//! The members' replay frames on the population's device (the device replay):
//! each member's ring mirrored as bytes, `[P * capacity, obs]`, written with one scatter
//! per step (every member's new frames at once) and read with one gather per batch
//! (every member's sampled slots, observations and next observations at once). The
//! host replay stays the record: it draws the slots with each member's own generator
//! and holds actions, rewards and flags, so an update uploads those and the slot
//! indices instead of `2 P B obs` floats. Frames of floats (CartPole) are not mirrored.

use std::borrow::Borrow;

use candle_core::{DType, Device, Result, Tensor};

use crate::replay::{Batch, ReplayBuffer};

pub struct DeviceFrames {
    /// `[P * capacity, obs]`, `u8`.
    frames: Tensor,
    capacity: usize,
    obs_len: usize,
    /// 8-bit images: a byte `b` is the value `b / 255`; else the byte is the value.
    images: bool,
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
        if !alike || first.frame_bytes(0).is_none() {
            return Ok(None);
        }
        let mut bytes = Vec::with_capacity(replays.len() * capacity * obs_len);
        for replay in replays {
            for slot in 0..capacity {
                bytes.extend(replay.frame_bytes(slot).expect("byte frames"));
            }
        }
        let frames = Tensor::from_vec(bytes, (replays.len() * capacity, obs_len), device)?;
        let images = first.frames_are_images();
        Ok(Some(Self {
            frames,
            capacity,
            obs_len,
            images,
        }))
    }

    /// Writes new frames, `(member, slot, bytes)` each, in one scatter.
    pub fn write(&mut self, frames: &[(usize, usize, Vec<u8>)]) -> Result<()> {
        if frames.is_empty() {
            return Ok(());
        }
        let n = self.obs_len;
        let rows: Vec<u32> = frames
            .iter()
            .flat_map(|&(member, slot, _)| {
                std::iter::repeat_n((member * self.capacity + slot) as u32, n)
            })
            .collect();
        let values: Vec<u8> = frames
            .iter()
            .flat_map(|(_, _, b)| b.iter().copied())
            .collect();
        let device = self.frames.device();
        let rows = Tensor::from_vec(rows, (frames.len(), n), device)?;
        let values = Tensor::from_vec(values, (frames.len(), n), device)?;
        self.frames.scatter_set(&rows, &values, 0)
    }

    /// The observations and next observations of every member's batch (`batches[i]`
    /// is member `i`'s, its `slots` drawn on the host), `[P, B, obs]` each, by one
    /// gather of both.
    pub fn gather<B: Borrow<Batch>>(&self, batches: &[B]) -> Result<(Tensor, Tensor)> {
        let (p, b) = (batches.len(), batches[0].borrow().size);
        let rows = |next: bool| {
            batches.iter().enumerate().flat_map(move |(member, batch)| {
                let base = member * self.capacity;
                let slots = batch.borrow().slots[..b].to_vec();
                slots
                    .into_iter()
                    .map(move |slot| (base + (slot + usize::from(next)) % self.capacity) as u32)
            })
        };
        let index: Vec<u32> = rows(false).chain(rows(true)).collect();
        let device = self.frames.device();
        let index = Tensor::from_vec(index, 2 * p * b, device)?;
        let x = self.frames.index_select(&index, 0)?.to_dtype(DType::F32)?;
        let x = match self.images {
            // The host's `b / 255`, as a division (a product by 1/255 rounds apart).
            true => x.broadcast_div(&Tensor::new(255f32, device)?)?,
            false => x,
        };
        let both = x.reshape((2, p, b, self.obs_len))?;
        Ok((both.get(0)?, both.get(1)?))
    }
}
