//! Batch renormalization: its fused op and graph path against the formula written out
//! by hand (`r` and `d` detached), batch norm where the clip is closed (bounds 1 and
//! 0, and the warm-up), and batch norm's running statistics.

mod common;
use common::*;

use candle_core::{Tensor, Var};
use normrl_agents::nn::{BatchNorm, BnStats, ParamStore, RenormConfig};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const EPS: f64 = 1e-5;
const MOMENTUM: f64 = 0.1;

fn random(shape: &[usize], rng: &mut Xoshiro256PlusPlus, scale: f32, offset: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale + offset)
        .collect();
    Tensor::from_vec(v, shape, &DEV).unwrap()
}

/// A layer's parameters and running statistics, set in each store the same way.
struct Setting {
    gamma: Tensor,
    beta: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
}

impl Setting {
    /// Running statistics far from a batch's (mean 0.5, variance 1/3 of uniform
    /// inputs), so that some `r` and `d` clip at the bounds and some do not.
    fn new(units: usize, rng: &mut Xoshiro256PlusPlus) -> Self {
        Self {
            gamma: random(&[units], rng, 1.0, 0.5),
            beta: random(&[units], rng, 0.5, 0.0),
            running_mean: random(&[units], rng, 3.0, 0.0),
            running_var: random(&[units], rng, 0.3, 0.35).sqr().unwrap(),
        }
    }

    fn layer(&self, units: usize, renorm: Option<RenormConfig>) -> (ParamStore, BatchNorm) {
        let mut store = ParamStore::new(DEV);
        let bn = match renorm {
            Some(c) => BatchNorm::renormalized(&mut store, "l", units, (MOMENTUM, EPS), c),
            None => BatchNorm::new(&mut store, "l", units, MOMENTUM, EPS),
        }
        .unwrap();
        for (name, value) in [
            ("gamma", &self.gamma),
            ("beta", &self.beta),
            ("running_mean", &self.running_mean),
            ("running_var", &self.running_var),
        ] {
            let p = store.get(&format!("l.bn.{name}")).unwrap();
            p.var.set(value).unwrap();
        }
        (store, bn)
    }

    /// The formula, by hand, through candle's autodiff: per unit over the batch (and
    /// positions), `y = gamma ((x - mu_B) / s_B r + d) + beta`, `r` and `d` constants.
    /// `gamma` and `beta` are read from `store`, so that their gradients can be.
    fn by_hand(&self, x: &Tensor, bounds: RenormConfig, store: &ParamStore) -> Tensor {
        let mut view = vec![1; x.rank()];
        view[1] = x.dim(1).unwrap();
        let per_unit = |t: &Tensor| t.reshape(view.clone()).unwrap();
        let dims: Vec<usize> = (0..x.rank()).filter(|&d| d != 1).collect();
        let mu_b = x.mean_keepdim(dims.clone()).unwrap();
        let centered = x.broadcast_sub(&mu_b).unwrap();
        let var_b = centered.sqr().unwrap().mean_keepdim(dims).unwrap();
        let s_b = (var_b + EPS).unwrap().sqrt().unwrap();
        let s = per_unit(&(&self.running_var + EPS).unwrap().sqrt().unwrap());
        let r = (s_b.detach() / &s)
            .unwrap()
            .clamp(1.0 / bounds.r_max, bounds.r_max)
            .unwrap();
        let d = ((mu_b.detach() - per_unit(&self.running_mean)).unwrap() / &s)
            .unwrap()
            .clamp(-bounds.d_max, bounds.d_max)
            .unwrap();
        let x_hat = centered.broadcast_div(&s_b).unwrap();
        let y = x_hat.broadcast_mul(&r).unwrap().broadcast_add(&d).unwrap();
        let param = |name: &str| per_unit(store.get(name).unwrap().var.as_tensor());
        y.broadcast_mul(&param("l.bn.gamma"))
            .unwrap()
            .broadcast_add(&param("l.bn.beta"))
            .unwrap()
    }
}

/// `[output, dx, dgamma, dbeta]` of `sum(forward(x) * upstream)`.
fn with_gradients(
    store: &ParamStore,
    x: &Tensor,
    upstream: &Tensor,
    forward: impl Fn(&Tensor) -> Tensor,
) -> [Tensor; 4] {
    let x = Var::from_tensor(x).unwrap();
    let y = forward(x.as_tensor());
    let grads = (&y * upstream).unwrap().sum_all().unwrap().backward();
    let grads = grads.unwrap();
    let grad = |t: &Tensor| grads.get(t).expect("a gradient").clone();
    let param = |name: &str| store.get(name).unwrap().var.as_tensor().clone();
    [
        y,
        grad(x.as_tensor()),
        grad(&param("l.bn.gamma")),
        grad(&param("l.bn.beta")),
    ]
}

const NAMES: [&str; 4] = ["output", "dx", "dgamma", "dbeta"];

fn assert_close(a: &[Tensor], b: &[Tensor], tolerance: f32, context: &str) {
    for ((name, a), b) in NAMES.iter().zip(a).zip(b) {
        let e = max_rel_err(a, b);
        assert!(e <= tolerance, "{context} {name}: relative error {e}");
    }
}

const OPEN: RenormConfig = RenormConfig {
    r_max: 3.0,
    d_max: 5.0,
    warmup: 0,
};

#[test]
fn fused_and_graph_batch_renorm_equal_the_formula_by_hand() {
    on_every_path(|| {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        for shape in [vec![32usize, 21], vec![8, 6, 5, 5], vec![4, 16]] {
            let units = shape[1];
            let setting = Setting::new(units, &mut rng);
            let x = random(&shape, &mut rng, 1.0, 0.5);
            let upstream = random(&shape, &mut rng, 1.0, 0.0);
            let (store, _) = setting.layer(units, None);
            let expected =
                with_gradients(&store, &x, &upstream, |x| setting.by_hand(x, OPEN, &store));
            for relu in [false, true] {
                let (store, brn) = setting.layer(units, Some(OPEN));
                let fused = with_gradients(&store, &x, &upstream, |x| match relu {
                    false => brn.forward(x, BnStats::Batch).unwrap(),
                    true => brn.forward_relu(x, BnStats::Batch).unwrap(),
                });
                let (store, brn) = setting.layer(units, Some(OPEN));
                let graph = with_gradients(&store, &x, &upstream, |x| {
                    let y = brn.forward_reference(x, BnStats::Batch).unwrap();
                    if relu {
                        y.relu().unwrap()
                    } else {
                        y
                    }
                });
                let expected = if relu {
                    let (store, _) = setting.layer(units, None);
                    with_gradients(&store, &x, &upstream, |x| {
                        setting.by_hand(x, OPEN, &store).relu().unwrap()
                    })
                } else {
                    expected.clone()
                };
                let context = format!("{shape:?} relu {relu}");
                assert_close(&fused, &expected, 1e-5, &format!("fused {context}"));
                assert_close(&graph, &expected, 1e-5, &format!("graph {context}"));
            }
            // The setting makes the correction matter: it is not batch norm here.
            let (store, bn) = setting.layer(units, None);
            let plain = with_gradients(&store, &x, &upstream, |x| {
                bn.forward(x, BnStats::Batch).unwrap()
            });
            assert!(max_rel_err(&plain[0], &expected[0]) > 0.1, "{shape:?}");
        }
    });
}

/// Runs three training forwards of each layer on the same batches; their outputs,
/// gradients and running statistics, forward by forward.
fn three_forwards(
    setting: &Setting,
    units: usize,
    renorm: Option<RenormConfig>,
    batches: &[(Tensor, Tensor)],
) -> Vec<Vec<Tensor>> {
    let (store, layer) = setting.layer(units, renorm);
    batches
        .iter()
        .map(|(x, upstream)| {
            let mut out = with_gradients(&store, x, upstream, |x| {
                layer.forward(x, BnStats::Batch).unwrap()
            })
            .to_vec();
            out.push(layer.running_mean().copy().unwrap());
            out.push(layer.running_var().copy().unwrap());
            out
        })
        .collect()
}

#[test]
fn a_closed_clip_and_the_warm_up_are_batch_norm_with_its_running_statistics() {
    on_every_path(|| {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        for shape in [vec![16usize, 9], vec![4, 3, 4, 4]] {
            let units = shape[1];
            let setting = Setting::new(units, &mut rng);
            let batches: Vec<(Tensor, Tensor)> = (0..3)
                .map(|_| {
                    let x = random(&shape, &mut rng, 1.0, 0.5);
                    (x, random(&shape, &mut rng, 1.0, 0.0))
                })
                .collect();
            let bn = three_forwards(&setting, units, None, &batches);
            let closed = RenormConfig {
                r_max: 1.0,
                d_max: 0.0,
                warmup: 0,
            };
            let warm_up = RenormConfig { warmup: 2, ..OPEN };
            let all = BATCH_NORM_OUTPUTS;
            for (step, (a, b)) in three_forwards(&setting, units, Some(closed), &batches)
                .iter()
                .zip(&bn)
                .enumerate()
            {
                for ((name, a), b) in all.iter().zip(a).zip(b) {
                    let e = max_rel_err(a, b);
                    assert!(
                        e <= 1e-6,
                        "{shape:?} closed clip, forward {step} {name}: {e}"
                    );
                }
            }
            let warm = three_forwards(&setting, units, Some(warm_up), &batches);
            for step in 0..2 {
                for ((name, a), b) in all.iter().zip(&warm[step]).zip(&bn[step]) {
                    let e = max_rel_err(a, b);
                    assert!(e <= 1e-6, "{shape:?} warm-up, forward {step} {name}: {e}");
                }
            }
            // The third forward opens the clip: its output differs, its running
            // statistics (batch norm's update) do not.
            assert!(
                max_rel_err(&warm[2][0], &bn[2][0]) > 0.01,
                "{shape:?} opened"
            );
            for i in [4, 5] {
                assert!(
                    max_rel_err(&warm[2][i], &bn[2][i]) <= 1e-6,
                    "{shape:?} {}",
                    all[i]
                );
            }
        }
    });
}

#[test]
fn the_warm_up_count_is_a_saved_buffer_that_stops_at_the_warm_up() {
    on_every_path(|| {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        let setting = Setting::new(4, &mut rng);
        let config = RenormConfig { warmup: 3, ..OPEN };
        let (store, brn) = setting.layer(4, Some(config));
        let x = random(&[8, 4], &mut rng, 1.0, 0.5);
        let count = |store: &ParamStore| -> f32 {
            let p = store
                .get("l.brn.updates")
                .expect("the count is in the store");
            p.var.as_tensor().to_vec1::<f32>().unwrap()[0]
        };
        for expected in [1.0, 2.0, 3.0, 3.0, 3.0] {
            brn.forward(&x, BnStats::Batch).unwrap();
            assert_eq!(count(&store), expected);
        }
        // Evaluation forwards do not count.
        let (store, brn) = setting.layer(4, Some(config));
        brn.forward(&x, BnStats::Running).unwrap();
        assert_eq!(count(&store), 0.0);
        // A store loaded with a count past the warm-up opens the clip at once.
        let (opened, _) = setting.layer(4, Some(config));
        opened
            .get("l.brn.updates")
            .unwrap()
            .var
            .set(&Tensor::new(&[3f32], &DEV).unwrap())
            .unwrap();
        let (fresh_store, fresh) = setting.layer(4, Some(config));
        fresh_store.load_map(&opened.to_map().unwrap()).unwrap();
        let (_, open_now) = setting.layer(4, Some(OPEN));
        let a = fresh.forward(&x, BnStats::Batch).unwrap();
        let b = open_now.forward(&x, BnStats::Batch).unwrap();
        assert!(max_rel_err(&a, &b) <= 1e-6);
    });
}
