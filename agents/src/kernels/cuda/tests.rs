//! Each kernel here, run on the host under the emulation, against the CPU op it
//! mirrors: equal bit for bit where both sum in the same order, and within the
//! rounding of a different order where they do not (the optimizer's norms).

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::emulate::{launch, Ptr};

/// The kernels, compiled for the host (`build.rs`).
mod ffi {
    unsafe extern "C" {
        pub(super) fn population_td_targets(
            next_q: *const f32,
            rewards: *const f32,
            terminated: *const f32,
            gammas: *const f32,
            out: *mut f32,
            agents: i32,
            rows: i32,
            actions: i32,
        );
        pub(super) fn population_td_stats(
            q: *const f32,
            taken: *const u32,
            targets: *const f32,
            stats: *mut f32,
            agents: i32,
            rows: i32,
            actions: i32,
            huber: i32,
        );
        pub(super) fn population_td_gradient(
            q: *const f32,
            taken: *const u32,
            targets: *const f32,
            upstream: *const f32,
            dq: *mut f32,
            agents: i32,
            rows: i32,
            actions: i32,
            huber: i32,
        );
    }
}

fn rng() -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(7)
}

/// `n` values uniform in `[-scale, scale)`.
fn values(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// A population's TD inputs: Q-values `[P, B, A]` (with ties, which the first best
/// action settles), actions, targets, rewards, terminations and discounts.
struct TdCase {
    dims: (usize, usize, usize),
    q: Vec<f32>,
    actions: Vec<u32>,
    targets: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<f32>,
    gammas: Vec<f32>,
}

impl TdCase {
    fn new((p, b, a): (usize, usize, usize)) -> Self {
        let mut r = rng();
        let mut q = values(&mut r, p * b * a, 3.0);
        q[1] = q[0]; // a tie in the first row
        Self {
            dims: (p, b, a),
            q,
            actions: (0..p * b).map(|_| r.random_range(0..a as u32)).collect(),
            targets: values(&mut r, p * b, 3.0),
            rewards: values(&mut r, p * b, 1.0),
            terminated: (0..p * b).map(|_| f32::from(r.random_bool(0.2))).collect(),
            gammas: (0..p).map(|i| 0.9 + 0.01 * i as f32).collect(),
        }
    }

    fn tensors(&self) -> (Tensor, Tensor, Tensor) {
        let (p, b, a) = self.dims;
        let dev = &Device::Cpu;
        (
            Tensor::from_slice(&self.q, (p, b, a), dev).unwrap(),
            Tensor::from_slice(&self.actions, (p, b, 1), dev).unwrap(),
            Tensor::from_slice(&self.targets, (p, b), dev).unwrap(),
        )
    }
}

#[test]
fn td_targets_are_the_cpu_ops() {
    let case = TdCase::new((3, 37, 5));
    let (p, b, a) = case.dims;
    let mut out = vec![0f32; p * b];
    let o = Ptr::of(&mut out);
    let c = &case;
    launch([2, 1, 1], 32, || unsafe {
        ffi::population_td_targets(
            c.q.as_ptr(),
            c.rewards.as_ptr(),
            c.terminated.as_ptr(),
            c.gammas.as_ptr(),
            o.p(),
            p as i32,
            b as i32,
            a as i32,
        )
    });
    let dev = &Device::Cpu;
    let gammas = Tensor::from_slice(&case.gammas, (p, 1), dev).unwrap();
    let expected = crate::dqn::td::population_targets(
        &case.tensors().0,
        &Tensor::from_slice(&case.rewards, (p, b), dev).unwrap(),
        &Tensor::from_slice(&case.terminated, (p, b), dev).unwrap(),
        crate::dqn::td::Discount::PerAgent(&gammas),
    )
    .unwrap();
    assert_eq!(out, host(&expected));
}

#[test]
fn td_loss_and_gradient_are_the_cpu_ops() {
    use crate::dqn::{population_td_gradient, population_td_loss, population_td_stats, Loss};
    let case = TdCase::new((4, 33, 3));
    let (p, b, a) = case.dims;
    let (q, actions, targets) = case.tensors();
    for (loss, huber) in [(Loss::Mse, 0), (Loss::Huber, 1)] {
        let mut stats = vec![0f32; 2 * p];
        let s = Ptr::of(&mut stats);
        let (cq, ca, ct) = (
            Ptr::read(&case.q),
            Ptr::read(&case.actions),
            Ptr::read(&case.targets),
        );
        let dims = (p as i32, b as i32, a as i32);
        launch([3, 1, 1], 8, || unsafe {
            ffi::population_td_stats(cq.p(), ca.p(), ct.p(), s.p(), dims.0, dims.1, dims.2, huber)
        });
        let expected = population_td_stats(&q, &actions, &targets, loss).unwrap();
        assert_eq!(stats, host(&expected), "{loss:?}");

        // Upstream 1 (the explicit backward's start) and each agent's own weight (the
        // losses' backward in candle's graph).
        let weights: Vec<f32> = (0..p).map(|i| 0.5 + i as f32).collect();
        for upstream in [None, Some(&weights)] {
            let mut dq = vec![f32::NAN; p * b * a];
            let d = Ptr::of(&mut dq);
            let u = upstream.map_or(Ptr::null(), |w| Ptr::read(w));
            launch([5, 1, 1], 16, || unsafe {
                ffi::population_td_gradient(
                    cq.p(),
                    ca.p(),
                    ct.p(),
                    u.p(),
                    d.p(),
                    dims.0,
                    dims.1,
                    dims.2,
                    huber,
                )
            });
            let expected = match upstream {
                None => population_td_gradient(&q, &actions, &targets, loss).unwrap(),
                Some(w) => {
                    let var = candle_core::Var::from_tensor(&q).unwrap();
                    let w = Tensor::from_slice(w, p, &Device::Cpu).unwrap();
                    let losses = population_td_loss(var.as_tensor(), &actions, &targets, loss);
                    let grads = (losses.unwrap() * w).unwrap().sum_all().unwrap().backward();
                    grads.unwrap().get(var.as_tensor()).unwrap().clone()
                }
            };
            assert_eq!(dq, host(&expected), "{loss:?}, upstream {upstream:?}");
        }
    }
    let _ = DType::F32;
}
