//! Seeded weight initializers: PyTorch's default (Kaiming-uniform), Gaussian, and
//! orthogonal.

use candle_core::{Device, Result, Shape, Tensor};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::svb;

/// The random stream a network's initialization draws from.
pub struct InitRng(Xoshiro256PlusPlus);

impl InitRng {
    pub fn new(seed: u64) -> Self {
        Self(Xoshiro256PlusPlus::seed_from_u64(seed))
    }

    /// Uniform in `[-bound, bound)`, PyTorch's default for Linear and Conv2d weights and
    /// biases with `bound = 1 / sqrt(fan_in)`.
    pub fn uniform<S: Into<Shape>>(
        &mut self,
        shape: S,
        bound: f64,
        dev: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let data: Vec<f32> = (0..shape.elem_count())
            .map(|_| self.0.random_range(-bound..bound) as f32)
            .collect();
        Tensor::from_vec(data, shape, dev)
    }

    /// Gaussian with mean 0 and standard deviation `std`.
    pub fn normal<S: Into<Shape>>(&mut self, shape: S, std: f64, dev: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let data: Vec<f32> = (0..shape.elem_count())
            .map(|_| {
                let z: f64 = StandardNormal.sample(&mut self.0);
                (z * std) as f32
            })
            .collect();
        Tensor::from_vec(data, shape, dev)
    }

    /// A (semi-)orthogonal matrix reshaped to `shape`: the rows of the `(shape[0], rest)`
    /// matrix are orthonormal when `shape[0] <= rest`, else its columns. All its singular
    /// values are 1.
    pub fn orthogonal<S: Into<Shape>>(&mut self, shape: S, dev: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let gaussian = self.normal(shape.clone(), 1.0, dev)?;
        svb::clamp_singular_values(&gaussian, 1.0, 1.0)
    }
}
