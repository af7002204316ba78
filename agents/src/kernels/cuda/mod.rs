//! The population's CUDA kernels (`*.cu` here), each beside the CPU op it mirrors: the
//! TD targets and loss, the optimizer's step, bias + ReLU, the data convolution's
//! im2col, and the normalizations' forward and backward passes. `build.rs` compiles them
//! to PTX with the `cuda` feature, and for the host under an emulation of CUDA's
//! built-ins (`emulate`, with a C++20 compiler of the GCC or Clang kind:
//! `cfg(normrl_emulation)`), where the tests run them against the CPU ops.

#[cfg(any(test, feature = "cuda"))]
pub(crate) mod args;
#[cfg(feature = "cuda")]
pub(crate) mod device;
#[cfg(all(test, normrl_emulation))]
pub(crate) mod emulate;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(any(test, feature = "cuda"))]
pub(crate) mod optimizer;
#[cfg(all(test, normrl_emulation))]
mod tests;
