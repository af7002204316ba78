//! Batch renormalization (Ioffe 2017): batch norm whose training output is corrected
//! towards what the running statistics would give, so that it depends on the batch's
//! statistics only within a clip. Per unit, with the batch's `mu_B`,
//! `s_B = sqrt(var_B + eps)` and the running `mu`, `s`:
//!
//! ```text
//! r = stop_grad(clip(s_B / s, 1/r_max, r_max))
//! d = stop_grad(clip((mu_B - mu) / s, -d_max, d_max))
//! y = gamma * ((x - mu_B) / s_B * r + d) + beta
//! ```
//!
//! With `r_max = 1` and `d_max = 0` this is batch norm, and so is every training
//! forward of the first `warmup` updates (CrossQ's schedule: plain BN, then the clip
//! opens at once). Evaluation mode and the running statistics are batch norm's, and
//! the layer is a [`BatchNorm`](crate::nn::BatchNorm) carrying this correction: the fused
//! op is batch norm's with gain `gamma r` and shift `beta + gamma d`. A population's
//! agents share the clip and warm-up, each its own count of training forwards.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{Result, Tensor, Var};

use crate::count::read_to_host;
use crate::kernels::batch_norm::{Renorm, RenormBounds};
use crate::nn::normalization::{copy_var, Take};
use crate::nn::params::StoreVersion;
use crate::nn::{ParamStore, Role};

/// The clip and warm-up of a batch-renormalized layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RenormConfig {
    pub r_max: f64,
    pub d_max: f64,
    /// Training forwards (one per update) of plain batch norm before the clip opens.
    pub warmup: u64,
}

/// A layer's correction: one network's, or a population's (its count `[P, 1, 1]`, every
/// agent's alike, read as agent 0's, one read).
pub(crate) struct BatchRenorm {
    config: RenormConfig,
    eps: f64,
    /// Training forwards so far, up to `warmup`: a buffer, so that checkpoints and
    /// target syncs carry it and a resumed run opens the clip at the same update.
    updates: Var,
    /// The warm-up is over (the count only grows, so this is never undone): read once
    /// it is, the count costs no more reads (a device wait each on a GPU).
    open: AtomicBool,
    version: StoreVersion,
}

impl BatchRenorm {
    pub fn new(
        store: &mut ParamStore,
        prefix: &str,
        config: RenormConfig,
        eps: f64,
    ) -> Result<Self> {
        Ok(Self {
            config,
            eps,
            updates: store.zeros(&format!("{prefix}.brn.updates"), 1, Role::Buffer)?,
            open: AtomicBool::new(config.warmup == 0),
            version: store.version_handle(),
        })
    }

    /// A population's, from the agents' stacked counts; `eps` batch norm's. Its first
    /// training forward reads the count even without a warm-up, as it always did.
    pub(crate) fn stack(take: &mut Take, config: RenormConfig, eps: f64) -> Result<Self> {
        Ok(Self {
            config,
            eps,
            updates: take("brn.updates", Role::Buffer)?,
            open: AtomicBool::new(false),
            version: StoreVersion::detached(),
        })
    }

    /// The count of training forwards, a buffer.
    pub(crate) fn buffer(&self) -> &Var {
        &self.updates
    }

    /// The same correction over a copy of its count (a population's target network).
    pub(crate) fn copied(&self) -> Result<Self> {
        Ok(Self {
            config: self.config,
            eps: self.eps,
            updates: copy_var(&self.updates)?,
            open: AtomicBool::new(self.is_open()),
            version: StoreVersion::detached(),
        })
    }

    /// Whether the warm-up is over: a training forward then reads nothing from the
    /// device and counts nothing.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Counts one training forward; whether the clip is open for it (the warm-up over).
    /// Until then each call reads the count (its first value: a population's agents
    /// count alike), a device read on a GPU.
    pub(crate) fn count_update(&self) -> Result<bool> {
        if self.is_open() {
            return Ok(true);
        }
        let first = self.updates.as_tensor().flatten_all()?.narrow(0, 0, 1)?;
        let done = read_to_host::<f32>(&first)?;
        if done[0] as u64 >= self.config.warmup {
            self.open.store(true, Ordering::Release);
            return Ok(true);
        }
        self.version
            .set(&self.updates, &(self.updates.as_tensor() + 1.0)?)?;
        Ok(false)
    }

    /// The clip bounds of `r` and `d`, for the fused loops.
    pub(crate) fn bounds(&self) -> RenormBounds {
        RenormBounds {
            r_max: self.config.r_max,
            d_max: self.config.d_max,
            eps: self.eps,
        }
    }

    /// The correction of one training forward on the host: none during the warm-up.
    /// `running` are the statistics before this batch updates them.
    pub fn correction(
        &self,
        batch: (&[f32], &[f32]),
        running: (&Var, &Var),
    ) -> Result<Option<Renorm>> {
        if !self.count_update()? {
            return Ok(None);
        }
        let mean = running.0.as_tensor().to_vec1::<f32>()?;
        let var = running.1.as_tensor().to_vec1::<f32>()?;
        Ok(Some(Renorm::of(batch, (&mean, &var), self.bounds())))
    }
}

/// Batch renormalization's `r` and `d` (detached) by tensor ops, from a batch's moments
/// and the running statistics before the batch updates them, all shaped alike: batch
/// norm's tensor form, for any leading axes. The fused loops'
/// counterpart is `kernels::batch_norm::Renorm::of`.
fn renorm_factors(
    (mean, var): (&Tensor, &Tensor),
    (running_mean, running_var): (&Tensor, &Tensor),
    RenormBounds { r_max, d_max, eps }: RenormBounds,
) -> Result<(Tensor, Tensor)> {
    let s = (running_var + eps)?.sqrt()?;
    let s_batch = (var + eps)?.sqrt()?;
    let r = (s_batch / &s)?.clamp(1.0 / r_max, r_max)?.detach();
    let d = ((mean - running_mean)? / s)?.clamp(-d_max, d_max)?.detach();
    Ok((r, d))
}

impl BatchRenorm {
    /// `r` and `d` of a training forward (detached) by tensor ops, from the batch's
    /// moments and the running statistics before this batch updates them, all shaped
    /// alike (a population's tensor form and its CUDA path).
    pub(crate) fn factors(
        &self,
        (mean, var): (&Tensor, &Tensor),
        running: (&Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor)> {
        renorm_factors((mean, var), running, self.bounds())
    }
}
