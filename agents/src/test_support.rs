//! What the crate's unit tests of fused ops share: random inputs, the relative
//! distance of two results, and gradients of a weighted sum. (Its own generator, so that
//! tests of any module can draw inputs without importing `nn`.)

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Standard normal draws from a seed.
pub(crate) struct Normals(Xoshiro256PlusPlus);

impl Normals {
    pub(crate) fn new(seed: u64) -> Self {
        Self(Xoshiro256PlusPlus::seed_from_u64(seed))
    }
}

/// Standard normal values of shape `dims`.
pub(crate) fn random(rng: &mut Normals, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n).map(|_| StandardNormal.sample(&mut rng.0)).collect();
    Tensor::from_vec(values, dims, &Device::Cpu).unwrap()
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
/// The same gradients by a fused op's explicit backward: the input's under `input`'s
/// id, the parameters' under theirs.
pub(crate) fn explicit_gradients(
    y: &crate::kernels::per_agent::Applied,
    input: &Tensor,
    weights: &Tensor,
) -> GradStore {
    let mut grads = GradStore::default();
    let dt = y.backward(weights, &mut grads).unwrap();
    grads.insert(input, dt);
    grads
}

pub(crate) fn gradients(y: &Tensor, weights: &Tensor) -> GradStore {
    (y * weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap()
}

/// Each of `stores`' gradients of every one of `vars` within `tol` (relative) of
/// `reference`'s: a fused op's, by candle's backward and by its explicit one, against
/// its tensor form's.
pub(crate) fn assert_same_gradients(
    stores: &[GradStore],
    reference: &GradStore,
    vars: &[&candle_core::Var],
    (tol, what): (f32, &str),
) {
    for store in stores {
        for v in vars {
            let a = store.get(v.as_tensor()).expect("a gradient of the op");
            let b = reference
                .get(v.as_tensor())
                .expect("a gradient of the reference");
            let e = max_relative(a, b);
            assert!(e < tol, "{what}: gradient of {:?} apart by {e}", v.dims());
        }
    }
}
