//! What the crate's unit tests of fused ops share: random inputs, the relative
//! distance of two results, and gradients of a weighted sum.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};

use crate::nn::init::InitRng;

/// Standard normal values of shape `dims`.
pub(crate) fn random(rng: &mut InitRng, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    rng.normal(n, 1.0, &Device::Cpu)
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// The largest difference of `a` from `b`, over `b`'s largest magnitude.
pub(crate) fn max_relative(a: &Tensor, b: &Tensor) -> f32 {
    let largest = |t: &Tensor| -> f32 {
        let flat = t.abs().unwrap().flatten_all().unwrap();
        flat.max(0).unwrap().to_scalar().unwrap()
    };
    largest(&(a - b).unwrap()) / largest(b).max(1e-6)
}

/// The gradients of `sum(y * weights)`: a loss that reaches every output differently.
pub(crate) fn gradients(y: &Tensor, weights: &Tensor) -> GradStore {
    (y * weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap()
}
