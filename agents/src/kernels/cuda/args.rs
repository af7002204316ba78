//! The kernels' argument structs, laid out as the `.cu` files declare them.

/// `RowNorm` in `row_norm.cu`: layer norm, group norm and RMSNorm over each agent's
/// `[rows, n]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowNorm {
    pub agents: i32,
    pub rows: i32,
    pub n: i32,
    pub groups: i32,
    pub spatial: i32,
    pub relu: i32,
    pub rms: i32,
    pub eps: f64,
}

impl RowNorm {
    /// For `agents` agents' values of `values` in all, with `params` parameters in all
    /// (each over `spatial` positions), `groups` per row.
    pub(crate) fn of(
        (agents, values, params): (usize, usize, usize),
        (groups, spatial): (usize, usize),
        (relu, rms, eps): (bool, bool, f64),
    ) -> candle_core::Result<Self> {
        let n = params / agents.max(1) * spatial;
        if n == 0 || values % (agents * n) != 0 || n % groups.max(1) != 0 {
            candle_core::bail!("row norm: {values} values for {agents} agents of {n} features");
        }
        Ok(Self {
            agents: agents as i32,
            rows: (values / agents / n) as i32,
            n: n as i32,
            groups: groups as i32,
            spatial: spatial as i32,
            relu: i32::from(relu),
            rms: i32::from(rms),
            eps,
        })
    }
}

/// `BatchNorm` in `batch_norm.cu`: each agent's `[outer, units, inner]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchNorm {
    pub agents: i32,
    pub outer: i32,
    pub units: i32,
    pub inner: i32,
    pub relu: i32,
    pub batch_statistics: i32,
    pub eps: f64,
}

/// `ConvDims` in `im2col.cu`: one agent's batch of inputs `[batch, c_in, h, w]` under a
/// `k x k` kernel with `stride`, giving `oh x ow` positions.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvDims {
    pub batch: i32,
    pub c_in: i32,
    pub h: i32,
    pub w: i32,
    pub k: i32,
    pub stride: i32,
    pub oh: i32,
    pub ow: i32,
}

impl BatchNorm {
    /// For `agents` agents' values laid out as `units` says.
    pub(crate) fn of(
        agents: usize,
        units: &crate::kernels::units::Units,
        (relu, batch_statistics, eps): (bool, bool, f64),
    ) -> Self {
        Self {
            agents: agents as i32,
            outer: units.outer as i32,
            units: units.units as i32,
            inner: units.inner as i32,
            relu: i32::from(relu),
            batch_statistics: i32::from(batch_statistics),
            eps,
        }
    }
}

#[cfg(feature = "cuda")]
mod device_repr {
    use candle_core::cuda_backend::cudarc::driver::DeviceRepr;

    unsafe impl DeviceRepr for super::RowNorm {}
    unsafe impl DeviceRepr for super::BatchNorm {}
    unsafe impl DeviceRepr for super::ConvDims {}
}
