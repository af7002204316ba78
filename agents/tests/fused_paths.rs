//! Fused CPU paths against their tensor-op references: the same values and gradients
//! (to 1e-5 relative). (The older fused-path tests live in normalization.rs.)

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use normrl_agents::nn::{BatchNorm, LayerNorm, MeanOnlyBn, Mode, ParamStore};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const DEV: Device = Device::Cpu;

fn random(shape: &[usize], rng: &mut Xoshiro256PlusPlus, offset: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0 + offset)
        .collect();
    Tensor::from_vec(v, shape, &DEV).unwrap()
}

/// Max |a - b| over max |b| (0 when both are 0).
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let max = |t: &Tensor| -> f32 {
        t.abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    };
    let diff = max(&(a - b).unwrap());
    if diff == 0.0 {
        0.0
    } else {
        diff / max(b).max(1e-6)
    }
}

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

#[test]
fn fused_batch_norm_matches_the_reference() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    // Linear batch 32, conv batch 8, and the batch-1 Linear case (no gradient below in
    // training mode); evaluation mode uses running statistics, set away from 0 and 1.
    // Each also followed by a ReLU, which the fused op applies itself.
    let cases = [vec![32usize, 64], vec![8, 16, 10, 10], vec![1, 5]];
    let variants = [
        (Mode::Train, false),
        (Mode::Eval, false),
        (Mode::Train, true),
        (Mode::Eval, true),
    ];
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
        let names = [
            "output",
            "dx",
            "dgamma",
            "dbeta",
            "running mean",
            "running var",
        ];
        for ((name, a), b) in names.iter().zip(&fused).zip(&reference) {
            let e = rel_err(a, b);
            let tolerance = if shape[0] == 1 && *name == "dx" {
                1e-4
            } else {
                1e-5
            };
            assert!(
                e <= tolerance,
                "{shape:?} {mode:?} relu {relu} {name}: relative error {e}"
            );
        }
        if shape[0] == 1 && mode == Mode::Train {
            let dx: Vec<f32> = fused[1].flatten_all().unwrap().to_vec1().unwrap();
            assert!(
                dx.iter().all(|v| *v == 0.0),
                "batch 1 passes no gradient: {dx:?}"
            );
        }
    }
}

#[test]
fn fused_layer_norm_matches_the_reference() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let cases = [vec![32usize, 64], vec![8, 16, 8, 8], vec![1, 5]];
    for (shape, relu) in cases
        .iter()
        .flat_map(|s| [(s.clone(), false), (s.clone(), true)])
    {
        let features = &shape[1..];
        let gamma = random(features, &mut rng, 1.0);
        let beta = random(features, &mut rng, 0.0);
        let x = random(&shape, &mut rng, 0.5);
        let upstream = random(&shape, &mut rng, 0.0);
        let run = |fused: bool| {
            let mut store = ParamStore::new(DEV);
            let ln = LayerNorm::new(&mut store, "l", features, 1e-5).unwrap();
            store.get("l.ln.gamma").unwrap().var.set(&gamma).unwrap();
            store.get("l.ln.beta").unwrap().var.set(&beta).unwrap();
            let (y, dx, grads) = forward_backward(&x, &upstream, |x| match (fused, relu) {
                (true, false) => ln.forward(x).unwrap(),
                (true, true) => ln.forward_relu(x).unwrap(),
                (false, false) => ln.forward_reference(x).unwrap(),
                (false, true) => ln.forward_reference(x).unwrap().relu().unwrap(),
            });
            let grad = |name: &str| {
                let var = store.get(name).unwrap().var.clone();
                grads.get(var.as_tensor()).unwrap().clone()
            };
            [y, dx, grad("l.ln.gamma"), grad("l.ln.beta")]
        };
        let (fused, reference) = (run(true), run(false));
        for ((name, a), b) in ["output", "dx", "dgamma", "dbeta"]
            .iter()
            .zip(&fused)
            .zip(&reference)
        {
            let e = rel_err(a, b);
            assert!(
                e <= 1e-5,
                "{shape:?} relu {relu} {name}: relative error {e}"
            );
        }
    }
}

#[test]
fn fused_mean_only_batch_norm_matches_the_reference() {
    // Alone, and with the layer's bias and the ReLU in the same op.
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(6);
    let cases = [vec![32usize, 64], vec![8, 16, 10, 10], vec![1, 5]];
    let variants = [
        (Mode::Train, false),
        (Mode::Eval, false),
        (Mode::Train, true),
        (Mode::Eval, true),
    ];
    for (shape, (mode, bias_relu)) in cases.iter().flat_map(|s| variants.map(|v| (s.clone(), v))) {
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
            let (y, dx, grads) = forward_backward(&x, &upstream, |x| match (fused, bias_relu) {
                (true, false) => bn.forward(x, mode).unwrap(),
                (true, true) => bn.forward_bias_relu(x, b.as_tensor(), mode).unwrap(),
                (false, false) => bn.forward_reference(x, mode).unwrap(),
                (false, true) => {
                    let t = bn.forward_reference(x, mode).unwrap();
                    normrl_agents::nn::fused::add_unit_bias_reference(&t, b.as_tensor())
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
        for ((name, a), b) in ["output", "dx", "dbias", "running mean"]
            .iter()
            .zip(&fused)
            .zip(&reference)
        {
            let e = rel_err(a, b);
            assert!(
                e <= 1e-5,
                "{shape:?} {mode:?} bias+relu {bias_relu} {name}: relative error {e}"
            );
        }
    }
}
