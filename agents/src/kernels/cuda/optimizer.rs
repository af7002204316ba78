//! The Rust side of `optimizer.cu`: its argument types, laid out as the kernel reads
//! them, and (with the `cuda` feature) the step's launch on a population's variables.

/// One stacked variable of the step (`VarSlot` in `optimizer.cu`): the addresses of its
/// parameter, gradient and two state vectors, each `agents` runs of `per_agent` values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct VarSlot {
    pub param: u64,
    pub grad: u64,
    pub s0: u64,
    pub s1: u64,
    pub per_agent: u64,
    pub lr_scale: f64,
}

/// The step's hyperparameters (`Coefficients` in `optimizer.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepCoefficients {
    pub lr: f64,
    pub max_grad_norm: f64,
    pub b1: f32,
    pub b2: f32,
    pub bias1: f32,
    pub bias2_sqrt: f32,
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
    use super::{StepCoefficients, VarSlot, SUM_THREADS};

    unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for StepCoefficients {}

    /// One step of every agent's optimizer over `vars` (parameter, gradient, state 0,
    /// state 1, learning-rate scale), in place: two launches and one upload of the
    /// table, whatever the number of variables and agents. Returns each agent's
    /// gradient norm before clipping, `[P]`, on the device.
    pub(crate) fn step(
        dev: &CudaDevice,
        vars: &[(Tensor, Tensor, Tensor, Tensor, f64)],
        agents: usize,
        lr_ratios: Option<&[f64]>,
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
        let table: Vec<u64> = slots.iter().flat_map(slot_words).collect();
        let table = dev.clone_htod(&table)?;
        let n_vars = slots.len() as i32;
        // SAFETY: the first kernel writes every sum before the second reads any.
        let sums = unsafe { dev.alloc::<f64>(slots.len() * agents) }?;
        let stream = dev.cuda_stream();
        let sum = module_function(dev, "population_grad_square_sums", "optimizer")?;
        let cfg = LaunchConfig {
            grid_dim: (slots.len() as u32, agents as u32, 1),
            block_dim: (SUM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&sum);
        b.arg(&table).arg(&n_vars).arg(&sums);
        unsafe { b.launch(cfg) }.w()?;

        // Written by the step kernel for every agent.
        let norms = crate::kernels::cuda::device::output(dev, agents)?;
        let ratios = match lr_ratios {
            Some(r) => Some(dev.clone_htod(r)?),
            None => None,
        };
        let null = 0u64;
        let longest = slots.iter().map(|s| s.per_agent).max().unwrap_or(0);
        let cfg = LaunchConfig {
            grid_dim: (
                longest.div_ceil(256).clamp(1, 1024) as u32,
                n_vars as u32,
                agents as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let norms_at = address::<f32>(&norms)?;
        let step = module_function(dev, "population_optimizer_step", "optimizer")?;
        let mut b = stream.launch_builder(&step);
        b.arg(&table).arg(&n_vars).arg(&sums);
        match &ratios {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        b.arg(&c).arg(&norms_at);
        unsafe { b.launch(cfg) }.w()?;
        Ok(norms)
    }

    /// A slot as the kernel's six 8-byte words.
    fn slot_words(s: &VarSlot) -> [u64; 6] {
        [
            s.param,
            s.grad,
            s.s0,
            s.s1,
            s.per_agent,
            s.lr_scale.to_bits(),
        ]
    }
}
