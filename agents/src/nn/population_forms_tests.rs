//! The population's fused CPU ops (`Normalization::fused_forward`, the bias per agent)
//! against the tensor forms they replace: outputs, gradients, running statistics.
//! Apart from `normalization.rs`, so that the contract does not import the methods
//! that implement it.

use candle_core::Var;

use crate::nn::normalization::Normalization;
use crate::nn::{BnStats, GroupNorm, RmsNorm};
use crate::test_support::Normals;
use crate::test_support::{assert_same_gradients, explicit_gradients, gradients};
use crate::test_support::{max_relative, random};

/// A method's fused per-agent op against its tensor-op form with a ReLU after it:
/// the same outputs and the same gradients of `h` and of every variable.
fn fused_equals_reference(norm: &dyn Normalization, h: &Var, what: &str) {
    fused_equals_reference_with(norm, norm, h, BnStats::Batch, what);
}

/// [`fused_equals_reference`] with the fused op of `fused` and the tensor form of
/// `reference`, two copies of one state (a method with running statistics changes
/// them in its forward).
fn fused_equals_reference_with(
    fused: &dyn Normalization,
    reference: &dyn Normalization,
    h: &Var,
    stats: BnStats,
    what: &str,
) {
    let mut rng = Normals::new(7);
    let weights = random(&mut rng, h.dims());
    let applied = fused.fused_forward(h.as_tensor(), stats, None).unwrap();
    let applied = applied.unwrap_or_else(|| panic!("{what}: no fused op on the CPU"));
    let y_ref = reference.normalize(h.as_tensor().clone(), stats).unwrap();
    let y_ref = y_ref.relu().unwrap();
    assert!(
        max_relative(&applied.out, &y_ref) < 1e-5,
        "{what}: outputs differ"
    );
    let gr = gradients(&y_ref, &weights);
    // Through candle's backward and through the op's explicit one.
    let graph = gradients(&applied.out, &weights);
    let explicit = explicit_gradients(&applied, h.as_tensor(), &weights);
    for gf in [graph, explicit] {
        let vars = fused.vars().0.into_iter().zip(reference.vars().0);
        for (a, b) in [(h, h)].into_iter().chain(vars) {
            let (a, b) = (
                gf.get(a.as_tensor()).unwrap(),
                gr.get(b.as_tensor()).unwrap(),
            );
            let err = max_relative(a, b);
            assert!(
                err < 1e-4,
                "{what}: gradient of {:?} differs by {err:e}",
                a.dims()
            );
        }
    }
}

#[test]
fn fused_population_batch_norm_equals_its_tensor_form() {
    use crate::nn::{BatchNorm, NormConfig, NormKind, Role};
    for kind in [NormKind::BatchNorm, NormKind::BatchRenorm] {
        for (h, unit) in [
            (vec![3, 5, 8], vec![3, 1, 8]),
            (vec![3, 5, 4, 6], vec![3, 1, 4, 1]),
        ] {
            let config = NormConfig {
                brn_warmup: 0,
                brn_r_max: 1.2,
                brn_d_max: 0.3,
                ..NormConfig::from(kind)
            };
            let mut rng = Normals::new(4);
            let make = |rng: &mut Normals| {
                let mut vars = std::collections::HashMap::new();
                let mut take = |name: &str, _: Role| -> candle_core::Result<Var> {
                    let dims: Vec<usize> = if name == "brn.updates" {
                        vec![3, 1, 1]
                    } else {
                        unit.clone()
                    };
                    let mut t = random(rng, &dims);
                    if name.ends_with("running_var") {
                        t = (t.abs()? + 0.5)?;
                    }
                    if name == "brn.updates" {
                        t = t.zeros_like()?;
                    }
                    let v = Var::from_tensor(&t)?;
                    vars.insert(name.to_string(), v.clone());
                    Ok(v)
                };
                let renorm = (kind == NormKind::BatchRenorm).then(|| config.renorm());
                let settings = (config.bn_momentum, config.bn_eps);
                (BatchNorm::stack(&mut take, settings, renorm).unwrap(), vars)
            };
            // Two copies of one state: the same draws.
            let (fused_bn, _) = make(&mut Normals::new(4));
            let (reference_bn, _) = make(&mut rng);
            let x = Var::from_tensor(&random(&mut Normals::new(8), &h)).unwrap();
            let what = format!("{kind:?} {h:?}");
            fused_equals_reference_with(&fused_bn, &reference_bn, &x, BnStats::Batch, &what);
            let (a, b) = (fused_bn.vars().1, reference_bn.vars().1);
            for (a, b) in a.iter().zip(&b) {
                assert!(
                    max_relative(a.as_tensor(), b.as_tensor()) < 1e-5,
                    "{what}: running statistics differ"
                );
            }
            fused_equals_reference_with(&fused_bn, &reference_bn, &x, BnStats::Running, &what);
        }
    }
}

/// Mean-only batch norm with the layer's bias and ReLU in one per-agent op equals
/// the tensor form and the bias added after it: outputs, gradients of the input and
/// the bias, the running mean; in training and evaluation mode.
#[test]
fn fused_population_mean_only_equals_its_tensor_form() {
    use crate::nn::{MeanOnlyBn, NormConfig, Role};
    for (h, unit) in [
        (vec![3, 5, 8], vec![3, 1, 8]),
        (vec![3, 5, 4, 6], vec![3, 1, 4, 1]),
    ] {
        let mut rng = Normals::new(6);
        let running = random(&mut rng, &unit);
        let make = || {
            let mut take = |_: &str, _: Role| Var::from_tensor(&running);
            MeanOnlyBn::stack(&mut take, NormConfig::default().bn_momentum).unwrap()
        };
        let (fused, reference) = (make(), make());
        let x = Var::from_tensor(&random(&mut rng, &h)).unwrap();
        let bias = Var::from_tensor(&random(&mut rng, &unit)).unwrap();
        let weights = random(&mut rng, &h);
        for stats in [BnStats::Batch, BnStats::Running] {
            let applied = fused
                .fused_forward(x.as_tensor(), stats, Some(&bias))
                .unwrap()
                .unwrap();
            let y = applied.out.clone();
            let y_ref = reference.normalize(x.as_tensor().clone(), stats).unwrap();
            let y_ref = y_ref
                .broadcast_add(bias.as_tensor())
                .unwrap()
                .relu()
                .unwrap();
            assert!(
                max_relative(&y, &y_ref) < 1e-5,
                "{h:?} {stats:?}: outputs differ"
            );
            let gr = gradients(&y_ref, &weights);
            let explicit = explicit_gradients(&applied, x.as_tensor(), &weights);
            let stores = [gradients(&y, &weights), explicit];
            let what = format!("{h:?} {stats:?}");
            assert_same_gradients(&stores, &gr, &[&x, &bias], (1e-4, &what));
            let (a, b) = (
                fused.vars().1[0].as_tensor(),
                reference.vars().1[0].as_tensor(),
            );
            assert!(max_relative(a, b) < 1e-6, "{h:?}: running means differ");
        }
    }
}

#[test]
fn fused_population_norms_equal_their_tensor_form() {
    let mut rng = Normals::new(3);
    let mut var = |dims: &[usize]| Var::from_tensor(&random(&mut rng, dims)).unwrap();
    // Three agents; MLP pre-activations [P, B, units] and feature maps [P, B, C, positions].
    for (h, gain, groups, what) in [
        (vec![3, 5, 8], vec![3, 1, 8], 1, "layer norm, MLP"),
        (vec![3, 5, 8], vec![3, 1, 8], 2, "group norm, MLP"),
        (vec![3, 5, 4, 6], vec![3, 1, 4, 6], 1, "layer norm, CNN"),
        (vec![3, 5, 4, 6], vec![3, 1, 4, 1], 2, "group norm, CNN"),
    ] {
        let norm = GroupNorm::of([var(&gain), var(&gain)], groups, 1e-5, 1);
        fused_equals_reference(&norm, &var(&h), what);
    }
    for (h, gain, what) in [
        (vec![3, 5, 8], vec![3, 1, 8], "RMSNorm, MLP"),
        (vec![3, 5, 4, 6], vec![3, 1, 4, 6], "RMSNorm, CNN"),
    ] {
        let norm = RmsNorm::of(var(&gain), 1e-5, 1);
        fused_equals_reference(&norm, &var(&h), what);
    }
}

/// A population's bias (and ReLU) per agent equals candle's broadcast add (and
/// ReLU): values and both gradients, for dense and convolutional layouts.
#[test]
fn a_population_bias_equals_the_tensor_form() {
    let mut rng = Normals::new(5);
    let mut random = |dims: &[usize]| crate::test_support::random(&mut rng, dims);
    let shapes = [
        (vec![3, 5, 8], vec![3, 1, 8]),
        (vec![3, 5, 4, 6], vec![3, 1, 4, 1]),
    ];
    for (h, b) in shapes {
        for relu in [false, true] {
            let (t, bias) = (
                Var::from_tensor(&random(&h)).unwrap(),
                Var::from_tensor(&random(&b)).unwrap(),
            );
            let weights = random(&h);
            let kernel = crate::kernels::bias_relu::AgentBias::of(t.shape(), relu).unwrap();
            let applied = crate::kernels::per_agent::PerAgent { kernel, agents: 3 }
                .apply1(t.as_tensor(), bias.as_tensor())
                .unwrap();
            let fused = applied.out.clone();
            let mut reference = t.as_tensor().broadcast_add(bias.as_tensor()).unwrap();
            if relu {
                reference = reference.relu().unwrap();
            }
            assert!(max_relative(&fused, &reference) < 1e-6, "{h:?} relu {relu}");
            let gr = gradients(&reference, &weights);
            let explicit = explicit_gradients(&applied, t.as_tensor(), &weights);
            for gf in [gradients(&fused, &weights), explicit] {
                for v in [&t, &bias] {
                    let (a, r) = (
                        gf.get(v.as_tensor()).unwrap(),
                        gr.get(v.as_tensor()).unwrap(),
                    );
                    assert!(
                        max_relative(a, r) < 1e-5,
                        "{h:?} relu {relu}: gradient of {:?}",
                        v.dims()
                    );
                }
            }
        }
    }
}

/// Weight norm's layer output per agent (the kernel's output scaled per unit, the bias,
/// the ReLU) equals its tensor form: values and the gradients of the output, the scale
/// and the bias, by candle's backward and by the op's explicit one.
#[test]
fn a_population_scaled_bias_equals_the_tensor_form() {
    use crate::kernels::bias_relu::AgentScaledBias;
    let mut rng = Normals::new(8);
    let mut random = |dims: &[usize]| crate::test_support::random(&mut rng, dims);
    for (h, unit) in [
        (vec![3, 5, 8], vec![3, 1, 8]),
        (vec![3, 5, 4, 6], vec![3, 1, 4, 1]),
    ] {
        for relu in [false, true] {
            let t = Var::from_tensor(&random(&h)).unwrap();
            let (s, b) = (random(&unit), random(&unit));
            let (s, b) = (Var::from_tensor(&s).unwrap(), Var::from_tensor(&b).unwrap());
            let weights = random(&h);
            let kernel = AgentScaledBias::of(t.shape(), relu).unwrap();
            let op = crate::kernels::per_agent::PerAgent { kernel, agents: 3 };
            let applied = op
                .apply2(t.as_tensor(), s.as_tensor(), b.as_tensor())
                .unwrap();
            let scaled = t.as_tensor().broadcast_mul(s.as_tensor()).unwrap();
            let mut reference = scaled.broadcast_add(b.as_tensor()).unwrap();
            if relu {
                reference = reference.relu().unwrap();
            }
            assert!(
                max_relative(&applied.out, &reference) < 1e-6,
                "{h:?} relu {relu}"
            );
            let gr = gradients(&reference, &weights);
            let explicit = explicit_gradients(&applied, t.as_tensor(), &weights);
            for gf in [gradients(&applied.out, &weights), explicit] {
                for v in [&t, &s, &b] {
                    let (a, r) = (
                        gf.get(v.as_tensor()).unwrap(),
                        gr.get(v.as_tensor()).unwrap(),
                    );
                    let err = max_relative(a, r);
                    assert!(
                        err < 1e-5,
                        "{h:?} relu {relu}: gradient of {:?}: {err:e}",
                        v.dims()
                    );
                }
            }
        }
    }
}

/// A normalization that writes only what is its own (its variables, a copy, its tensor
/// form) gets the rest from the trait: a single network's graph forward is its tensor
/// form, the layer's bias and ReLU; no host path; no fused op; nothing after a step.
#[test]
fn a_method_with_only_its_tensor_form_gets_the_rest_by_default() {
    use crate::nn::normalization::GraphLayer;
    use candle_core::{Device, Result, Tensor};
    struct Doubling;
    impl Normalization for Doubling {
        fn normalize(&self, h: Tensor, _stats: BnStats) -> Result<Tensor> {
            h * 2.0
        }
        fn copied(&self) -> Result<Box<dyn Normalization>> {
            Ok(Box::new(Doubling))
        }
        fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
            (vec![], vec![])
        }
    }
    let t = Tensor::new(&[[1.0f32, -2.0, 0.5], [-0.25, 3.0, -1.0]], &Device::Cpu).unwrap();
    let b = Tensor::new(&[0.5f32, 1.0, 0.0], &Device::Cpu).unwrap();
    let layer = GraphLayer {
        bias: Some(&b),
        relu: true,
        stats: BnStats::Batch,
    };
    let y: Vec<Vec<f32>> = Doubling
        .graph_forward(&t, &layer)
        .unwrap()
        .to_vec2()
        .unwrap();
    assert_eq!(y, [[2.5, 0.0, 1.0], [0.0, 7.0, 0.0]]);
    assert!(!Doubling.runs_on_host(false) && !Doubling.has_cuda_kernel());
    let h = Tensor::zeros((1, 2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(Doubling
        .fused_forward(&h, BnStats::Batch, None)
        .unwrap()
        .is_none());
    assert!(Doubling.affine().is_none() && Doubling.step_invariant());
}
