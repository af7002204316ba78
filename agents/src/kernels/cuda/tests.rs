//! Each kernel here, run on the host under the emulation, against the CPU op it
//! mirrors: equal bit for bit where both sum in the same order, and within the
//! rounding of a different order where they do not (the optimizer's norms).

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::args::{BatchNorm, ConvDims, RowNorm};
use super::emulate::{launch, Ptr};
use super::optimizer::{StepCoefficients, VarSlot, VarTable};
use crate::nn::{ParamStore, Role};
use crate::optim::{LrSchedule, Optimizer, OptimizerConfig, OptimizerKind};

/// The kernels, compiled for the host (`build.rs`).
mod ffi {
    use super::super::args::{BatchNorm, ConvDims, RowNorm};
    use super::super::optimizer::{StepCoefficients, VarTable};

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
        pub(super) fn population_grad_square_sums(table: VarTable, sums: *mut f64);
        pub(super) fn population_optimizer_step(
            table: VarTable,
            sums: *const f64,
            lr_ratios: *const f64,
            c: StepCoefficients,
            bias: *const f32,
            norms: *mut f32,
        );
        pub(super) fn agent_bias_forward(
            t: *const f32,
            scale: *const f32,
            bias: *const f32,
            out: *mut f32,
            agents: i32,
            outer: i32,
            units: i32,
            inner: i32,
            relu: i32,
        );
        pub(super) fn agent_bias_backward_input(
            scale: *const f32,
            out: *const f32,
            dy: *const f32,
            dt: *mut f32,
            agents: i32,
            outer: i32,
            units: i32,
            inner: i32,
            relu: i32,
        );
        pub(super) fn agent_bias_backward_params(
            t: *const f32,
            out: *const f32,
            dy: *const f32,
            dscale: *mut f32,
            dbias: *mut f32,
            agents: i32,
            outer: i32,
            units: i32,
            inner: i32,
            relu: i32,
        );
        pub(super) fn population_im2col(x: *const f32, cols: *mut f32, agents: i32, d: ConvDims);
        pub(super) fn population_col2im(dcols: *const f32, dx: *mut f32, agents: i32, d: ConvDims);
        pub(super) fn row_norm_forward(
            t: *const f32,
            gamma: *const f32,
            beta: *const f32,
            out: *mut f32,
            stats: *mut f32,
            s: RowNorm,
        );
        pub(super) fn row_norm_backward_input(
            t: *const f32,
            gamma: *const f32,
            out: *const f32,
            dy: *const f32,
            stats: *const f32,
            dt: *mut f32,
            s: RowNorm,
        );
        pub(super) fn row_norm_backward_params(
            t: *const f32,
            out: *const f32,
            dy: *const f32,
            stats: *const f32,
            dgamma: *mut f32,
            dbeta: *mut f32,
            s: RowNorm,
        );
        pub(super) fn batch_norm_moments(
            t: *const f32,
            mean: *mut f32,
            var: *mut f32,
            s: BatchNorm,
        );
        pub(super) fn batch_norm_forward(
            t: *const f32,
            mean: *const f32,
            var: *const f32,
            gamma: *const f32,
            beta: *const f32,
            r: *const f32,
            d: *const f32,
            out: *mut f32,
            s: BatchNorm,
        );
        pub(super) fn batch_norm_backward_params(
            t: *const f32,
            out: *const f32,
            dy: *const f32,
            mean: *const f32,
            var: *const f32,
            r: *const f32,
            d: *const f32,
            sums: *mut f32,
            dgamma: *mut f32,
            dbeta: *mut f32,
            s: BatchNorm,
        );
        pub(super) fn batch_norm_backward_input(
            t: *const f32,
            out: *const f32,
            dy: *const f32,
            mean: *const f32,
            var: *const f32,
            gamma: *const f32,
            r: *const f32,
            sums: *const f32,
            dt: *mut f32,
            s: BatchNorm,
        );
        pub(super) fn weight_norm_scale(
            v: *const f32,
            g: *const f32,
            s: *mut f32,
            agents: i32,
            units: i32,
            inputs: i32,
        );
        pub(super) fn weight_norm_scale_backward(
            v: *const f32,
            g: *const f32,
            s: *const f32,
            dw: *const f32,
            ds: *const f32,
            dv: *mut f32,
            dg: *mut f32,
            agents: i32,
            units: i32,
            inputs: i32,
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

/// The gradients of `Σ out · dy` with respect to each of `vars`, by candle's backward
/// (through the CPU op's own); empty for a variable the op does not read.
fn candle_gradients(out: &Tensor, dy: &Tensor, vars: &[candle_core::Var]) -> Vec<Vec<f32>> {
    let grads = (out * dy).unwrap().sum_all().unwrap().backward().unwrap();
    vars.iter()
        .map(|v| grads.get(v.as_tensor()).map(values_of).unwrap_or_default())
        .collect()
}

/// `(t, a, b)` as variables, the op `apply` makes of them, and candle's gradients of
/// `sum(out dy)` with respect to each (empty for one the op does not take).
fn applied_with_gradients(
    xs: [&Tensor; 3],
    dy: &Tensor,
    apply: impl FnOnce([&Tensor; 3]) -> candle_core::Result<crate::kernels::per_agent::Applied>,
) -> (crate::kernels::per_agent::Applied, Vec<Vec<f32>>) {
    let vars = xs.map(|x| candle_core::Var::from_tensor(x).unwrap());
    let applied = apply([
        vars[0].as_tensor(),
        vars[1].as_tensor(),
        vars[2].as_tensor(),
    ]);
    let applied = applied.unwrap();
    let grads = candle_gradients(&applied.out, dy, &vars);
    (applied, grads)
}

fn values_of(t: &Tensor) -> Vec<f32> {
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
    assert_eq!(out, values_of(&expected));
}

#[test]
fn td_loss_and_gradient_are_the_cpu_ops() {
    use crate::dqn::{population_td, population_td_loss, Loss, TdOutput};
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
        let expected = population_td(&q, &actions, &targets, loss, TdOutput::Stats).unwrap();
        assert_eq!(stats, values_of(&expected), "{loss:?}");

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
                None => population_td(&q, &actions, &targets, loss, TdOutput::Gradient).unwrap(),
                Some(w) => {
                    let var = candle_core::Var::from_tensor(&q).unwrap();
                    let w = Tensor::from_slice(w, p, &Device::Cpu).unwrap();
                    let losses = population_td_loss(var.as_tensor(), &actions, &targets, loss);
                    let grads = (losses.unwrap() * w).unwrap().sum_all().unwrap().backward();
                    grads.unwrap().get(var.as_tensor()).unwrap().clone()
                }
            };
            assert_eq!(dq, values_of(&expected), "{loss:?}, upstream {upstream:?}");
        }
    }
    let _ = DType::F32;
}

/// A population's variables for the optimizer's test: `[P, ...]` values by shape, the
/// last a weight-norm gain (its own learning-rate scale).
const AGENTS: usize = 3;
const PER_AGENT: [usize; 3] = [35, 5, 300];

/// The kernels' step over host copies of the variables: `(params, grads, states)` each a
/// `Vec` per variable; returns each agent's norm. Tables of `per_table` variables, as a
/// network of more than a table's variables is stepped.
fn kernel_step(
    host: &mut [[Vec<f32>; 3]],
    grads: &[Vec<f32>],
    (lr_scales, ratios): (&[f64], &[f64]),
    (c, bias): (StepCoefficients, [f32; 3]),
    per_table: usize,
) -> Vec<f32> {
    let slots: Vec<VarSlot> = host
        .iter_mut()
        .zip(grads)
        .zip(lr_scales)
        .map(|(([p, s0, s1], g), &lr_scale)| VarSlot {
            param: p.as_mut_ptr() as u64,
            grad: g.as_ptr() as u64,
            s0: s0.as_mut_ptr() as u64,
            s1: s1.as_mut_ptr() as u64,
            per_agent: (p.len() / AGENTS) as u64,
            lr_scale,
        })
        .collect();
    let mut tables = Vec::new();
    for (i, chunk) in slots.chunks(per_table).enumerate() {
        let mut table = VarTable::of(chunk).remove(0);
        (table.first, table.vars) = ((i * per_table) as i32, slots.len() as i32);
        tables.push(table);
    }
    let mut sums = vec![0f64; slots.len() * AGENTS];
    let mut norms = vec![0f32; AGENTS];
    let (sm, nm) = (Ptr::of(&mut sums), Ptr::of(&mut norms));
    // Blocks of 32 (the GPU's 256 takes 8x the OS threads here; the tree is the same).
    for &table in &tables {
        launch([table.count as u32, AGENTS as u32, 1], 32, || unsafe {
            ffi::population_grad_square_sums(table, sm.p())
        });
    }
    let (r, b) = (Ptr::read(ratios), Ptr::read(&bias));
    for &table in &tables {
        launch([2, table.count as u32, AGENTS as u32], 16, || unsafe {
            ffi::population_optimizer_step(table, sm.p(), r.p(), c, b.p(), nm.p())
        });
    }
    norms
}

/// Three steps of the kernels equal three of the CPU's fused step (`step_agents`), for
/// Adam and both RMSprops, with one agent clipped and the others not, per-agent
/// learning rates and a gain's learning-rate scale: to the rounding of the norms' sums,
/// which the kernel adds in another order.
#[test]
fn the_optimizer_step_is_the_cpu_fused_step() {
    let kinds = [
        (OptimizerKind::Adam, false),
        (OptimizerKind::Rmsprop, true),
        (OptimizerKind::Rmsprop, false),
    ];
    for (kind, centered) in kinds {
        // A linear schedule: each step's factor reaches the kernel through the device.
        let config = OptimizerConfig {
            kind,
            centered,
            lr: 1e-2,
            max_grad_norm: 1.0,
            lr_schedule: LrSchedule::Linear {
                to: 0.25,
                updates: 2,
            },
            ..Default::default()
        };
        let mut r = rng();
        let mut store = ParamStore::new(Device::Cpu);
        let mut host = Vec::new();
        for (v, &n) in PER_AGENT.iter().enumerate() {
            let values = values(&mut r, AGENTS * n, 1.0);
            let role = if v == 2 { Role::Gain } else { Role::Weight };
            let t = Tensor::from_slice(&values, (AGENTS, n), &Device::Cpu).unwrap();
            store.add(&format!("v{v}"), t, role).unwrap();
            host.push([values, vec![0f32; AGENTS * n], vec![0f32; AGENTS * n]]);
        }
        let lr_scales = [1.0, 1.0, 2.0];
        let mut cpu = Optimizer::new(&store, &config, 2.0);
        let mut counter = Optimizer::new(&store, &config, 2.0);
        let ratios = [1.0, 0.5, 2.0];
        for step in 0..3 {
            // Agent 1's gradients are large (clipped); the others' small.
            let grads: Vec<Vec<f32>> = PER_AGENT
                .iter()
                .map(|&n| {
                    let mut g = values(&mut r, AGENTS * n, 0.05);
                    g[n..2 * n].iter_mut().for_each(|x| *x *= 100.0);
                    g
                })
                .collect();
            let vars: Vec<_> = store.trainable().map(|p| p.var.clone()).collect();
            let mut loss = Tensor::new(0f32, &Device::Cpu).unwrap();
            for (var, g) in vars.iter().zip(&grads) {
                let g = Tensor::from_slice(g, var.shape(), &Device::Cpu).unwrap();
                loss = (loss + (var.as_tensor() * g).unwrap().sum_all().unwrap()).unwrap();
            }
            let store_grads = loss.backward().unwrap();
            let expected_norms = cpu
                .step_agents(&store_grads, AGENTS, 1.0, Some(&ratios))
                .unwrap()
                .unwrap();
            let c = counter.next_kernel_coefficients(1.0);
            // Kind by kind, the variables in one table and in tables of two.
            let per_table = [3, 2][step % 2];
            let norms = kernel_step(&mut host, &grads, (&lr_scales, &ratios), c, per_table);
            assert!(
                expected_norms[1] > 1.0 && expected_norms[0] < 1.0,
                "{expected_norms:?}"
            );
            for (n, e) in norms.iter().zip(&expected_norms) {
                assert!(
                    (f64::from(*n) - e).abs() <= 1e-6 * e,
                    "{kind:?} step {step}: {n} vs {e}"
                );
            }
            for (var, [p, _, _]) in vars.iter().zip(&host) {
                let expected = values_of(var.as_tensor());
                let worst = p
                    .iter()
                    .zip(&expected)
                    .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
                    .fold(0f32, f32::max);
                assert!(
                    worst <= 1e-6,
                    "{kind:?} centered {centered} step {step}: {worst}"
                );
            }
        }
    }
}

/// Tensors of `shape` with normal values, and the population's layout of them.
fn random_tensor(r: &mut impl Rng, shape: &[usize]) -> (Tensor, Vec<f32>) {
    let n = shape.iter().product();
    let v = values(r, n, 2.0);
    (Tensor::from_slice(&v, shape, &Device::Cpu).unwrap(), v)
}

/// The bias (and weight norm's scale) with and without the ReLU, forward and backward,
/// over features and over channels (11 positions: the CPU's lane sums and their
/// remainder), equal the CPU's per-agent ops bit for bit.
#[test]
fn bias_relu_is_the_cpu_ops() {
    use crate::kernels::bias_relu::{AgentBias, AgentScaledBias};
    use crate::kernels::per_agent::PerAgent;
    let mut r = rng();
    for (shape, unit) in [
        (vec![3, 5, 8], vec![3, 1, 8]),
        (vec![3, 5, 4, 11], vec![3, 1, 4, 1]),
    ] {
        let (p, outer, units) = (shape[0], shape[1], shape[2]);
        let inner: usize = shape[3..].iter().product();
        let dims = [p, outer, units, inner].map(|d| d as i32);
        for (relu, scaled) in [(false, false), (true, false), (false, true), (true, true)] {
            let (t, tv) = random_tensor(&mut r, &shape);
            let (s, sv) = random_tensor(&mut r, &unit);
            let (b, bv) = random_tensor(&mut r, &unit);
            let (dy, dyv) = random_tensor(&mut r, &shape);
            let (applied, grads) =
                applied_with_gradients([&t, &s, &b], &dy, |[t, s, b]| match scaled {
                    false => PerAgent::new(AgentBias::of(t.shape(), relu)?, p).apply1(t, b),
                    true => PerAgent::new(AgentScaledBias::of(t.shape(), relu)?, p).apply2(t, s, b),
                });
            let grad = |i: usize| grads[i].clone();

            let scale = scaled.then_some(sv.as_slice());
            let [out, dt, ds, db] = bias_kernels(dims, [&tv, &bv, &dyv], scale, relu);
            let case = format!("{shape:?} relu {relu} scaled {scaled}");
            assert_eq!(out, values_of(&applied.out), "{case}: output");
            assert_eq!(dt, grad(0), "{case}: input");
            assert_eq!(db, grad(2), "{case}: bias");
            if scaled {
                assert_eq!(ds, grad(1), "{case}: scale");
            }
        }
    }
}

/// The population's im2col is each agent's CPU im2col, and col2im is its adjoint:
/// `<im2col(x), c> = <x, col2im(c)>`, for strides 1 and 2.
#[test]
fn im2col_is_the_cpu_ops_and_col2im_its_adjoint() {
    use crate::kernels::conv::Dims;
    let mut r = rng();
    let (p, batch, c_in, h, w, k) = (2usize, 3usize, 2usize, 7usize, 6usize, 3usize);
    for stride in [1usize, 2] {
        let d = Dims::new(batch, 4, (c_in, h, w), k, stride).unwrap();
        let (oh, ow) = ((h - k) / stride + 1, (w - k) / stride + 1);
        let dims = ConvDims {
            batch: batch as i32,
            c_in: c_in as i32,
            h: h as i32,
            w: w as i32,
            k: k as i32,
            stride: stride as i32,
            oh: oh as i32,
            ow: ow as i32,
        };
        let input = batch * c_in * h * w;
        let x = values(&mut r, p * input, 2.0);
        let per_agent = d.patch() * d.columns();
        let mut cols = vec![0f32; p * per_agent];
        let (xp, cp) = (Ptr::read(&x), Ptr::of(&mut cols));
        launch([3, 1, 1], 32, || unsafe {
            ffi::population_im2col(xp.p(), cp.p(), p as i32, dims)
        });
        let expected: Vec<f32> = x.chunks(input).flat_map(|x| d.im2col(x)).collect();
        assert_eq!(cols, expected, "stride {stride}");

        let c = values(&mut r, p * per_agent, 2.0);
        let mut dx = vec![0f32; p * input];
        let (cq, dxp) = (Ptr::read(&c), Ptr::of(&mut dx));
        launch([2, 1, 1], 32, || unsafe {
            ffi::population_col2im(cq.p(), dxp.p(), p as i32, dims)
        });
        let dot = |a: &[f32], b: &[f32]| -> f64 {
            a.iter()
                .zip(b)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        };
        let (left, right) = (dot(&cols, &c), dot(&x, &dx));
        assert!(
            (left - right).abs() <= 1e-5 * left.abs().max(1.0),
            "stride {stride}: {left} vs {right}"
        );
    }
}

/// Layer norm, group norm (over features, and over channels' positions) and RMSNorm,
/// with and without the ReLU, forward and backward, equal the CPU's per-agent ops bit
/// for bit.
#[test]
fn row_norms_are_the_cpu_ops() {
    use crate::kernels::layer_norm::FusedLayerNorm;
    use crate::kernels::per_agent::PerAgent;
    use crate::kernels::rms_norm::FusedRmsNorm;
    let mut r = rng();
    // (input shape, groups, spatial, rms)
    let cases = [
        (vec![3, 5, 12], 1, 1, false),
        (vec![3, 5, 12], 3, 1, false),
        (vec![2, 4, 4, 5], 2, 5, false),
        (vec![3, 5, 19], 1, 1, true),
    ];
    for (shape, groups, spatial, rms) in cases {
        for relu in [false, true] {
            let (p, rows) = (shape[0], shape[1]);
            let n: usize = shape[2..].iter().product();
            let params = n / spatial;
            let (t, tv) = random_tensor(&mut r, &shape);
            let (g, gv) = random_tensor(&mut r, &[p, params]);
            let (b, bv) = random_tensor(&mut r, &[p, params]);
            let (dy, dyv) = random_tensor(&mut r, &shape);
            let eps = 1e-5;
            let (applied, grads) = applied_with_gradients([&t, &g, &b], &dy, |[t, g, b]| {
                let layer_norm = FusedLayerNorm {
                    eps,
                    relu,
                    groups,
                    spatial,
                };
                match rms {
                    false => PerAgent::new(layer_norm, p).apply2(t, g, b),
                    true => PerAgent::new(FusedRmsNorm { eps, relu }, p).apply1(t, g),
                }
            });
            let grad = |i: usize| grads[i].clone();
            let s = RowNorm::of(
                (p, tv.len(), p * params),
                (groups, spatial),
                (relu, rms, eps),
            )
            .unwrap();
            let case = format!("{s:?}");
            let (mut out, mut dt) = (vec![0f32; tv.len()], vec![0f32; tv.len()]);
            let mut stats = vec![0f32; 2 * p * rows * groups];
            let (mut dg, mut db) = (vec![0f32; p * params], vec![0f32; p * params]);
            let (tp, gp, bp) = (Ptr::read(&tv), Ptr::read(&gv), Ptr::read(&bv));
            let (op, sp, dyp) = (Ptr::of(&mut out), Ptr::of(&mut stats), Ptr::read(&dyv));
            launch([2, 1, 1], 8, || unsafe {
                ffi::row_norm_forward(tp.p(), gp.p(), bp.p(), op.p(), sp.p(), s)
            });
            assert_eq!(out, values_of(&applied.out), "{case}");
            let dtp = Ptr::of(&mut dt);
            launch([2, 1, 1], 8, || unsafe {
                ffi::row_norm_backward_input(tp.p(), gp.p(), op.p(), dyp.p(), sp.p(), dtp.p(), s)
            });
            let (dgp, dbp) = (
                Ptr::of(&mut dg),
                if rms { Ptr::null() } else { Ptr::of(&mut db) },
            );
            launch([3, 1, 1], 4, || unsafe {
                ffi::row_norm_backward_params(tp.p(), op.p(), dyp.p(), sp.p(), dgp.p(), dbp.p(), s)
            });
            assert_eq!(dt, grad(0), "{case}: input");
            assert_eq!(dg, grad(1), "{case}: gain");
            if !rms {
                assert_eq!(db, grad(2), "{case}: shift");
            }
        }
    }
}

/// Batch norm's moments, forward and backward, over features and over feature maps
/// (9 positions: the CPU's four-lane sums and their remainder), with batch statistics,
/// with running ones, and renormalized, with and without the ReLU, equal the CPU's
/// per-agent ops bit for bit.
#[test]
fn batch_norm_is_the_cpu_ops() {
    use crate::kernels::batch_norm::{moments_of, AgentBatchNorm};
    use crate::kernels::per_agent::PerAgent;
    use crate::kernels::units::Units;
    let mut r = rng();
    for shape in [vec![3usize, 6, 10], vec![2, 4, 3, 9]] {
        let (p, outer, units) = (shape[0], shape[1], shape[2]);
        let inner: usize = shape[3..].iter().product();
        let layout = Units {
            outer,
            units,
            inner,
        };
        for (mode, relu) in [(0, false), (0, true), (1, true), (2, false), (2, true)] {
            let (t, tv) = random_tensor(&mut r, &shape);
            let (g, gv) = random_tensor(&mut r, &[p, units]);
            let (b, bv) = random_tensor(&mut r, &[p, units]);
            let (dy, dyv) = random_tensor(&mut r, &shape);
            let eps = 1e-5;
            let s = BatchNorm::of(p, &layout, (relu, mode != 1, eps));
            // The kernel's moments against the CPU's; running statistics for mode 1, a
            // renormalization against them for mode 2.
            let (mut mean, mut var) = (vec![0f32; p * units], vec![0f32; p * units]);
            let (tp, mp, vp) = (Ptr::read(&tv), Ptr::of(&mut mean), Ptr::of(&mut var));
            launch([2, 1, 1], 4, || unsafe {
                ffi::batch_norm_moments(tp.p(), mp.p(), vp.p(), s)
            });
            let per_agent = tv.len() / p;
            let cpu: Vec<_> = tv
                .chunks(per_agent)
                .map(|x| moments_of(&layout, x))
                .collect();
            let cpu_means: Vec<f32> = cpu.iter().flat_map(|m| m.0.clone()).collect();
            let cpu_vars: Vec<f32> = cpu.iter().flat_map(|m| m.1.clone()).collect();
            assert_eq!((&mean, &var), (&cpu_means, &cpu_vars), "{s:?}");
            let running: Vec<Moments> = (0..p)
                .map(|_| {
                    let mean = values(&mut r, units, 0.5);
                    let var = values(&mut r, units, 0.5)
                        .iter()
                        .map(|v| v.abs() + 0.5)
                        .collect();
                    (mean, var)
                })
                .collect();
            let (ops, renorms) = batch_norm_ops(&cpu, &running, (mode, relu, eps));
            let kernel = AgentBatchNorm { ops, units: layout };
            let (applied, grads) = applied_with_gradients([&t, &g, &b], &dy, |[t, g, b]| {
                PerAgent::new(kernel, p).apply2(t, g, b)
            });
            let grad = |i: usize| grads[i].clone();

            if mode == 1 {
                mean = running.iter().flat_map(|r| r.0.clone()).collect();
                var = running.iter().flat_map(|r| r.1.clone()).collect();
            }
            let rv: Vec<f32> = renorms.iter().flat_map(|x| x.r.clone()).collect();
            let dv: Vec<f32> = renorms.iter().flat_map(|x| x.d.clone()).collect();
            let renorm = (mode == 2).then_some((rv.as_slice(), dv.as_slice()));
            let inputs = [&tv, &dyv, &mean, &var, &gv, &bv].map(|v| v.as_slice());
            let [out, dt, dg, db] = batch_norm_kernels(s, inputs, renorm);
            assert_eq!(out, values_of(&applied.out), "{s:?} mode {mode}");
            let case = format!("{s:?} mode {mode}");
            assert_eq!(dt, grad(0), "{case}: input");
            assert_eq!(dg, grad(1), "{case}: gain");
            assert_eq!(db, grad(2), "{case}: shift");
        }
    }
}

/// Per-unit `(mean, var)` of one agent.
type Moments = (Vec<f32>, Vec<f32>);

/// Each agent's CPU batch norm op from its batch moments `cpu`: `mode` 0 with them, 1
/// with the `running` statistics instead, 2 renormalized against those; and the
/// renormalizations made.
fn batch_norm_ops(
    cpu: &[Moments],
    running: &[Moments],
    (mode, relu, eps): (i32, bool, f64),
) -> (
    Vec<crate::kernels::batch_norm::BatchNormOp>,
    Vec<crate::kernels::batch_norm::Renorm>,
) {
    use crate::kernels::batch_norm::{BatchNormOp, Renorm, RenormBounds};
    let mut renorms = Vec::new();
    let ops = cpu
        .iter()
        .zip(running)
        .map(|((m, v), (rm, rv))| {
            let op = match mode {
                1 => BatchNormOp::evaluation(rm.clone(), rv, eps),
                _ => BatchNormOp::training(m.clone(), v, eps),
            };
            if mode != 2 {
                return op.with_relu(relu);
            }
            let bounds = RenormBounds {
                r_max: 1.5,
                d_max: 0.5,
                eps,
            };
            let rn = Renorm::of((m, v), (rm, rv), bounds);
            renorms.push(rn.clone());
            op.with_renorm(rn).with_relu(relu)
        })
        .collect();
    (ops, renorms)
}

/// Batch norm's kernels on `[t, dy, mean, var, gamma, beta]` and, renormalized, `(r,
/// d)`: the output, the input's gradient, the gain's and the shift's.
fn batch_norm_kernels(
    s: BatchNorm,
    [tv, dyv, mean, var, gv, bv]: [&[f32]; 6],
    renorm: Option<(&[f32], &[f32])>,
) -> [Vec<f32>; 4] {
    let (p, units) = (s.agents as usize, s.units as usize);
    let (rp, dp) = renorm.map_or((Ptr::null(), Ptr::null()), |(r, d)| {
        (Ptr::read(r), Ptr::read(d))
    });
    let tp = Ptr::read(tv);
    let n = tv.len();
    let (mut out, mut dt, mut sums) = (vec![0f32; n], vec![0f32; n], vec![0f32; 2 * p * units]);
    let (mut dg, mut db) = (vec![0f32; p * units], vec![0f32; p * units]);
    let (mp, vp, gp, bp) = (
        Ptr::read(mean),
        Ptr::read(var),
        Ptr::read(gv),
        Ptr::read(bv),
    );
    let (op, dyp) = (Ptr::of(&mut out), Ptr::read(dyv));
    launch([3, 1, 1], 16, || unsafe {
        ffi::batch_norm_forward(
            tp.p(),
            mp.p(),
            vp.p(),
            gp.p(),
            bp.p(),
            rp.p(),
            dp.p(),
            op.p(),
            s,
        )
    });
    let (sp, dgp, dbp) = (Ptr::of(&mut sums), Ptr::of(&mut dg), Ptr::of(&mut db));
    launch([2, 1, 1], 4, || unsafe {
        ffi::batch_norm_backward_params(
            tp.p(),
            op.p(),
            dyp.p(),
            mp.p(),
            vp.p(),
            rp.p(),
            dp.p(),
            sp.p(),
            dgp.p(),
            dbp.p(),
            s,
        )
    });
    let dtp = Ptr::of(&mut dt);
    launch([3, 1, 1], 16, || unsafe {
        ffi::batch_norm_backward_input(
            tp.p(),
            op.p(),
            dyp.p(),
            mp.p(),
            vp.p(),
            gp.p(),
            rp.p(),
            sp.p(),
            dtp.p(),
            s,
        )
    });
    [out, dt, dg, db]
}

/// Weight norm's scale `g / ||v||` and its backward, with the product's share of `v`'s
/// gradient (the explicit backward's one pass) and without it (the op's own), equal
/// the CPU's per-agent ops bit for bit; one gain is 0 (the norm taken afresh).
#[test]
fn weight_norm_scale_is_the_cpu_ops() {
    use crate::kernels::per_agent::PerAgent;
    use crate::kernels::weight_norm::AgentWeightScale;
    use crate::nn::weight_norm::stacked_scale_gradients;
    let mut r = rng();
    let (p, units, inputs) = (3usize, 5usize, 21usize);
    let (v, vv) = random_tensor(&mut r, &[p, units, inputs]);
    let mut gv = values(&mut r, p * units, 2.0);
    gv[3] = 0.0;
    let g = Tensor::from_slice(&gv, (p, 1, units), &Device::Cpu).unwrap();
    let (dw, dwv) = random_tensor(&mut r, &[p, units, inputs]);
    let (ds, dsv) = random_tensor(&mut r, &[p, 1, units]);
    let vars = [&g, &v].map(|x| candle_core::Var::from_tensor(x).unwrap());
    let applied = PerAgent::new(AgentWeightScale, p)
        .apply1(vars[0].as_tensor(), vars[1].as_tensor())
        .unwrap();
    let (ag, un, inn) = (p as i32, units as i32, inputs as i32);
    let mut sv = vec![0f32; p * units];
    let (vp, gp, sp) = (Ptr::read(&vv), Ptr::read(&gv), Ptr::of(&mut sv));
    launch([2, 1, 1], 4, || unsafe {
        ffi::weight_norm_scale(vp.p(), gp.p(), sp.p(), ag, un, inn)
    });
    assert_eq!(sv, values_of(&applied.out));

    // With the product's gradient and the forward's scale: the explicit backward's pass.
    let s = Tensor::from_slice(&sv, (p, 1, units), &Device::Cpu).unwrap();
    let (dv_cpu, dg_cpu) =
        stacked_scale_gradients((&vars[1], &vars[0], &s), dw.copy().unwrap(), &ds).unwrap();
    let (mut dv, mut dg) = (vec![0f32; vv.len()], vec![0f32; p * units]);
    let (dwp, dsp) = (Ptr::read(&dwv), Ptr::read(&dsv));
    let (dvp, dgp) = (Ptr::of(&mut dv), Ptr::of(&mut dg));
    launch([2, 1, 1], 4, || unsafe {
        ffi::weight_norm_scale_backward(
            vp.p(),
            gp.p(),
            sp.p(),
            dwp.p(),
            dsp.p(),
            dvp.p(),
            dgp.p(),
            ag,
            un,
            inn,
        )
    });
    assert_eq!(dv, values_of(&dv_cpu), "with the product's gradient: v");
    assert_eq!(dg, values_of(&dg_cpu), "with the product's gradient: g");

    // Alone: the op's backward in candle's graph.
    let grads = (&applied.out * &ds)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let (null, dvp, dgp) = (Ptr::null(), Ptr::of(&mut dv), Ptr::of(&mut dg));
    launch([2, 1, 1], 4, || unsafe {
        ffi::weight_norm_scale_backward(
            vp.p(),
            gp.p(),
            null.p(),
            null.p(),
            dsp.p(),
            dvp.p(),
            dgp.p(),
            ag,
            un,
            inn,
        )
    });
    assert_eq!(
        dv,
        values_of(grads.get(vars[1].as_tensor()).unwrap()),
        "alone: v"
    );
    assert_eq!(
        dg,
        values_of(grads.get(vars[0].as_tensor()).unwrap()),
        "alone: g"
    );
}

/// The bias kernels on `[t, bias, dy]` laid out as `dims` (agents, outer, units,
/// inner), with weight norm's `scale` where given: the output, the input's gradient,
/// the scale's (empty without one) and the bias's.
fn bias_kernels(
    dims: [i32; 4],
    [tv, bv, dyv]: [&[f32]; 3],
    scale: Option<&[f32]>,
    relu: bool,
) -> [Vec<f32>; 4] {
    let [ag, ou, un, inn] = dims;
    let (n, per_unit) = (tv.len(), (ag * un) as usize);
    let (mut out, mut dt) = (vec![0f32; n], vec![0f32; n]);
    let (mut ds, mut db) = (vec![0f32; per_unit], vec![0f32; per_unit]);
    let sp = scale.map_or(Ptr::null(), Ptr::read);
    let (tp, bp, o) = (Ptr::read(tv), Ptr::read(bv), Ptr::of(&mut out));
    let relu = i32::from(relu);
    launch([3, 1, 1], 32, || unsafe {
        ffi::agent_bias_forward(tp.p(), sp.p(), bp.p(), o.p(), ag, ou, un, inn, relu)
    });
    let (dyp, dtp) = (Ptr::read(dyv), Ptr::of(&mut dt));
    launch([2, 1, 1], 64, || unsafe {
        ffi::agent_bias_backward_input(sp.p(), o.p(), dyp.p(), dtp.p(), ag, ou, un, inn, relu)
    });
    let dsp = if scale.is_some() {
        Ptr::of(&mut ds)
    } else {
        Ptr::null()
    };
    let dbp = Ptr::of(&mut db);
    launch([2, 1, 1], 8, || unsafe {
        ffi::agent_bias_backward_params(
            tp.p(),
            o.p(),
            dyp.p(),
            dsp.p(),
            dbp.p(),
            ag,
            ou,
            un,
            inn,
            relu,
        )
    });
    [out, dt, ds, db]
}
