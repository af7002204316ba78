//! What a population step reads from the host, on its device: each update's batch and
//! each acting forward's observations. Where a step may be replayed as a CUDA graph
//! (`graph.rs`) they go into fixed buffers, written in place before each step, so that
//! the graph reads every step's values at the addresses it was captured with;
//! elsewhere (the CPU) each step's are new tensors, with no copy.

use std::borrow::Borrow;

use candle_core::{Device, Result, Tensor, WithDType};

use super::DeviceFrames;
use crate::replay::Batch;

/// The agents' batches as `[P, B, ...]` tensors.
pub(super) struct Stacked {
    pub obs: Tensor,
    pub next_obs: Tensor,
    pub actions: Tensor,
    pub rewards: Tensor,
    pub terminated: Tensor,
}

/// An update's batch on the host, as the device takes it.
struct HostBatch {
    /// `(P, B, obs)`.
    dims: (usize, usize, usize),
    /// The frames' rows of the observations then the next ones `[2 P B]`, where the
    /// frames are on the device; else the observations and next observations.
    rows: Option<Vec<u32>>,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    actions: Vec<u32>,
    rewards: Vec<f32>,
    terminated: Vec<f32>,
}

impl HostBatch {
    fn of(batches: &[&Batch], frames: Option<&DeviceFrames>) -> Result<Self> {
        let (p, b) = (batches.len(), batches.first().map_or(0, |x| x.size));
        if batches.iter().any(|x| x.size != b) {
            candle_core::bail!("a population's batches must have one size");
        }
        let obs_len = batches.first().map_or(0, |x| x.obs.len() / b.max(1));
        let gather = |f: fn(&Batch) -> &[f32]| -> Vec<f32> {
            batches.iter().flat_map(|x| f(x).iter().copied()).collect()
        };
        let rows = frames.map(|f| f.rows(batches));
        let (obs, next_obs) = match rows {
            Some(_) => (Vec::new(), Vec::new()),
            None => (gather(|x| &x.obs), gather(|x| &x.next_obs)),
        };
        Ok(Self {
            dims: (p, b, obs_len),
            rows,
            obs,
            next_obs,
            actions: batches
                .iter()
                .flat_map(|x| x.actions.iter().copied())
                .collect(),
            rewards: gather(|x| &x.rewards),
            terminated: gather(|x| &x.terminated),
        })
    }
}

/// An update's batch on the device: its observations (or, with the frames on the
/// device, the frames' rows to gather them from), actions, rewards and flags.
pub(super) struct BatchInputs {
    dims: (usize, usize, usize),
    observations: Observations,
    actions: Tensor,
    rewards: Tensor,
    terminated: Tensor,
}

enum Observations {
    /// `[P, B, obs]` each.
    Values { obs: Tensor, next_obs: Tensor },
    /// `[2 P B]`: the frames' rows of the observations, then of the next ones.
    Rows(Tensor),
}

impl BatchInputs {
    /// `host` on `device` as new tensors.
    fn upload(host: HostBatch, device: &Device) -> Result<Self> {
        let (p, b, obs_len) = host.dims;
        let observations = match host.rows {
            Some(rows) => Observations::Rows(Tensor::from_vec(rows, 2 * p * b, device)?),
            None => Observations::Values {
                obs: Tensor::from_vec(host.obs, (p, b, obs_len), device)?,
                next_obs: Tensor::from_vec(host.next_obs, (p, b, obs_len), device)?,
            },
        };
        Ok(Self {
            dims: host.dims,
            observations,
            actions: Tensor::from_vec(host.actions, (p, b, 1), device)?,
            rewards: Tensor::from_vec(host.rewards, (p, b), device)?,
            terminated: Tensor::from_vec(host.terminated, (p, b), device)?,
        })
    }

    /// Writes `host` into these buffers, in place; `false` (nothing written) where
    /// its shapes or kind differ, and the buffers must be replaced.
    fn write(&self, host: &HostBatch) -> Result<bool> {
        if host.dims != self.dims {
            return Ok(false);
        }
        match (&self.observations, &host.rows) {
            (Observations::Rows(rows), Some(r)) => write_values(rows, r)?,
            (Observations::Values { obs, next_obs }, None) => {
                write_values(obs, &host.obs)?;
                write_values(next_obs, &host.next_obs)?;
            }
            _ => return Ok(false),
        }
        write_values(&self.actions, &host.actions)?;
        write_values(&self.rewards, &host.rewards)?;
        write_values(&self.terminated, &host.terminated)?;
        Ok(true)
    }

    /// The batch as the update reads it: the observations gathered from `frames` at
    /// their rows, or as they are.
    pub(super) fn stacked(&self, frames: Option<&DeviceFrames>) -> Result<Stacked> {
        let (obs, next_obs) = match (&self.observations, frames) {
            (Observations::Values { obs, next_obs }, _) => (obs.clone(), next_obs.clone()),
            (Observations::Rows(rows), Some(frames)) => {
                frames.gather_rows(rows, self.dims.0, self.dims.1)?
            }
            (Observations::Rows(_), None) => {
                candle_core::bail!("a batch of the frames' rows needs the frames")
            }
        };
        Ok(Stacked {
            obs,
            next_obs,
            actions: self.actions.clone(),
            rewards: self.rewards.clone(),
            terminated: self.terminated.clone(),
        })
    }
}

/// Where a step's inputs go: new tensors each step, or (`fixed`) buffers written in
/// place, which keep their addresses from step to step.
pub(super) struct Inputs {
    fixed: bool,
    batch: Option<BatchInputs>,
    /// The acting forward's observations `[P, 1, obs]`.
    acting: Option<Tensor>,
}

impl Inputs {
    pub(super) fn new(fixed: bool) -> Self {
        Self {
            fixed,
            batch: None,
            acting: None,
        }
    }

    pub(super) fn fixed(&self) -> bool {
        self.fixed
    }

    /// Puts the update's batch on `device` (`batches[i]` is agent `i`'s, all of one
    /// size), the observations as the frames' rows where `frames` are given, for
    /// [`Self::current`]; whether its buffers were made anew (a graph captured over the
    /// old ones must follow).
    pub(super) fn batch<B: Borrow<Batch>>(
        &mut self,
        batches: &[B],
        device: &Device,
        frames: Option<&DeviceFrames>,
    ) -> Result<bool> {
        let batches: Vec<&Batch> = batches.iter().map(Borrow::borrow).collect();
        let host = HostBatch::of(&batches, frames)?;
        let written = match (&self.batch, self.fixed) {
            (Some(fixed), true) => fixed.write(&host)?,
            _ => false,
        };
        if !written {
            self.batch = Some(BatchInputs::upload(host, device)?);
        }
        Ok(!written)
    }

    /// Every buffer's storage address on the CPU (0 elsewhere), batch then acting: what
    /// a graph captured over fixed buffers relies on staying put.
    #[cfg(any(test, feature = "test-support"))]
    pub(super) fn addresses(&self) -> Vec<usize> {
        let mut all = Vec::new();
        if let Some(b) = &self.batch {
            match &b.observations {
                Observations::Values { obs, next_obs } => all.extend([obs, next_obs]),
                Observations::Rows(rows) => all.push(rows),
            }
            all.extend([&b.actions, &b.rewards, &b.terminated]);
        }
        all.extend(&self.acting);
        all.into_iter().map(cpu_address).collect()
    }

    /// The batch [`Self::batch`] put on the device last.
    pub(super) fn current(&self) -> Result<&BatchInputs> {
        match &self.batch {
            Some(b) => Ok(b),
            None => candle_core::bail!("no batch on the device yet"),
        }
    }

    /// The acting forward's observations `obs` (one row per agent) as `[P, 1, obs]`,
    /// and whether their buffer was made anew.
    pub(super) fn acting(
        &mut self,
        obs: &[f32],
        p: usize,
        device: &Device,
    ) -> Result<(Tensor, bool)> {
        let shape = (p, 1, obs.len() / p.max(1));
        let remade = match &self.acting {
            Some(fixed) if self.fixed && fixed.dims() == [shape.0, shape.1, shape.2] => {
                write_values(fixed, obs)?;
                false
            }
            _ => {
                self.acting = Some(Tensor::from_slice(obs, shape, device)?);
                true
            }
        };
        Ok((self.acting.clone().expect("set just above"), remade))
    }
}

/// Writes `values` into contiguous `t`, in place: on CUDA one copy from the host, else
/// through a tensor of them.
fn write_values<T: WithDType + DeviceValue>(t: &Tensor, values: &[T]) -> Result<()> {
    // Both ways refuse values of another length than the buffer's.
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() {
        return crate::kernels::cuda::device::write(t, values);
    }
    t.slice_set(&Tensor::from_slice(values, t.shape(), t.device())?, 0, 0)
}

/// A value type a buffer holds (`u32`, `f32`): with CUDA, one the device takes as is.
#[cfg(feature = "cuda")]
pub(crate) trait DeviceValue:
    candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr
{
}
#[cfg(not(feature = "cuda"))]
pub(crate) trait DeviceValue {}
impl DeviceValue for u32 {}
impl DeviceValue for f32 {}

/// A fixed output of `shape` and `dtype` on `device` (made at the first step; a step
/// writes its values in place, and a graph's replay at the same address).
pub(super) fn output(
    out: &mut Option<Tensor>,
    (shape, dtype): (&[usize], candle_core::DType),
    device: &Device,
) -> Result<Tensor> {
    match out {
        Some(o) if o.dims() == shape && o.dtype() == dtype => Ok(o.clone()),
        _ => {
            let made = Tensor::zeros(shape, dtype, device)?;
            *out = Some(made.clone());
            Ok(made)
        }
    }
}

/// A vector of `values` on `device`, made once (a fixed input of every step).
pub(super) fn constant<T: WithDType>(values: Vec<T>, device: &Device) -> Result<Tensor> {
    let n = values.len();
    Tensor::from_vec(values, n, device)
}

/// Where `t`'s values start on the CPU; 0 on a device.
#[cfg(any(test, feature = "test-support"))]
pub(super) fn cpu_address(t: &Tensor) -> usize {
    use candle_core::{CpuStorage, Storage};
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => v.as_ptr() as usize,
        Storage::Cpu(CpuStorage::U32(v)) => v.as_ptr() as usize,
        Storage::Cpu(CpuStorage::U8(v)) => v.as_ptr() as usize,
        _ => 0,
    }
}
