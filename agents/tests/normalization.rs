//! The normalization layers against their definitions (`docs/methods.md`).

mod common;
use common::*;

use candle_core::{DType, Tensor, Var, D};
use normrl_agents::nn::init::InitRng;
use normrl_agents::nn::{
    svb, unit_moments, Layer, LinearMap, NormConfig, NormKind, ParamStore, Pass, QNetwork,
    QNetworkConfig,
};
use normrl_agents::optim::{Optimizer, OptimizerConfig, OptimizerKind};

/// An MLP of `hidden` widths on `(observation size, actions)`, initialized from `seed`.
fn mlp_net(
    hidden: Vec<usize>,
    norm: &NormConfig,
    (obs, actions): (usize, usize),
    seed: u64,
) -> QNetwork {
    QNetwork::new(
        &QNetworkConfig::mlp(hidden),
        norm,
        &[obs],
        actions,
        seed,
        &DEV,
    )
    .unwrap()
}

/// A hidden layer `l` of `kernel` under `cfg`, drawn from `seed`, and that stream
/// after it (to draw inputs from).
fn hidden_layer(kernel: LinearMap, cfg: &NormConfig, seed: u64) -> (Layer, InitRng) {
    let mut rng = InitRng::new(seed);
    let mut store = ParamStore::new(DEV);
    let layer = Layer::hidden(&mut store, "l", kernel, &[kernel.units()], cfg, &mut rng).unwrap();
    (layer, rng)
}

/// Weight norm without its data-dependent initialization.
fn plain_weight_norm() -> NormConfig {
    NormConfig {
        data_dependent_init: false,
        ..NormConfig::from(NormKind::WeightNorm)
    }
}

fn minatar_net(norm: &NormConfig, seed: u64) -> QNetwork {
    QNetwork::new(
        &QNetworkConfig::minatar_cnn(),
        norm,
        &[4, 10, 10],
        6,
        seed,
        &DEV,
    )
    .unwrap()
}

fn check_weight_norm_gradients(kernel: LinearMap, x_shape: Vec<usize>) {
    let WeightNormCase {
        store,
        wn,
        x,
        v: v_t,
        g: g_t,
    } = weight_norm_case(kernel, x_shape, 3, 0.3);

    let mut loss_rng = InitRng::new(11);
    let y = kernel.apply(&x, &wn.weight().unwrap()).unwrap();
    let grads = loss_of(&y, &mut loss_rng).backward().unwrap();
    let dv = grads.get(&v_t).unwrap().clone();
    let dg = grads.get(&g_t).unwrap().clone();

    // dL/dw from a plain layer with w as the variable, same upstream gradient.
    let w = Var::from_tensor(&wn.weight().unwrap().detach()).unwrap();
    let mut loss_rng = InitRng::new(11);
    let y = kernel.apply(&x, w.as_tensor()).unwrap();
    let dw = loss_of(&y, &mut loss_rng)
        .backward()
        .unwrap()
        .get(w.as_tensor())
        .unwrap()
        .clone();

    let units = kernel.units();
    let v2 = v_t.reshape((units, ())).unwrap();
    let dw2 = dw.reshape((units, ())).unwrap();
    let norm = v2.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
    let dir = v2.broadcast_div(&norm).unwrap();
    let dg_closed = (&dw2 * &dir).unwrap().sum(1).unwrap();
    let dv_closed = dw2
        .broadcast_sub(&dir.broadcast_mul(&dg_closed.unsqueeze(1).unwrap()).unwrap())
        .unwrap()
        .broadcast_mul(
            &g_t.reshape((units, 1))
                .unwrap()
                .broadcast_div(&norm)
                .unwrap(),
        )
        .unwrap();
    let e_g = rel_err(&dg, &dg_closed);
    let e_v = rel_err(&dv.reshape((units, ())).unwrap(), &dv_closed);
    assert!(e_g < 1e-5, "dL/dg relative error {e_g}");
    assert!(e_v < 1e-5, "dL/dv relative error {e_v}");

    // dL/dv is orthogonal to v, unit by unit.
    let dv2 = dv.reshape((units, ())).unwrap();
    let cos = (&dv2 * &v2).unwrap().sum(1).unwrap().abs().unwrap()
        / (dv2.sqr().unwrap().sum(1).unwrap().sqrt().unwrap() * norm.squeeze(1).unwrap()).unwrap();
    let max_cos = cos.unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
    assert!(max_cos < 1e-5, "cosine between dL/dv and v: {max_cos}");

    // ||w_i|| == |g_i|.
    let w_norms = wn
        .weight()
        .unwrap()
        .reshape((units, ()))
        .unwrap()
        .sqr()
        .unwrap()
        .sum(1)
        .unwrap()
        .sqrt()
        .unwrap();
    assert!(rel_err(&w_norms, &g_t.abs().unwrap()) < 1e-6);

    // Scaling v by a > 0 leaves w and the output unchanged.
    let before = kernel.apply(&x, &wn.weight().unwrap()).unwrap();
    store
        .get("l.v")
        .unwrap()
        .var
        .set(&(v_t * 3.7).unwrap())
        .unwrap();
    let after = kernel.apply(&x, &wn.weight().unwrap()).unwrap();
    assert!(rel_err(&after, &before) < 1e-6);
}

#[test]
fn weight_norm_gradients_match_closed_forms_linear() {
    let (k, x) = linear();
    check_weight_norm_gradients(k, x);
}

#[test]
fn weight_norm_gradients_match_closed_forms_conv() {
    let (k, x) = conv();
    check_weight_norm_gradients(k, x);
}

fn check_data_dependent_init(kind: NormKind, kernel: LinearMap, x_shape: Vec<usize>) {
    let (layer, mut rng) = hidden_layer(kernel, &config(kind), 5);
    let x = (rng.normal(x_shape, 2.0, &DEV).unwrap() + 0.7).unwrap();
    layer.data_dependent_init(&x).unwrap();
    for pass in [Pass::TRAIN, Pass::EVAL] {
        let t = layer.pre_activation(&x, pass).unwrap();
        let (mean, var) = unit_moments(&t).unwrap();
        let mean: Vec<f32> = mean.flatten_all().unwrap().to_vec1().unwrap();
        let std: Vec<f32> = var
            .sqrt()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (m, s) in mean.iter().zip(&std) {
            assert!(m.abs() < 1e-4, "{kind} {pass:?}: mean {m}");
            assert!((s - 1.0).abs() < 1e-4, "{kind} {pass:?}: std {s}");
        }
    }
}

#[test]
fn data_dependent_init_standardizes_pre_activations() {
    for kind in [NormKind::WeightNorm, NormKind::WnMeanOnlyBn] {
        let (k, x) = linear();
        check_data_dependent_init(kind, k, x);
        let (k, x) = conv();
        check_data_dependent_init(kind, k, x);
    }
}

#[test]
fn data_dependent_init_runs_layer_by_layer_through_a_network() {
    let norm = config(NormKind::WeightNorm);
    let net = minatar_net(&norm, 2);
    let x = InitRng::new(9)
        .normal((32, 4, 10, 10), 1.0, &DEV)
        .unwrap()
        .ge(0.5)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    net.data_dependent_init(&x).unwrap();
    let mut h = x.clone();
    for (i, layer) in net.layers().enumerate() {
        if i == 1 {
            h = h.flatten_from(1).unwrap();
        }
        let t = layer.pre_activation(&h, Pass::TRAIN).unwrap();
        let (mean, var) = unit_moments(&t).unwrap();
        let worst_mean = mean.max_abs();
        let worst_std = (var.sqrt().unwrap() - 1.0).unwrap().max_abs();
        assert!(
            worst_mean < 1e-4 && worst_std < 1e-4,
            "{}: {worst_mean} {worst_std}",
            layer.name()
        );
        h = layer.forward(&h, Pass::TRAIN).unwrap();
    }
}

#[test]
fn mean_only_bn_batch_mean_is_bias_and_eval_uses_running_mean() {
    for (kernel, x_shape) in [linear(), conv()] {
        let cfg = NormConfig {
            data_dependent_init: false,
            bn_momentum: 0.25,
            ..NormConfig::from(NormKind::WnMeanOnlyBn)
        };
        let (layer, mut rng) = hidden_layer(kernel, &cfg, 1);
        let x = (rng.normal(x_shape.clone(), 1.0, &DEV).unwrap() + 1.5).unwrap();
        let t = layer.pre_activation(&x, Pass::TRAIN).unwrap();
        let (mean, _) = unit_moments(&t).unwrap();
        let bias = layer.bias().unwrap();
        assert!(
            rel_err(&mean.flatten_all().unwrap(), bias) < 1e-5,
            "batch mean equals b"
        );
        // Running mean after one batch with momentum 0.25: 0.25 * batch mean of W x.
        let raw = layer
            .kernel()
            .apply(&x, &layer.weight(false).unwrap())
            .unwrap();
        let (raw_mean, _) = unit_moments(&raw).unwrap();
        let expected = (raw_mean.flatten_all().unwrap() * 0.25).unwrap();
        let running = layer.mean_only_bn().unwrap().running_mean();
        assert!(rel_err(running, &expected) < 1e-5);
        // Eval subtracts the running mean, not this batch's.
        let eval = layer.pre_activation(&x, Pass::EVAL).unwrap();
        let manual = raw
            .broadcast_sub(&running.reshape(kernel.unit_shape()).unwrap())
            .unwrap()
            .broadcast_add(&bias.reshape(kernel.unit_shape()).unwrap())
            .unwrap();
        assert!(rel_err(&eval, &manual) < 1e-6);
    }
}

#[test]
fn batch_norm_train_and_eval_semantics() {
    for (kernel, x_shape) in [linear(), conv()] {
        let cfg = NormConfig {
            bn_momentum: 1.0,
            ..NormConfig::from(NormKind::BatchNorm)
        };
        let (layer, mut rng) = hidden_layer(kernel, &cfg, 4);
        let x = (rng.normal(x_shape.clone(), 3.0, &DEV).unwrap() - 2.0).unwrap();
        let train = layer.pre_activation(&x, Pass::TRAIN).unwrap();
        let (mean, var) = unit_moments(&train).unwrap();
        assert!(mean.max_abs() < 1e-5);
        assert!((var - 1.0).unwrap().max_abs() < 1e-3);
        // With momentum 1 the running stats are this batch's (variance unbiased), so
        // eval differs from train by exactly the n/(n-1) factor.
        let eval = layer.pre_activation(&x, Pass::EVAL).unwrap();
        let n = match kernel {
            LinearMap::Linear { .. } => x_shape[0] as f64,
            LinearMap::Conv2d { .. } => (x_shape[0] * 4 * 4) as f64,
        };
        let ratio = (&eval / &train)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let expected = ((n - 1.0) / n).sqrt();
        let close = ratio
            .iter()
            .filter(|r| (f64::from(**r) - expected).abs() < 1e-3)
            .count();
        assert!(
            close as f64 > 0.99 * ratio.len() as f64,
            "eval/train ratio should be {expected}"
        );
    }
}

#[test]
fn batch_norm_with_batch_size_one_is_defined_and_finite() {
    let (kernel, _) = linear();
    let (layer, mut rng) = hidden_layer(kernel, &config(NormKind::BatchNorm), 4);
    let x = Var::from_tensor(&rng.normal((1, 7), 1.0, &DEV).unwrap()).unwrap();
    let y = layer.pre_activation(x.as_tensor(), Pass::TRAIN).unwrap();
    let values: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
    assert!(values.iter().all(|v| v.is_finite()));
    assert!(
        values.iter().all(|v| *v == 0.0),
        "outputs beta (0 at init): {values:?}"
    );
    let bn = layer.batch_norm().unwrap();
    assert_eq!(
        bn.running_var().to_vec1::<f32>().unwrap(),
        vec![1.0; 5],
        "variance not updated"
    );
    let grads = y.sum_all().unwrap().backward().unwrap();
    let gx = grads
        .get(x.as_tensor())
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(gx.is_finite() && gx < 1e-6, "no gradient below: {gx}");
}

#[test]
fn layer_norm_normalizes_per_sample_and_passes_gradients_down() {
    let norm = config(NormKind::LayerNorm);
    let net = mlp_net(vec![16, 16], &norm, (4, 2), 0);
    let x = InitRng::new(2).normal((8, 4), 1.0, &DEV).unwrap();
    let first = net.layers().next().unwrap();
    let t = first.pre_activation(&x, Pass::TRAIN).unwrap();
    let mean = t
        .mean(D::Minus1)
        .unwrap()
        .abs()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let var = t
        .var(D::Minus1)
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(mean < 1e-5);
    assert!(
        (var - 16.0 / 15.0).abs() < 1e-3,
        "unbiased var of a standardized row: {var}"
    );
    let q = net.forward(&x, Pass::TRAIN).unwrap();
    let grads = q.sum_all().unwrap().backward().unwrap();
    let w0 = net.store().get("fc0.weight").unwrap().var.as_tensor();
    let g0 = grads.get(w0).expect("gradient reaches the first layer");
    assert!(
        g0.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            > 1e-6
    );
}

fn all_singular_values(net: &QNetwork) -> Vec<f64> {
    net.layers()
        .filter(|l| l.name() != "head")
        .flat_map(|l| svb::singular_values(&l.weight(false).unwrap()).unwrap())
        .collect()
}

/// Random Adam steps on a made-up loss, to move the weights off their init.
fn perturb(net: &QNetwork, x: &Tensor, steps: u64) {
    let cfg = OptimizerConfig {
        lr: 0.05,
        ..Default::default()
    };
    let mut opt = Optimizer::new(net.store(), &cfg, 1.0);
    for _ in 0..steps {
        let q = net.forward(x, Pass::TRAIN).unwrap();
        let loss = q.sqr().unwrap().sum_all().unwrap().neg().unwrap();
        opt.step(&loss.backward().unwrap()).unwrap();
    }
}

#[test]
fn svb_projects_singular_values_into_bounds() {
    let cfg = NormConfig {
        svb_eps: 0.1,
        svb_interval: 5,
        ..NormConfig::from(NormKind::Svb)
    };
    let net = minatar_net(&cfg, 0);
    for s in all_singular_values(&net) {
        assert!((s - 1.0).abs() < 1e-4, "orthogonal init: {s}");
    }
    let x = InitRng::new(1).normal((8, 4, 10, 10), 1.0, &DEV).unwrap();
    perturb(&net, &x, 4);
    let spread = all_singular_values(&net);
    assert!(
        spread.iter().any(|s| !(1.0 / 1.1..=1.1).contains(s)),
        "training moved them out"
    );
    assert!(!net.after_optimizer_step(4).unwrap(), "not on step 4");
    assert!(net.after_optimizer_step(5).unwrap());
    for s in all_singular_values(&net) {
        assert!((1.0 / 1.1 - 1e-4..=1.1 + 1e-4).contains(&s), "{s}");
    }
}

#[test]
fn bbn_bounds_gain_magnitudes_and_keeps_their_signs() {
    let cfg = NormConfig {
        bbn_eps: 0.2,
        svb_interval: 1,
        ..NormConfig::from(NormKind::Bbn)
    };
    let net = mlp_net(vec![32, 32], &cfg, (6, 3), 0);
    let x = InitRng::new(8).normal((64, 6), 2.0, &DEV).unwrap();
    perturb(&net, &x, 30);
    // Learned gains can be negative (in front of a ReLU) or 0: make some so.
    for name in ["fc0.bn.gamma", "fc1.bn.gamma"] {
        let var = &net.store().get(name).unwrap().var;
        let mut gamma: Vec<f32> = var.as_tensor().to_vec1().unwrap();
        for (i, g) in gamma.iter_mut().enumerate() {
            match i % 5 {
                0 => *g = -3.0 * g.abs(),
                1 => *g = -0.01,
                4 if i < 10 => *g = 0.0,
                _ => {}
            }
        }
        let n = gamma.len();
        var.set(&Tensor::from_vec(gamma, n, &DEV).unwrap()).unwrap();
    }
    // Per BN layer: gamma, sigma (unchanged by the projection) and alpha, the mean
    // gain magnitude |gamma| / sigma.
    let gains = |net: &QNetwork| -> Vec<(Vec<f32>, Vec<f32>, f64)> {
        net.layers()
            .filter_map(|l| l.batch_norm())
            .map(|bn| {
                let gamma: Vec<f32> = bn.gamma_values().unwrap();
                let sigma: Vec<f32> = (bn.running_var() + bn.eps())
                    .unwrap()
                    .sqrt()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let alpha = gamma
                    .iter()
                    .zip(&sigma)
                    .map(|(g, s)| f64::from(g.abs()) / f64::from(*s))
                    .sum::<f64>()
                    / gamma.len() as f64;
                (gamma, sigma, alpha)
            })
            .collect()
    };
    let ratio = |g: f32, s: f32, alpha: f64| f64::from(g.abs()) / (f64::from(s) * alpha);
    let before = gains(&net);
    let out_of_bounds = before.iter().any(|(gamma, sigma, alpha)| {
        gamma
            .iter()
            .zip(sigma)
            .any(|(g, s)| !(1.0 / 1.2..=1.2).contains(&ratio(*g, *s, *alpha)))
    });
    assert!(out_of_bounds, "{before:?}");
    net.after_optimizer_step(1).unwrap();
    for ((gamma_before, sigma, alpha), (gamma_after, _, _)) in before.iter().zip(&gains(&net)) {
        for ((b, a), s) in gamma_before.iter().zip(gamma_after).zip(sigma) {
            // No sign changes, 0 stays 0, and every other magnitude is bounded
            // relative to the mean magnitude at the projection.
            assert_eq!(
                b.signum() * f32::from(*b != 0.0),
                a.signum() * f32::from(*a != 0.0)
            );
            let r = ratio(*a, *s, *alpha);
            assert!(
                *a == 0.0 || (1.0 / 1.2 - 1e-4..=1.2 + 1e-4).contains(&r),
                "{r}"
            );
        }
        assert!(gamma_after.iter().any(|g| *g < 0.0));
    }
    for s in all_singular_values(&net) {
        assert!((1.0 / 1.05 - 1e-4..=1.05 + 1e-4).contains(&s), "{s}");
    }
}

#[test]
fn cached_weight_follows_optimizer_steps() {
    let norm = plain_weight_norm();
    let net = mlp_net(vec![8], &norm, (3, 2), 0);
    let x = InitRng::new(3).normal((4, 3), 1.0, &DEV).unwrap();
    let eval = net.forward(&x, Pass::EVAL).unwrap();
    let train = net.forward(&x, Pass::TRAIN).unwrap();
    assert!(rel_err(&eval, &train) < 1e-6);
    perturb(&net, &x, 1);
    let eval = net.forward(&x, Pass::EVAL).unwrap();
    let train = net.forward(&x, Pass::TRAIN).unwrap();
    assert!(
        rel_err(&eval, &train) < 1e-6,
        "the cache was refreshed after the step"
    );
}

#[test]
fn gain_group_gets_scaled_learning_rate() {
    // With Adam the first step moves every variable by about lr (sign of the
    // gradient), so g moves g_lr_scale times further than v.
    let norm = plain_weight_norm();
    let net = mlp_net(vec![4], &norm, (3, 2), 0);
    let before = net.store().to_map().unwrap();
    let cfg = OptimizerConfig {
        lr: 1e-3,
        max_grad_norm: 0.0,
        ..Default::default()
    };
    let mut opt = Optimizer::new(net.store(), &cfg, 10.0);
    let x = InitRng::new(3).normal((4, 3), 1.0, &DEV).unwrap();
    let loss = net.forward(&x, Pass::TRAIN).unwrap().sum_all().unwrap();
    opt.step(&loss.backward().unwrap()).unwrap();
    let moved = |name: &str| -> f32 {
        let now = net.store().get(name).unwrap().var.as_tensor();
        (now - &before[name]).unwrap().max_abs()
    };
    assert!((moved("fc0.g") - 1e-2).abs() < 1e-4, "{}", moved("fc0.g"));
    assert!((moved("fc0.v") - 1e-3).abs() < 1e-5, "{}", moved("fc0.v"));
}

#[test]
fn gradient_clipping_scales_to_max_norm() {
    let mut store = ParamStore::new(DEV);
    let x = store
        .add(
            "x",
            Tensor::new(&[3.0f32, 4.0], &DEV).unwrap(),
            normrl_agents::nn::Role::Weight,
        )
        .unwrap();
    let cfg = OptimizerConfig {
        kind: OptimizerKind::Rmsprop,
        centered: false,
        rms_alpha: 0.0,
        rms_eps: 1e-12,
        lr: 1.0,
        max_grad_norm: 1.0,
        ..Default::default()
    };
    let mut opt = Optimizer::new(&store, &cfg, 1.0);
    // L = 10 * (x . [3, 4]) / 5 -> grad (6, 8), norm 10, clipped to (0.6, 0.8).
    let loss = ((x.as_tensor() * Tensor::new(&[6.0f32, 8.0], &DEV).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        / 1.0)
        .unwrap();
    let norm = step_on(&mut opt, &loss);
    assert!((norm - 10.0).abs() < 1e-5);
    // RMSprop with alpha 0: p -= g / |g| = sign: exactly 1 each, independent of clip.
    let now: Vec<f32> = x.as_tensor().to_vec1().unwrap();
    assert!(
        (now[0] - 2.0).abs() < 1e-5 && (now[1] - 3.0).abs() < 1e-5,
        "{now:?}"
    );
}

#[test]
fn architectures_have_documented_shapes() {
    for kind in NormKind::ALL {
        let norm = config(kind);
        let mlp = mlp_net(vec![64, 64], &norm, (4, 2), 0);
        let x = Tensor::ones((3, 4), DType::F32, &DEV).unwrap();
        assert_eq!(mlp.forward(&x, Pass::TRAIN).unwrap().dims(), &[3, 2]);
        let cnn = QNetwork::new(
            &QNetworkConfig::minatar_cnn(),
            &norm,
            &[10, 10, 10],
            6,
            0,
            &DEV,
        )
        .unwrap();
        let fc0 = cnn.layers().nth(1).unwrap().kernel();
        assert_eq!(
            fc0,
            LinearMap::Linear {
                n_in: 1024,
                n_out: 128
            }
        );
        let nature = QNetworkConfig {
            architecture: normrl_agents::nn::Architecture::NatureCnn,
        };
        let net = QNetwork::new(&nature, &norm, &[4, 84, 84], 4, 0, &DEV).unwrap();
        let x = Tensor::zeros((2, 4, 84, 84), DType::F32, &DEV).unwrap();
        assert_eq!(net.forward(&x, Pass::EVAL).unwrap().dims(), &[2, 4]);
        assert_eq!(
            net.layers().nth(3).unwrap().kernel(),
            LinearMap::Linear {
                n_in: 3136,
                n_out: 512
            }
        );
    }
    let err = QNetwork::new(
        &QNetworkConfig::minatar_cnn(),
        &config(NormKind::None),
        &[4],
        2,
        0,
        &DEV,
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("[channels, height, width]"));
}

#[test]
fn target_copy_includes_running_statistics() {
    let norm = config(NormKind::BatchNorm);
    let online = mlp_net(vec![8], &norm, (3, 2), 0);
    let target = mlp_net(vec![8], &norm, (3, 2), 1);
    let x = (InitRng::new(3).normal((16, 3), 1.0, &DEV).unwrap() + 4.0).unwrap();
    online.forward(&x, Pass::TRAIN).unwrap();
    target.copy_from(&online).unwrap();
    let a = online.forward(&x, Pass::EVAL).unwrap();
    let b = target.forward(&x, Pass::EVAL).unwrap();
    assert!(rel_err(&a, &b) < 1e-7);
    let rm = |n: &QNetwork| {
        n.store()
            .get("fc0.bn.running_mean")
            .unwrap()
            .var
            .as_tensor()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_eq!(rm(&online), rm(&target));
    assert!(rm(&target).iter().any(|v| v.abs() > 0.01));
}
