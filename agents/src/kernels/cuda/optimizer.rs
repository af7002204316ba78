//! The Rust side of `optimizer.cu`: its argument types, laid out as the kernel reads
//! them, and (with the `cuda` feature) the step's launch on a population's variables.

/// One stacked variable of the step (`VarSlot` in `optimizer.cu`): the addresses of its
/// parameter, gradient and two state vectors, each `agents` runs of `per_agent` values.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct VarSlot {
    pub param: u64,
    pub grad: u64,
    pub s0: u64,
    pub s1: u64,
    pub per_agent: u64,
    pub lr_scale: f64,
}

/// Variables a launch takes (`TABLE_SLOTS` in `optimizer.cu`).
pub(crate) const TABLE_SLOTS: usize = 64;

/// Variables `first..first + count` of a step's `vars` (`VarTable` in `optimizer.cu`),
/// handed to the kernels by value: no upload, and a captured step keeps the addresses
/// of the gradients it made.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct VarTable {
    pub slots: [VarSlot; TABLE_SLOTS],
    pub first: i32,
    pub count: i32,
    pub vars: i32,
}

impl VarTable {
    /// `slots` in tables of at most [`TABLE_SLOTS`].
    pub(crate) fn of(slots: &[VarSlot]) -> Vec<Self> {
        let vars = slots.len() as i32;
        let chunks = slots.chunks(TABLE_SLOTS).enumerate();
        chunks
            .map(|(i, chunk)| {
                let mut table = Self {
                    slots: [VarSlot::default(); TABLE_SLOTS],
                    first: (i * TABLE_SLOTS) as i32,
                    count: chunk.len() as i32,
                    vars,
                };
                table.slots[..chunk.len()].copy_from_slice(chunk);
                table
            })
            .collect()
    }
}

/// The step's hyperparameters (`Coefficients` in `optimizer.cu`): the same at every
/// step. Adam's bias corrections, which change, are read from the device.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepCoefficients {
    pub lr: f64,
    pub max_grad_norm: f64,
    pub b1: f32,
    pub b2: f32,
    pub eps: f32,
    pub alpha: f32,
    pub adam: i32,
    pub centered: i32,
}

/// Threads of a block of the squared-sum kernel (its `SUM_THREADS`).
#[cfg(feature = "cuda")]
pub(crate) const SUM_THREADS: u32 = 256;

#[cfg(feature = "cuda")]
pub(crate) use device::step;

#[cfg(feature = "cuda")]
mod device {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{Result, Tensor};

    use super::super::launch::{address, module_function};
    use super::{StepCoefficients, VarSlot, VarTable, SUM_THREADS};

    unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for StepCoefficients {}
    unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for VarTable {}

    /// One step of every agent's optimizer over `vars` (parameter, gradient, state 0,
    /// state 1, learning-rate scale), in place: two launches per table of variables
    /// and no upload. `lr_ratios` (f64, `[P]`) and `bias` (Adam's two corrections and
    /// the learning rate's factor from its schedule, f32 `[3]`) are on the device,
    /// written before the step, so a captured step replays with the values of its own
    /// step. Returns each agent's gradient norm before
    /// clipping, `[P]`, on the device.
    pub(crate) fn step(
        dev: &CudaDevice,
        vars: &[(Tensor, Tensor, Tensor, Tensor, f64)],
        agents: usize,
        (lr_ratios, bias): (Option<&Tensor>, &Tensor),
        c: StepCoefficients,
    ) -> Result<Tensor> {
        let mut slots = Vec::with_capacity(vars.len());
        for (p, g, s0, s1, lr_scale) in vars {
            slots.push(VarSlot {
                param: address::<f32>(p)?,
                grad: address::<f32>(g)?,
                s0: address::<f32>(s0)?,
                s1: address::<f32>(s1)?,
                per_agent: (p.elem_count() / agents.max(1)) as u64,
                lr_scale: *lr_scale,
            });
        }
        let tables = VarTable::of(&slots);
        // SAFETY: the first kernel writes every sum before the second reads any.
        let sums = unsafe { dev.alloc::<f64>(slots.len() * agents) }?;
        let stream = dev.cuda_stream();
        let sum = module_function(dev, "population_grad_square_sums", "optimizer")?;
        for table in &tables {
            let cfg = LaunchConfig {
                grid_dim: (table.count as u32, agents as u32, 1),
                block_dim: (SUM_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = stream.launch_builder(&sum);
            b.arg(table).arg(&sums);
            unsafe { b.launch(cfg) }.w()?;
        }
        // Written by the step kernel for every agent.
        let norms = crate::kernels::cuda::device::output(dev, agents)?;
        let (norms_at, bias_at) = (address::<f32>(&norms)?, address::<f32>(bias)?);
        let ratios_at = lr_ratios.map_or(Ok(0), address::<f64>)?;
        let step = module_function(dev, "population_optimizer_step", "optimizer")?;
        for (table, chunk) in tables.iter().zip(slots.chunks(super::TABLE_SLOTS)) {
            let longest = chunk.iter().map(|s| s.per_agent).max().unwrap_or(0);
            let cfg = LaunchConfig {
                grid_dim: (
                    longest.div_ceil(256).clamp(1, 1024) as u32,
                    table.count as u32,
                    agents as u32,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = stream.launch_builder(&step);
            b.arg(table).arg(&sums).arg(&ratios_at);
            b.arg(&c).arg(&bias_at).arg(&norms_at);
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok(norms)
    }
}
