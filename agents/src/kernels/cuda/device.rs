//! The kernels' launches on a CUDA device, at the level of tensors: each op allocates
//! its outputs, hands the kernel its tensors' device addresses and launches on
//! candle's stream. These are what a population's fused ops run where its values live
//! on a GPU; the same kernels' arithmetic is tested against the CPU ops on the host
//! (`tests.rs`).

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Device, Result, Shape, Tensor};

use super::args::{BatchNorm, ConvDims, RowNorm};
use super::launch::{address, module_function};
use crate::kernels::units::Units;

/// Threads per block of the element- and unit-parallel kernels.
const THREADS: u32 = 256;

/// The CUDA device of `t`.
pub(crate) fn cuda_of(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        other => candle_core::bail!("a CUDA kernel's input is on {:?}", other.location()),
    }
}

/// Blocks of [`THREADS`] over `n` items (the kernels loop over a grid's stride, so the
/// grid is bounded).
fn over(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A new tensor of `shape` on `dev`, for a kernel to write: left uninitialized (a
/// zeroed one costs a launch of its own), as every kernel here writes each value of its
/// outputs.
pub(crate) fn output(dev: &CudaDevice, shape: impl Into<Shape>) -> Result<Tensor> {
    // SAFETY: f32 has no invalid bit patterns, and the kernel that receives the
    // tensor writes all of it before anything reads it.
    unsafe { Tensor::empty(shape, DType::F32, &Device::Cuda(dev.clone())) }
}

/// Writes `values` into contiguous `t`, in place, with one copy from the host: no new
/// tensor, so a buffer that a captured step reads keeps its address.
pub(crate) fn write<T>(t: &Tensor, values: &[T]) -> Result<()>
where
    T: candle_core::cuda_backend::CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
{
    if t.elem_count() != values.len() {
        candle_core::bail!("{} values for a buffer of {}", values.len(), t.elem_count());
    }
    let dev = cuda_of(t)?;
    let at = address::<T>(t)?;
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().w()?;
    // SAFETY: `at` is `t`'s storage of `values.len()` values of `T`; a copy from
    // pageable memory returns once `values` is staged, so it may be dropped after.
    unsafe {
        candle_core::cuda_backend::cudarc::driver::result::memcpy_htod_async(
            at,
            values,
            stream.cu_stream(),
        )
    }
    .w()
}

/// `t`'s address, or 0 (a null pointer) for none.
fn address_or_null(t: Option<&Tensor>) -> Result<u64> {
    t.map_or(Ok(0), address::<f32>)
}

/// Launches kernel `$name` of module `$module` with `$cfg`, its arguments the local
/// variables named (kept alive until the launch, as cudarc's builder borrows them).
macro_rules! launch {
    ($dev:expr, $module:literal, $name:literal, $cfg:expr; $($arg:ident),+ $(,)?) => {{
        let dev: &CudaDevice = $dev;
        let func = module_function(dev, $name, $module)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        $(builder.arg(&$arg);)+
        unsafe { builder.launch($cfg) }.w()?;
    }};
}

/// `(agents, outer, units, inner)` as the kernels take them.
fn unit_dims(agents: usize, u: &Units) -> [i32; 4] {
    [agents, u.outer, u.units, u.inner].map(|d| d as i32)
}

/// `relu?(t * scale_u + bias_u)` per agent (`scale` none: `t + bias_u`).
pub(crate) fn bias_forward(
    t: &Tensor,
    scale: Option<&Tensor>,
    bias: &Tensor,
    (agents, units, relu): (usize, &Units, bool),
) -> Result<Tensor> {
    let dev = cuda_of(t)?;
    let out = output(&dev, t.shape())?;
    let (tp, sp, bp, op) = (
        address::<f32>(t)?,
        address_or_null(scale)?,
        address::<f32>(bias)?,
        address::<f32>(&out)?,
    );
    let [ag, ou, un, inn] = unit_dims(agents, units);
    let relu = i32::from(relu);
    launch!(&dev, "bias_relu", "agent_bias_forward", over(t.elem_count()); tp, sp, bp, op, ag, ou, un, inn, relu);
    Ok(out)
}

/// [`bias_forward`]'s gradients from its output and the output's gradient `dy`: the
/// input's, the scale's (where there is one) and the bias's, each like its operand.
pub(crate) fn bias_backward(
    (t, scale, bias): (&Tensor, Option<&Tensor>, &Tensor),
    out: &Tensor,
    dy: &Tensor,
    (agents, units, relu): (usize, &Units, bool),
) -> Result<(Tensor, Option<Tensor>, Tensor)> {
    let dev = cuda_of(t)?;
    let dy = dy.contiguous()?;
    let dt = output(&dev, t.shape())?;
    let db = output(&dev, bias.shape())?;
    let ds = scale.map(|s| output(&dev, s.shape())).transpose()?;
    let (sp, op, dyp, dtp) = (
        address_or_null(scale)?,
        address::<f32>(out)?,
        address::<f32>(&dy)?,
        address::<f32>(&dt)?,
    );
    let [ag, ou, un, inn] = unit_dims(agents, units);
    let relu = i32::from(relu);
    launch!(&dev, "bias_relu", "agent_bias_backward_input", over(t.elem_count()); sp, op, dyp, dtp, ag, ou, un, inn, relu);
    let (tp, dsp, dbp) = (
        address::<f32>(t)?,
        address_or_null(ds.as_ref())?,
        address::<f32>(&db)?,
    );
    launch!(&dev, "bias_relu", "agent_bias_backward_params", over(agents * units.units); tp, op, dyp, dsp, dbp, ag, ou, un, inn, relu);
    Ok((dt, ds, db))
}

/// Layer norm, group norm or RMSNorm (`s`) of each agent's rows: the output and each
/// part's statistics (for the backward).
pub(crate) fn row_norm_forward(
    t: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    s: RowNorm,
) -> Result<(Tensor, Tensor)> {
    let dev = cuda_of(t)?;
    let parts = (s.agents * s.rows * s.groups) as usize;
    let (out, stats) = (output(&dev, t.shape())?, output(&dev, 2 * parts)?);
    let (tp, gp, bp) = (
        address::<f32>(t)?,
        address::<f32>(gamma)?,
        address_or_null(beta)?,
    );
    let (op, sp) = (address::<f32>(&out)?, address::<f32>(&stats)?);
    launch!(&dev, "row_norm", "row_norm_forward", over(parts); tp, gp, bp, op, sp, s);
    Ok((out, stats))
}

/// [`row_norm_forward`]'s gradients: the input's, the gain's and (`shift`) the shift's.
pub(crate) fn row_norm_backward(
    (t, gamma, stats): (&Tensor, &Tensor, &Tensor),
    out: &Tensor,
    dy: &Tensor,
    s: RowNorm,
    shift: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let dev = cuda_of(t)?;
    let dy = dy.contiguous()?;
    let parts = (s.agents * s.rows * s.groups) as usize;
    let (dt, dg) = (output(&dev, t.shape())?, output(&dev, gamma.shape())?);
    let db = shift.then(|| output(&dev, gamma.shape())).transpose()?;
    let (tp, gp, op, dyp) = (
        address::<f32>(t)?,
        address::<f32>(gamma)?,
        address::<f32>(out)?,
        address::<f32>(&dy)?,
    );
    let (sp, dtp) = (address::<f32>(stats)?, address::<f32>(&dt)?);
    launch!(&dev, "row_norm", "row_norm_backward_input", over(parts); tp, gp, op, dyp, sp, dtp, s);
    let (dgp, dbp) = (address::<f32>(&dg)?, address_or_null(db.as_ref())?);
    launch!(&dev, "row_norm", "row_norm_backward_params", over(gamma.elem_count()); tp, op, dyp, sp, dgp, dbp, s);
    Ok((dt, dg, db))
}

/// Each agent's TD targets `[P, B]` (see `td.cu`), with each agent's discount
/// `gammas [P]`.
pub(crate) fn td_targets(
    next_q: &Tensor,
    rewards: &Tensor,
    terminated: &Tensor,
    gammas: &Tensor,
) -> Result<Tensor> {
    let dev = cuda_of(next_q)?;
    let (p, b, a) = next_q.dims3()?;
    let (rewards, terminated) = (rewards.contiguous()?, terminated.contiguous()?);
    let out = output(&dev, (p, b))?;
    let (qp, rp, tp) = (
        address::<f32>(next_q)?,
        address::<f32>(&rewards)?,
        address::<f32>(&terminated)?,
    );
    let (gp, op) = (address::<f32>(gammas)?, address::<f32>(&out)?);
    let (ag, rows, actions) = (p as i32, b as i32, a as i32);
    launch!(&dev, "td", "population_td_targets", over(p * b); qp, rp, tp, gp, op, ag, rows, actions);
    Ok(out)
}

/// Each agent's mean TD loss and mean taken Q-value `[2, P]`, or (with `gradient`, and
/// each agent's `upstream` weight, 1 without) the loss's gradient `[P, B, A]`.
pub(crate) fn td(
    q: &Tensor,
    actions: &Tensor,
    targets: &Tensor,
    huber: bool,
    gradient: Option<Option<&Tensor>>,
) -> Result<Tensor> {
    let dev = cuda_of(q)?;
    let (p, b, a) = q.dims3()?;
    let (actions, targets) = (actions.contiguous()?, targets.contiguous()?);
    let (qp, ap, tp) = (
        address::<f32>(q)?,
        address::<u32>(&actions)?,
        address::<f32>(&targets)?,
    );
    let (ag, rows, n, huber) = (p as i32, b as i32, a as i32, i32::from(huber));
    let Some(upstream) = gradient else {
        let stats = output(&dev, (2, p))?;
        let sp = address::<f32>(&stats)?;
        let cfg = LaunchConfig {
            grid_dim: (p.clamp(1, 65_535) as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(&dev, "td", "population_td_stats", cfg; qp, ap, tp, sp, ag, rows, n, huber);
        return Ok(stats);
    };
    let upstream = upstream.map(Tensor::contiguous).transpose()?;
    let dq = output(&dev, (p, b, a))?;
    let (up, dqp) = (address_or_null(upstream.as_ref())?, address::<f32>(&dq)?);
    launch!(&dev, "td", "population_td_gradient", over(p * b * a); qp, ap, tp, up, dqp, ag, rows, n, huber);
    Ok(dq)
}

/// Each agent's batch as im2col columns `[P, c_in * k * k, B * positions]`.
pub(crate) fn im2col(x: &Tensor, d: ConvDims) -> Result<Tensor> {
    let dev = cuda_of(x)?;
    let x = x.contiguous()?;
    let p = x.dim(0)?;
    let patch = (d.c_in * d.k * d.k) as usize;
    let columns = (d.batch * d.oh * d.ow) as usize;
    let cols = output(&dev, (p, patch, columns))?;
    let (xp, cp, agents) = (address::<f32>(&x)?, address::<f32>(&cols)?, p as i32);
    launch!(&dev, "im2col", "population_im2col", over(p * patch * columns); xp, cp, agents, d);
    Ok(cols)
}

/// Each agent's batch moments `(mean, var)`, each `[P * units]`, of `t` laid out as
/// `s` says (see `batch_norm.cu`).
pub(crate) fn batch_norm_moments(t: &Tensor, s: BatchNorm) -> Result<(Tensor, Tensor)> {
    let dev = cuda_of(t)?;
    let per_unit = (s.agents * s.units) as usize;
    let (mean, var) = (output(&dev, per_unit)?, output(&dev, per_unit)?);
    let (tp, mp, vp) = (
        address::<f32>(t)?,
        address::<f32>(&mean)?,
        address::<f32>(&var)?,
    );
    launch!(&dev, "batch_norm", "batch_norm_moments", over(per_unit); tp, mp, vp, s);
    Ok((mean, var))
}

/// Batch norm's statistics and renormalization, as its kernels take them: the
/// `(mean, var)` it normalizes with and, renormalized, `(r, d)`; each `[P, units]`.
pub(crate) struct BatchNormStatistics<'a> {
    pub moments: (&'a Tensor, &'a Tensor),
    pub renorm: Option<(&'a Tensor, &'a Tensor)>,
}

impl BatchNormStatistics<'_> {
    /// The addresses `(mean, var, r, d)`, `r` and `d` null without a renormalization.
    fn addresses(&self) -> Result<[u64; 4]> {
        let (r, d) = (self.renorm.map(|x| x.0), self.renorm.map(|x| x.1));
        Ok([
            address::<f32>(self.moments.0)?,
            address::<f32>(self.moments.1)?,
            address_or_null(r)?,
            address_or_null(d)?,
        ])
    }
}

/// Batch norm's output (see `batch_norm.cu`).
pub(crate) fn batch_norm_forward(
    t: &Tensor,
    stats: &BatchNormStatistics,
    (gamma, beta): (&Tensor, &Tensor),
    s: BatchNorm,
) -> Result<Tensor> {
    let dev = cuda_of(t)?;
    let out = output(&dev, t.shape())?;
    let [mp, vp, rp, dp] = stats.addresses()?;
    let (tp, gp, bp, op) = (
        address::<f32>(t)?,
        address::<f32>(gamma)?,
        address::<f32>(beta)?,
        address::<f32>(&out)?,
    );
    launch!(&dev, "batch_norm", "batch_norm_forward", over(t.elem_count()); tp, mp, vp, gp, bp, rp, dp, op, s);
    Ok(out)
}

/// [`batch_norm_forward`]'s gradients: the input's, the gain's and the shift's.
pub(crate) fn batch_norm_backward(
    (t, gamma): (&Tensor, &Tensor),
    stats: &BatchNormStatistics,
    out: &Tensor,
    dy: &Tensor,
    s: BatchNorm,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dev = cuda_of(t)?;
    let dy = dy.contiguous()?;
    let per_unit = (s.agents * s.units) as usize;
    let sums = output(&dev, 2 * per_unit)?;
    let (dt, dg, db) = (
        output(&dev, t.shape())?,
        output(&dev, gamma.shape())?,
        output(&dev, gamma.shape())?,
    );
    let [mp, vp, rp, dp] = stats.addresses()?;
    let (tp, op, dyp, gp) = (
        address::<f32>(t)?,
        address::<f32>(out)?,
        address::<f32>(&dy)?,
        address::<f32>(gamma)?,
    );
    let (sp, dgp, dbp, dtp) = (
        address::<f32>(&sums)?,
        address::<f32>(&dg)?,
        address::<f32>(&db)?,
        address::<f32>(&dt)?,
    );
    launch!(&dev, "batch_norm", "batch_norm_backward_params", over(per_unit); tp, op, dyp, mp, vp, rp, dp, sp, dgp, dbp, s);
    launch!(&dev, "batch_norm", "batch_norm_backward_input", over(t.elem_count()); tp, op, dyp, mp, vp, gp, rp, sp, dtp, s);
    Ok((dt, dg, db))
}

/// `(agents, units, inputs)` of weight norm's `v` `[P, units, inputs]` and gains
/// `g` (`P * units` values).
fn weight_norm_dims(v: &Tensor, g: &Tensor) -> Result<(i32, i32, i32)> {
    let agents = v.dim(0)?;
    let units = g.elem_count() / agents.max(1);
    let inputs = v.elem_count() / (agents * units).max(1);
    if agents * units * inputs != v.elem_count() || units == 0 {
        candle_core::bail!("weight norm: v {:?} for gains {:?}", v.shape(), g.shape());
    }
    Ok((agents as i32, units as i32, inputs as i32))
}

/// Weight norm's per-unit scale `g / ||v||`, shaped like `g` (see `weight_norm.cu`).
pub(crate) fn weight_norm_scale(v: &Tensor, g: &Tensor) -> Result<Tensor> {
    let dev = cuda_of(v)?;
    let (ag, un, inn) = weight_norm_dims(v, g)?;
    let s = output(&dev, g.shape())?;
    let (vp, gp, sp) = (address::<f32>(v)?, address::<f32>(g)?, address::<f32>(&s)?);
    launch!(&dev, "weight_norm", "weight_norm_scale", over(g.elem_count()); vp, gp, sp, ag, un, inn);
    Ok(s)
}

/// [`weight_norm_scale`]'s gradients `(dv, dg)` from the scale's `ds`, with the
/// product's share `dw` of `v`'s where given, and the forward's scale `s` where kept.
pub(crate) fn weight_norm_scale_backward(
    (v, g, s): (&Tensor, &Tensor, Option<&Tensor>),
    dw: Option<&Tensor>,
    ds: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let dev = cuda_of(v)?;
    let (ag, un, inn) = weight_norm_dims(v, g)?;
    let (ds, dw) = (ds.contiguous()?, dw.map(Tensor::contiguous).transpose()?);
    let (dv, dg) = (output(&dev, v.shape())?, output(&dev, g.shape())?);
    let (vp, gp, sp) = (address::<f32>(v)?, address::<f32>(g)?, address_or_null(s)?);
    let (dwp, dsp) = (address_or_null(dw.as_ref())?, address::<f32>(&ds)?);
    let (dvp, dgp) = (address::<f32>(&dv)?, address::<f32>(&dg)?);
    launch!(&dev, "weight_norm", "weight_norm_scale_backward", over(g.elem_count()); vp, gp, sp, dwp, dsp, dvp, dgp, ag, un, inn);
    Ok((dv, dg))
}
