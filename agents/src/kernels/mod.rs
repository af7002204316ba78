//! The CPU's low-level loops and candle custom ops: matrix products, im2col, the
//! one-pass feature loops, each normalization's fused op with its closed-form backward,
//! and the AVX2 dispatch. Nothing here knows about layers, networks or agents; `nn`
//! calls these by name.

pub(crate) mod avx2;
pub(crate) mod batch_norm;
pub(crate) mod conv;
pub(crate) mod dense;
pub(crate) mod feature_pass;
pub mod fused;
pub(crate) mod kernel_core;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod mean_only_bn;
pub(crate) mod weight_norm;
