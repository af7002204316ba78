//! How the computations run, below the networks: the CPU's loops and candle custom
//! ops (matrix products, im2col, the one-pass feature loops, each normalization's fused
//! op with its closed-form backward, the AVX2 dispatch), the population's forms of them
//! run on each agent's values (`per_agent.rs`, `agent_product.rs`), and the CUDA
//! kernels with their launches and host emulation (`cuda/`). Nothing here knows about
//! layers or networks: `nn`, `dqn` and `population` call these by name.

pub(crate) mod agent_product;
pub mod avx2;
pub(crate) mod batch_norm;
pub mod bias_relu;
pub(crate) mod conv;
pub(crate) mod cuda;
pub(crate) mod dense;
pub(crate) mod feature_pass;
pub(crate) mod few_rows;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod mean_only_bn;
pub(crate) mod per_agent;
pub(crate) mod product;
pub(crate) mod projection;
pub(crate) mod rms_norm;
pub(crate) mod sphere;
pub(crate) mod units;
pub(crate) mod weight_norm;

use candle_core::{Result, Storage, Tensor};

use dense::f32_slice;

/// Whether the fused ops run on `device`: the CPU, and a CUDA device with the `cuda`
/// feature (`kernels/cuda`).
pub(crate) fn has_fused_ops(device: &candle_core::Device) -> bool {
    device.is_cpu() || (cfg!(feature = "cuda") && device.is_cuda())
}

/// Runs `f` on a CPU tensor's values (every op here reads its inputs this way).
#[inline]
pub(crate) fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(c) => f(f32_slice(c, l)?),
        _ => candle_core::bail!("fused ops run on the CPU only"),
    }
}

/// A custom op's gradient of one input: `values` in the shape and on the device of
/// `like`.
pub(crate) fn gradient_like(
    values: Vec<f32>,
    like: &Tensor,
) -> candle_core::Result<Option<Tensor>> {
    Tensor::from_vec(values, like.shape(), like.device()).map(Some)
}

/// A two-input custom op's gradients with respect to its inputs.
pub(crate) type Grads2 = candle_core::Result<(Option<Tensor>, Option<Tensor>)>;
/// A three-input custom op's gradients with respect to its inputs.
pub(crate) type Grads3 = candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)>;

/// Writes a candle custom op's `name` and `cpu_fwd`, the boilerplate every op here
/// shares: each input unpacked to its contiguous `f32` values (bound to the name before
/// `@`, its layout to the name after), the op itself bound to `$op`, and the body's
/// `Ok((values, shape))` returned as CPU storage.
///
/// ```text
/// impl CustomOp2 for UnitBias {
///     cpu_forward!("add-unit-bias", |op, t @ lt, b @ lb| {
///         Ok((add(t, b), lt.shape().clone()))
///     });
///     fn bwd(...) -> Grads2 { ... }
/// }
/// ```
///
/// An op whose name depends on it gives the name as an expression of the op instead:
/// `cpu_forward!(|op| op.kernel.name(), |op, t @ lt| { ... })`.
macro_rules! cpu_forward {
    ($name:literal, |$op:ident, $($x:ident @ $l:ident),+| $body:block) => {
        $crate::kernels::cpu_forward!(|_op| $name, |$op, $($x @ $l),+| $body);
    };
    (|$named:ident| $name:expr, |$op:ident, $($x:ident @ $l:ident),+| $body:block) => {
        fn name(&self) -> &'static str {
            let $named = self;
            $name
        }

        fn cpu_fwd(
            &self,
            $($x: &candle_core::CpuStorage, $l: &candle_core::Layout),+
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            #[allow(unused_variables)]
            let $op = self;
            $(let $x = $crate::kernels::dense::f32_slice($x, $l)?;)+
            let result: candle_core::Result<(Vec<f32>, candle_core::Shape)> = $body;
            let (values, shape) = result?;
            Ok((candle_core::CpuStorage::F32(values), shape))
        }
    };
}
pub(crate) use cpu_forward;
