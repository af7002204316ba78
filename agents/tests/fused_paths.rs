//! Fused CPU paths against their tensor-op references: the same values and gradients
//! (to 1e-5 relative).

mod common;
use common::*;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use normrl_agents::nn::init::InitRng;
use normrl_agents::nn::{
    BatchNorm, BnStats, GroupNorm, LayerNorm, LinearMap, MeanOnlyBn, NormKind, ParamStore, Pass,
    QNetwork, QNetworkConfig, RmsNorm, Role, WeightNorm,
};
use normrl_agents::optim::{Optimizer, OptimizerConfig, OptimizerKind};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

fn random(shape: &[usize], rng: &mut Xoshiro256PlusPlus, offset: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0 + offset)
        .collect();
    Tensor::from_vec(v, shape, &DEV).unwrap()
}

/// The batch-norm family's cases: Linear batch 32, conv batch 8, the batch-1 Linear
/// case (no gradient below in training mode) and 21 features (a block of 16 and five
/// single ones).
fn batch_norm_shapes() -> [Vec<usize>; 4] {
    [
        vec![32usize, 64],
        vec![8, 16, 10, 10],
        vec![1, 5],
        vec![16, 21],
    ]
}

/// Each case in training and evaluation mode, alone and with the op's tail.
const BATCH_NORM_VARIANTS: [(BnStats, bool); 4] = [
    (BnStats::Batch, false),
    (BnStats::Running, false),
    (BnStats::Batch, true),
    (BnStats::Running, true),
];

/// `y = forward(x)` with `x` a variable, and the gradients of `sum(y * upstream)`.
fn forward_backward(
    x: &Tensor,
    upstream: &Tensor,
    forward: impl Fn(&Tensor) -> Tensor,
) -> (Tensor, Tensor, GradStore) {
    let x = Var::from_tensor(x).unwrap();
    let y = forward(x.as_tensor());
    let grads = (&y * upstream)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let dx = grads.get(x.as_tensor()).unwrap().clone();
    (y, dx, grads)
}

/// Each fused result against its reference, by name: max relative error within
/// `tolerance(name)`.
fn assert_matches(
    names: &[&str],
    fused: &[Tensor],
    reference: &[Tensor],
    tolerance: impl Fn(&str) -> f32,
    context: &str,
) {
    assert_eq!(names.len(), fused.len());
    for ((name, a), b) in names.iter().zip(fused).zip(reference) {
        let e = max_rel_err(a, b);
        assert!(e <= tolerance(name), "{context} {name}: relative error {e}");
    }
}

#[test]
fn fused_batch_norm_matches_the_reference() {
    on_every_path(|| {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        // Evaluation mode uses running statistics, set away from 0 and 1. Each case also
        // followed by a ReLU, which the fused op applies itself.
        let (cases, variants) = (batch_norm_shapes(), BATCH_NORM_VARIANTS);
        for (shape, (mode, relu)) in cases.iter().flat_map(|s| variants.map(|v| (s.clone(), v))) {
            let units = shape[1];
            let running_mean = random(&[units], &mut rng, 0.2);
            let running_var = random(&[units], &mut rng, 2.0);
            let gamma = random(&[units], &mut rng, 1.0);
            let beta = random(&[units], &mut rng, 0.0);
            let x = random(&shape, &mut rng, 0.5);
            let upstream = random(&shape, &mut rng, 0.0);
            let run = |fused: bool| {
                let mut store = ParamStore::new(DEV);
                let bn = BatchNorm::new(&mut store, "l", units, 0.1, 1e-5).unwrap();
                store.get("l.bn.gamma").unwrap().var.set(&gamma).unwrap();
                store.get("l.bn.beta").unwrap().var.set(&beta).unwrap();
                let running = |name: &str, value: &Tensor| {
                    store.get(name).unwrap().var.set(value).unwrap();
                };
                running("l.bn.running_mean", &running_mean);
                running("l.bn.running_var", &running_var);
                let (y, dx, grads) = forward_backward(&x, &upstream, |x| match (fused, relu) {
                    (true, false) => bn.forward(x, mode).unwrap(),
                    (true, true) => bn.forward_relu(x, mode).unwrap(),
                    (false, false) => bn.forward_reference(x, mode).unwrap(),
                    (false, true) => bn.forward_reference(x, mode).unwrap().relu().unwrap(),
                });
                let grad = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
                let p = |name: &str| store.get(name).unwrap().var.clone();
                [
                    y,
                    dx,
                    grad(&p("l.bn.gamma")),
                    grad(&p("l.bn.beta")),
                    bn.running_mean().clone(),
                    bn.running_var().clone(),
                ]
            };
            let (fused, reference) = (run(true), run(false));
            let names = BATCH_NORM_OUTPUTS;
            let tolerance = |name: &str| {
                if shape[0] == 1 && name == "dx" {
                    1e-4
                } else {
                    1e-5
                }
            };
            let context = format!("{shape:?} {mode:?} relu {relu}");
            assert_matches(&names, &fused, &reference, tolerance, &context);
            if shape[0] == 1 && mode == BnStats::Batch {
                let dx: Vec<f32> = fused[1].flatten_all().unwrap().to_vec1().unwrap();
                assert!(
                    dx.iter().all(|v| *v == 0.0),
                    "batch 1 passes no gradient: {dx:?}"
                );
            }
        }
    });
}

/// `y`, then the ReLU where `relu` (a reference forward's tail).
fn then_relu(y: Tensor, relu: bool) -> Tensor {
    if relu {
        y.relu().unwrap()
    } else {
        y
    }
}

/// A per-sample norm's forward: `(x, fused, relu)` to its output.
type NormForward = Box<dyn Fn(&Tensor, bool, bool) -> Tensor>;

/// A per-sample normalization's fused op against autodiff through its tensor ops, on
/// Linear and conv shapes, with and without the ReLU. `params` are its variables by
/// name, set to random values around the given offsets; `build` makes it in a store.
/// Returns each case's input, its first variable's values and the fused output (the
/// cases alternate without and with the ReLU).
fn check_per_sample_norm(
    seed: u64,
    params: &[(&str, f32)],
    param_shape: impl Fn(&[usize]) -> Vec<usize>,
    build: impl Fn(&mut ParamStore, &[usize]) -> NormForward,
) -> Vec<[Tensor; 3]> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let cases = [vec![32usize, 64], vec![8, 16, 8, 8], vec![1, 5]];
    let mut checked = vec![];
    for (shape, relu) in cases
        .iter()
        .flat_map(|s| [(s.clone(), false), (s.clone(), true)])
    {
        let features = &shape[1..];
        let values: Vec<Tensor> = params
            .iter()
            .map(|(_, offset)| random(&param_shape(features), &mut rng, *offset))
            .collect();
        let x = random(&shape, &mut rng, 0.5);
        let upstream = random(&shape, &mut rng, 0.0);
        let run = |fused: bool| {
            let mut store = ParamStore::new(DEV);
            let forward = build(&mut store, features);
            for ((name, _), v) in params.iter().zip(&values) {
                store.get(name).unwrap().var.set(v).unwrap();
            }
            let (y, dx, grads) = forward_backward(&x, &upstream, |x| forward(x, fused, relu));
            let mut out = vec![y, dx];
            for (name, _) in params {
                let var = store.get(name).unwrap().var.clone();
                out.push(grads.get(var.as_tensor()).unwrap().clone());
            }
            out
        };
        let (fused, reference) = (run(true), run(false));
        let mut names = vec!["output".to_string(), "dx".to_string()];
        names.extend(params.iter().map(|(n, _)| format!("d{n}")));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let context = format!("{shape:?} relu {relu}");
        assert_matches(&names, &fused, &reference, |_| 1e-5, &context);
        checked.push([x, values[0].clone(), fused[0].clone()]);
    }
    checked
}

#[test]
fn fused_layer_norm_matches_the_reference() {
    on_every_path(|| {
        let params = [("l.ln.gamma", 1.0), ("l.ln.beta", 0.0)];
        check_per_sample_norm(5, &params, <[usize]>::to_vec, |store, features| {
            let ln = LayerNorm::new(store, "l", features, 1e-5).unwrap();
            Box::new(move |x, fused, relu| match (fused, relu) {
                (true, false) => ln.forward(x).unwrap(),
                (true, true) => ln.forward_relu(x).unwrap(),
                (false, false) => ln.forward_reference(x).unwrap(),
                (false, true) => ln.forward_reference(x).unwrap().relu().unwrap(),
            })
        });
    });
}

/// RMSNorm's fused op against autodiff of its tensor ops, and its values against the
/// definition computed by hand.
#[test]
fn fused_rms_norm_matches_the_reference_and_its_definition() {
    on_every_path(|| {
        let params = [("l.rms.gamma", 1.0)];
        let checked = check_per_sample_norm(7, &params, <[usize]>::to_vec, |store, features| {
            let rms = RmsNorm::new(store, "l", features, 1e-5).unwrap();
            Box::new(move |x, fused, relu| match fused {
                true => rms.forward(x, relu).unwrap(),
                false => then_relu(rms.forward_reference(x).unwrap(), relu),
            })
        });
        for (case, [x, gamma, y]) in checked.iter().enumerate() {
            let relu = case % 2 == 1;
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let (xs, gs, ys) = (flat(x), flat(gamma), flat(y));
            for (row, out) in xs.chunks(gs.len()).zip(ys.chunks(gs.len())) {
                // y = gamma * x / sqrt(mean(x^2) + eps), per sample.
                let ms = row.iter().map(|v| f64::from(v * v)).sum::<f64>() / row.len() as f64;
                let inv = 1.0 / (ms + 1e-5).sqrt();
                for ((v, g), y) in row.iter().zip(&gs).zip(out) {
                    let by_hand = f64::from(*v) * inv * f64::from(*g);
                    let by_hand = if relu { by_hand.max(0.0) } else { by_hand };
                    assert!((f64::from(*y) - by_hand).abs() < 1e-5, "{y} vs {by_hand}");
                }
            }
        }
    });
}

/// Group norm's fused op (layer norm's, with statistics per group and per-channel
/// parameters) against autodiff of its tensor ops; with one group on Linear layers it
/// is layer norm, with a group per channel instance norm.
#[test]
fn fused_group_norm_matches_the_reference_layer_norm_and_instance_norm() {
    on_every_path(|| {
        let params = [("l.gn.gamma", 1.0), ("l.gn.beta", 0.0)];
        // 64 units and 16 channels in 2 groups (the third case's 5 units in 1).
        let groups = |features: &[usize]| if features[0] == 5 { 1 } else { 2 };
        check_per_sample_norm(
            8,
            &params,
            |f| vec![f[0]],
            |store, features| {
                let gn = GroupNorm::new(store, "l", features, groups(features), 1e-5).unwrap();
                Box::new(move |x, fused, relu| match fused {
                    true => gn.forward(x, relu).unwrap(),
                    false => then_relu(gn.forward_reference(x).unwrap(), relu),
                })
            },
        );
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
        // One group on a Linear layer: layer norm (the same per-feature parameters).
        let x = random(&[6, 12], &mut rng, 0.3);
        let mut store = ParamStore::new(DEV);
        let gn = GroupNorm::new(&mut store, "g", &[12], 1, 1e-5).unwrap();
        let ln = LayerNorm::new(&mut store, "l", &[12], 1e-5).unwrap();
        let err = (gn.forward(&x, false).unwrap() - ln.forward(&x).unwrap())
            .unwrap()
            .max_abs();
        assert!(err < 1e-5, "{err}");
        // A group per channel on a conv layer: each channel normalized over its positions.
        let x = random(&[3, 4, 5, 5], &mut rng, 0.3);
        let gn = GroupNorm::new(&mut store, "i", &[4, 5, 5], 4, 1e-5).unwrap();
        let y: Vec<f32> = gn
            .forward(&x, false)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        for (channel, out) in xs.chunks(25).zip(y.chunks(25)) {
            let mean = channel.iter().map(|&v| f64::from(v)).sum::<f64>() / 25.0;
            let var = channel
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / 25.0;
            for (v, y) in channel.iter().zip(out) {
                let by_hand = (f64::from(*v) - mean) / (var + 1e-5).sqrt();
                assert!((f64::from(*y) - by_hand).abs() < 1e-4, "{y} vs {by_hand}");
            }
        }
    });
}

#[test]
fn fused_mean_only_batch_norm_matches_the_reference() {
    on_every_path(|| {
        // Alone, and with the layer's bias and the ReLU in the same op.
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(6);
        let (cases, variants) = (batch_norm_shapes(), BATCH_NORM_VARIANTS);
        for (shape, (mode, bias_relu)) in
            cases.iter().flat_map(|s| variants.map(|v| (s.clone(), v)))
        {
            let units = shape[1];
            let x = random(&shape, &mut rng, 0.5);
            let upstream = random(&shape, &mut rng, 0.0);
            let running_mean = random(&[units], &mut rng, 0.3);
            let bias = random(&[units], &mut rng, 0.1);
            let run = |fused: bool| {
                let mut store = ParamStore::new(DEV);
                let bn = MeanOnlyBn::new(&mut store, "l", units, 0.1).unwrap();
                bn.set_running_mean(&running_mean).unwrap();
                let b = Var::from_tensor(&bias).unwrap();
                let (y, dx, grads) =
                    forward_backward(&x, &upstream, |x| match (fused, bias_relu) {
                        (true, false) => bn.forward(x, mode).unwrap(),
                        (true, true) => bn.forward_bias_relu(x, b.as_tensor(), mode).unwrap(),
                        (false, false) => bn.forward_reference(x, mode).unwrap(),
                        (false, true) => {
                            let t = bn.forward_reference(x, mode).unwrap();
                            normrl_agents::kernels::bias_relu::add_unit_bias_reference(
                                &t,
                                b.as_tensor(),
                            )
                            .unwrap()
                            .relu()
                            .unwrap()
                        }
                    });
                let db = match grads.get(b.as_tensor()) {
                    Some(db) => db.clone(),
                    None => b.as_tensor().zeros_like().unwrap(),
                };
                [y, dx, db, bn.running_mean().clone()]
            };
            let (fused, reference) = (run(true), run(false));
            let names = ["output", "dx", "dbias", "running mean"];
            let context = format!("{shape:?} {mode:?} bias+relu {bias_relu}");
            assert_matches(&names, &fused, &reference, |_| 1e-5, &context);
        }
    });
}

#[test]
fn fused_optimizer_flushes_state_that_would_turn_subnormal() {
    on_every_path(|| {
        // One gradient of 1, then none: Adam's m decays by 0.9 a step, from 0.1 to
        // 0.1 * 0.9^850 ~ 1e-40 (subnormal) in IEEE arithmetic; the fused loop sets it to 0
        // once below 1e-36, and the tensor reference keeps the subnormal.
        let mut m_after = vec![];
        for fused in [true, false] {
            let mut store = ParamStore::new(DEV);
            let x = store
                .add("x", Tensor::new(&[0.5f32], &DEV).unwrap(), Role::Weight)
                .unwrap();
            let cfg = OptimizerConfig {
                max_grad_norm: 0.0,
                ..Default::default()
            };
            let mut opt = if fused {
                Optimizer::new(&store, &cfg, 1.0)
            } else {
                Optimizer::reference(&store, &cfg, 1.0).unwrap()
            };
            for step in 0..850 {
                // A slope tensor: candle drops the gradient of a product with the scalar 0.
                let slope = Tensor::new(&[if step == 0 { 1f32 } else { 0.0 }], &DEV).unwrap();
                let loss = x.as_tensor().mul(&slope).unwrap().sum_all().unwrap();
                opt.step(&loss.backward().unwrap()).unwrap();
            }
            let state = opt.state_tensors().unwrap();
            m_after.push(state["x.state0"].to_vec1::<f32>().unwrap()[0]);
        }
        assert_eq!(m_after[0], 0.0, "fused m");
        assert!(
            m_after[1] > 0.0 && m_after[1] < f32::MIN_POSITIVE,
            "reference m {}",
            m_after[1]
        );
    });
}

#[test]
fn fused_optimizer_equals_tensor_reference() {
    on_every_path(|| {
        for kind in [OptimizerKind::Adam, OptimizerKind::Rmsprop] {
            for centered in [true, false] {
                let norm = config(NormKind::WeightNorm);
                let make = || {
                    QNetwork::new(&QNetworkConfig::mlp(vec![16]), &norm, &[5], 3, 7, &DEV).unwrap()
                };
                let (a, b) = (make(), make());
                let cfg = OptimizerConfig {
                    kind,
                    centered,
                    lr: 0.01,
                    max_grad_norm: 0.5,
                    ..Default::default()
                };
                let mut fused = Optimizer::new(a.store(), &cfg, 10.0);
                let mut reference = Optimizer::reference(b.store(), &cfg, 10.0).unwrap();
                let mut rng = InitRng::new(1);
                for _ in 0..10 {
                    let x = rng.normal((8, 5), 1.0, &DEV).unwrap();
                    let loss = |net: &QNetwork| {
                        let q = net.forward(&x, Pass::TRAIN).unwrap();
                        q.sqr().unwrap().sum_all().unwrap()
                    };
                    let (la, lb) = (loss(&a), loss(&b));
                    let (na, nb) = (step_on(&mut fused, &la), step_on(&mut reference, &lb));
                    // The two sum in different orders: f32 rounding drifts a little.
                    assert!(
                        (na - nb).abs() <= 1e-4 * nb.max(1e-12),
                        "grad norms {na} {nb}"
                    );
                    for (pa, pb) in a.store().params().iter().zip(b.store().params()) {
                        let e = rel_err(pa.var.as_tensor(), pb.var.as_tensor());
                        assert!(e < 1e-5, "{kind:?} centered={centered} {}: {e}", pa.name);
                    }
                    // Each step is compared from the same weights: rounding differences
                    // would otherwise compound through the forward passes.
                    b.store().copy_from(a.store()).unwrap();
                }
            }
        }
    });
}

#[test]
fn fused_weight_norm_equals_unfused_reference() {
    on_every_path(|| {
        for (kernel, x_shape) in [linear(), conv()] {
            let WeightNormCase {
                wn,
                x,
                v: v_t,
                g: g_t,
                ..
            } = weight_norm_case(kernel, x_shape, 12, 0.4);
            let mut grads = vec![];
            let mut outputs = vec![];
            for fused in [true, false] {
                let w = if fused {
                    wn.weight().unwrap()
                } else {
                    wn.weight_reference().unwrap()
                };
                let y = kernel.apply(&x, &w).unwrap();
                let g = loss_of(&y, &mut InitRng::new(4)).backward().unwrap();
                grads.push((g.get(&v_t).unwrap().clone(), g.get(&g_t).unwrap().clone()));
                outputs.push(w);
            }
            assert!(rel_err(&outputs[0], &outputs[1]) < 1e-6);
            assert!(rel_err(&grads[0].0, &grads[1].0) < 1e-5, "dL/dv");
            assert!(rel_err(&grads[0].1, &grads[1].1) < 1e-5, "dL/dg");
        }
    });
}

#[test]
fn weight_norm_output_scaling_equals_the_unfused_reference() {
    on_every_path(|| {
        // Data input (the first layer) and an input that needs its gradient; and a gain of
        // exactly 0, whose dL/dg cannot come from the scaled output.
        let cases = [(false, false), (true, false), (false, true)];
        // A batch whose output outgrows the weight, so that `apply` forms `w`.
        let large_batch = (linear().0, vec![1000, 7]);
        for ((kernel, x_shape), (x_is_variable, zero_gain)) in [linear(), conv(), large_batch]
            .into_iter()
            .flat_map(|k| cases.map(|c| (k.clone(), c)))
        {
            let mut rng = InitRng::new(13);
            let mut store = ParamStore::new(DEV);
            let v = rng.normal(kernel.weight_shape(), 0.4, &DEV).unwrap();
            let mut g: Vec<f32> = rng
                .normal(kernel.units(), 1.0, &DEV)
                .unwrap()
                .to_vec1()
                .unwrap();
            if zero_gain {
                g[1] = 0.0;
            }
            let g = Tensor::new(g, &DEV).unwrap();
            let wn = WeightNorm::from_values(&mut store, "l", kernel, v, g).unwrap();
            let x = Var::from_tensor(&rng.normal(x_shape.clone(), 1.0, &DEV).unwrap()).unwrap();
            let x_in = if x_is_variable {
                x.as_tensor().clone()
            } else {
                x.as_tensor().detach()
            };
            let params = ["l.v", "l.g"].map(|n| store.get(n).unwrap().var.as_tensor().clone());
            let mut results = vec![];
            // The reference last; `apply` scales outputs or forms `w`, whichever is smaller.
            for path in ["output scaled", "apply", "reference"] {
                let y = match path {
                    "output scaled" => wn.apply_output_scaled(&x_in).unwrap(),
                    "apply" => wn.apply(&x_in).unwrap(),
                    _ => kernel
                        .apply_reference(&x_in, &wn.weight_reference().unwrap())
                        .unwrap(),
                };
                let grads = loss_of(&y, &mut InitRng::new(6)).backward().unwrap();
                let grad = |t: &Tensor| grads.get(t).cloned();
                results.push([
                    Some(y),
                    grad(&params[0]),
                    grad(&params[1]),
                    grad(x.as_tensor()),
                ]);
            }
            let names = ["output", "dL/dv", "dL/dg", "dL/dx"];
            let (reference, fused) = results.split_last().unwrap();
            let pairs = fused
                .iter()
                .flat_map(|f| names.iter().zip(f).zip(reference));
            for ((name, a), b) in pairs {
                match (a, b) {
                    (Some(a), Some(b)) => {
                        let e = rel_err(a, b);
                        assert!(
                            e < 1e-5,
                            "{kernel:?} x variable {x_is_variable} zero gain {zero_gain} {name}: {e}"
                        );
                    }
                    (None, None) => assert!(!x_is_variable && *name == "dL/dx"),
                    _ => panic!("{kernel:?} {name}: a gradient on one path only"),
                }
            }
        }
    });
}

#[test]
fn data_convolution_equals_candle_conv2d_in_values_and_weight_gradients() {
    on_every_path(|| {
        // Kernels smaller and larger than the image, output rows shorter and longer than a
        // SIMD vector, channel counts that are not multiples of eight, strides 1, 2 and 4.
        let geometries = [
            (4, 16, 3, 1, 10),
            (3, 11, 2, 1, 12),
            (2, 5, 4, 1, 5),
            (4, 8, 8, 4, 36),
            (3, 5, 2, 2, 7),
        ];
        for (c_in, c_out, k, stride, side) in geometries {
            let kernel = LinearMap::Conv2d {
                c_in,
                c_out,
                k,
                stride,
                padding: 0,
            };
            let mut rng = InitRng::new(21);
            let x = rng.normal((5, c_in, side, side), 1.0, &DEV).unwrap();
            let w =
                Var::from_tensor(&rng.normal(kernel.weight_shape(), 0.3, &DEV).unwrap()).unwrap();
            let mut results = vec![];
            for fused in [true, false] {
                let y = if fused {
                    kernel.apply(&x, w.as_tensor()).unwrap()
                } else {
                    kernel.apply_reference(&x, w.as_tensor()).unwrap()
                };
                let grads = loss_of(&y, &mut InitRng::new(2)).backward().unwrap();
                results.push((y, grads.get(w.as_tensor()).unwrap().clone()));
            }
            assert_eq!(results[0].0.dims(), results[1].0.dims());
            assert!(
                rel_err(&results[0].0, &results[1].0) < 1e-5,
                "values k={k} s={stride}"
            );
            assert!(
                rel_err(&results[0].1, &results[1].1) < 1e-5,
                "weight gradients k={k} s={stride}"
            );
        }
    });
}

#[test]
fn fused_bias_and_relu_equal_tensor_ops() {
    on_every_path(|| {
        use normrl_agents::kernels::bias_relu;
        for shape in [vec![6, 5], vec![4, 3, 5, 5]] {
            let mut rng = InitRng::new(31);
            let t = Var::from_tensor(&rng.normal(shape.clone(), 1.0, &DEV).unwrap()).unwrap();
            let b = Var::from_tensor(&rng.normal(shape[1], 1.0, &DEV).unwrap()).unwrap();
            let mut results = vec![];
            for path in ["bias then relu", "bias_relu", "reference"] {
                let (t, b) = (t.as_tensor(), b.as_tensor());
                let y = match path {
                    "bias then relu" => {
                        bias_relu::relu(&bias_relu::add_unit_bias(t, b).unwrap()).unwrap()
                    }
                    "bias_relu" => bias_relu::bias_relu(t, b).unwrap(),
                    _ => bias_relu::add_unit_bias_reference(t, b)
                        .unwrap()
                        .relu()
                        .unwrap(),
                };
                let grads = loss_of(&y, &mut InitRng::new(3)).backward().unwrap();
                results.push((
                    y,
                    grads.get(t).unwrap().clone(),
                    grads.get(b).unwrap().clone(),
                ));
            }
            for fused in &results[..2] {
                let reference = &results[2];
                assert!(rel_err(&fused.0, &reference.0) < 1e-6);
                assert!(rel_err(&fused.1, &reference.1) < 1e-6);
                assert!(rel_err(&fused.2, &reference.2) < 1e-5);
            }
        }
    });
}

#[test]
fn linear_op_reads_a_conv_output_as_flattened_rows() {
    on_every_path(|| {
        let kernel = LinearMap::Linear { n_in: 30, n_out: 4 };
        let mut rng = InitRng::new(42);
        let x = Var::from_tensor(&rng.normal((3, 2, 3, 5), 1.0, &DEV).unwrap()).unwrap();
        let w = Var::from_tensor(&rng.normal((4, 30), 1.0, &DEV).unwrap()).unwrap();
        let mut results = vec![];
        for flatten_first in [false, true] {
            let input = if flatten_first {
                x.as_tensor().flatten_from(1).unwrap()
            } else {
                x.as_tensor().clone()
            };
            let y = kernel.apply(&input, w.as_tensor()).unwrap();
            let grads = loss_of(&y, &mut InitRng::new(7)).backward().unwrap();
            let dx = grads.get(x.as_tensor()).unwrap().clone();
            assert_eq!(dx.dims(), &[3, 2, 3, 5]);
            results.push((y, dx, grads.get(w.as_tensor()).unwrap().clone()));
        }
        assert_eq!(results[0].0.dims(), &[3, 4]);
        assert!(rel_err(&results[0].0, &results[1].0) < 1e-6);
        assert!(rel_err(&results[0].1, &results[1].1) < 1e-6);
        assert!(rel_err(&results[0].2, &results[1].2) < 1e-6);
    });
}

#[test]
fn linear_op_equals_candle_matmul_in_values_and_gradients() {
    on_every_path(|| {
        // A batch larger than the layer, and a small batch through a large weight: the
        // forward orders its product differently in the two cases.
        for (batch, n_in, n_out) in [(6, 9, 4), (3, 9, 7), (5, 300, 70)] {
            let kernel = LinearMap::Linear { n_in, n_out };
            let mut rng = InitRng::new(41);
            let x = Var::from_tensor(&rng.normal((batch, n_in), 1.0, &DEV).unwrap()).unwrap();
            let w = Var::from_tensor(&rng.normal((n_out, n_in), 1.0, &DEV).unwrap()).unwrap();
            let mut results = vec![];
            for fused in [true, false] {
                let y = if fused {
                    kernel.apply(x.as_tensor(), w.as_tensor()).unwrap()
                } else {
                    kernel
                        .apply_reference(x.as_tensor(), w.as_tensor())
                        .unwrap()
                };
                let grads = loss_of(&y, &mut InitRng::new(5)).backward().unwrap();
                results.push((
                    y,
                    grads.get(x.as_tensor()).unwrap().clone(),
                    grads.get(w.as_tensor()).unwrap().clone(),
                ));
            }
            assert!(
                rel_err(&results[0].0, &results[1].0) < 1e-6,
                "values b={batch}"
            );
            assert!(rel_err(&results[0].1, &results[1].1) < 1e-6, "dx b={batch}");
            assert!(rel_err(&results[0].2, &results[1].2) < 1e-6, "dW b={batch}");
        }
    });
}

#[test]
fn fused_td_loss_equals_tensor_ops() {
    on_every_path(|| {
        use normrl_agents::dqn::{mean_taken, td_loss, td_loss_tensor_ops, Loss};
        let mut rng = InitRng::new(8);
        // Q-values and targets far enough apart that some errors are past Huber's
        // threshold of 1 and some inside it.
        let q = Var::from_tensor(&rng.normal((9, 4), 1.5, &DEV).unwrap()).unwrap();
        let actions: Vec<u32> = (0..9).map(|i| (i * 7 % 4) as u32).collect();
        let targets: Vec<f32> = rng.normal(9, 1.0, &DEV).unwrap().to_vec1().unwrap();
        let actions_t = Tensor::from_slice(&actions, (9, 1), &DEV).unwrap();
        let targets_t = Tensor::from_slice(&targets, 9, &DEV).unwrap();
        let q_values: Vec<Vec<f32>> = q.as_tensor().to_vec2().unwrap();
        let errors: Vec<f32> = (0..9)
            .map(|i| q_values[i][actions[i] as usize] - targets[i])
            .collect();
        assert!(errors.iter().any(|d| d.abs() > 1.0) && errors.iter().any(|d| d.abs() < 1.0));
        for loss in [Loss::Huber, Loss::Mse] {
            let fused = td_loss(q.as_tensor(), &actions, &targets, loss).unwrap();
            let reference =
                td_loss_tensor_ops(q.as_tensor(), &actions_t, &targets_t, loss).unwrap();
            let grad = |l: &Tensor| l.backward().unwrap().get(q.as_tensor()).unwrap().clone();
            let (value, expected) = (
                fused.to_scalar::<f32>().unwrap(),
                reference.to_scalar::<f32>().unwrap(),
            );
            assert!(
                (value - expected).abs() <= 1e-6 * expected.abs(),
                "{loss:?}: {value} {expected}"
            );
            let e = max_rel_err(&grad(&fused), &grad(&reference));
            assert!(e < 1e-6, "{loss:?} dL/dq: {e}");
        }
        let mean: f64 = errors
            .iter()
            .zip(&targets)
            .map(|(d, y)| f64::from(d + y))
            .sum::<f64>()
            / 9.0;
        assert!((mean_taken(q.as_tensor(), &actions).unwrap() - mean).abs() < 1e-6);
        // An action past the Q-values, or a batch of the wrong size, is an error.
        let q = q.as_tensor();
        assert!(td_loss(q, &[4; 9], &targets, Loss::Huber).is_err());
        assert!(td_loss(q, &actions[..3], &targets, Loss::Huber).is_err());
        assert!(mean_taken(q, &[4; 9]).is_err());
        assert!(mean_taken(q, &actions[..3]).is_err());
    });
}
