//! A normalization's population form: its variables stacked along a leading population
//! axis, over a hidden layer's pre-activations `[P, B, units]` (`[P, B, channels,
//! positions]` over feature maps), each agent's statistics its own. Each method writes
//! its form in its own file (`Stacked*` beside its single-network layer), and registers
//! it in `nn/stack.rs`; `population::PopulationNet` calls them through [`StackedNorm`]
//! and names none.

use candle_core::{DType, Result, Tensor, Var};

use super::{BnStats, Role};

/// What a population layer asks of its normalization.
pub(crate) trait StackedNorm: Send + Sync {
    /// Trainable variables, then buffers, in the order their layouts were taken.
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>);

    /// The same normalization over copies of its variables (a target network).
    fn copied(&self) -> Result<Box<dyn StackedNorm>>;

    /// The normalized (and scaled) `h`; with batch statistics, a method that keeps
    /// running statistics updates them as a single network's training forward does.
    fn forward(&self, h: Tensor, stats: BnStats) -> Result<Tensor>;

    /// `relu(forward(h) + bias)` as one fused op, where the method has one for `h`'s
    /// device and this layer (its kernel's loops run per agent: `kernels::per_agent`);
    /// `None` otherwise, and the layer adds its bias and applies the ReLU itself. Only
    /// mean-only batch norm's layers have a bias besides their normalization.
    fn forward_relu(
        &self,
        _h: &Tensor,
        _stats: BnStats,
        _bias: Option<&Var>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// Weight norm's data-dependent init met this layer, whose scaled batch mean per
    /// unit is `mean`: whether the method took it (mean-only batch norm starts its
    /// running mean there, and the bias at 0), else the bias starts at `-mean`.
    fn take_initial_mean(&self, _mean: &Tensor) -> Result<bool> {
        Ok(false)
    }

    /// The method's work after optimizer step `updates` on the layer's weight `[P, in,
    /// out]` (SVB's projection, BBN's bound of the gains); whether it ran.
    fn after_step(&self, _updates: u64, _weight: &Var) -> Result<bool> {
        Ok(false)
    }

    /// BBN's bound of each agent's gains with bound `eps`, where the method has gains
    /// over running statistics (batch norm's); nothing elsewhere.
    fn bound_gains(&self, _eps: f64) -> Result<()> {
        Ok(())
    }
}

/// Takes a stacked variable of the layer by its name's suffix (`ln.gamma`) and group.
pub(crate) type Take<'a> = dyn FnMut(&str, Role) -> Result<Var> + 'a;

/// A copy of `v`, as a variable of its own.
pub(crate) fn copy_var(v: &Var) -> Result<Var> {
    Var::from_tensor(&v.as_tensor().copy()?)
}

/// `running = (1 - momentum) running + momentum batch`: a running statistic's update.
pub(crate) fn blend(running: &Var, batch: &Tensor, momentum: f64) -> Result<()> {
    let kept = (running.as_tensor() * (1.0 - momentum))?;
    running.set(&(kept + (batch.detach() * momentum)?)?)
}

/// Mean and population variance of `h` along `dim`, kept for broadcasting.
pub(crate) fn moments(h: &Tensor, dim: usize) -> Result<(Tensor, Tensor)> {
    let mean = h.mean_keepdim(dim)?;
    let var = h.broadcast_sub(&mean)?.sqr()?.mean_keepdim(dim)?;
    Ok((mean, var))
}

/// Each agent's per-unit moments over its batch (and a feature map's positions): `h`
/// is `[P, B, out]` or `[P, B, out, positions]`.
///
/// Summed in f64, as a single network's fused batch norm sums. (The sums' precision
/// alone does not keep a CNN population on its agents' paths: with f32 sums the test's
/// CNN with weight norm met a kink at update 41, with f64 sums not.)
pub(crate) fn unit_moments(h: &Tensor) -> Result<(Tensor, Tensor)> {
    let wide = h.to_dtype(DType::F64)?;
    let (mean, var) = match h.rank() {
        3 => moments(&wide, 1)?,
        _ => {
            let mean = wide.mean_keepdim(3)?.mean_keepdim(1)?;
            let centered = wide.broadcast_sub(&mean)?;
            let var = centered.sqr()?.mean_keepdim(3)?.mean_keepdim(1)?;
            (mean, var)
        }
    };
    Ok((mean.to_dtype(DType::F32)?, var.to_dtype(DType::F32)?))
}

/// `x_hat gamma + beta`, per unit.
pub(crate) fn affine(x_hat: Tensor, gamma: &Var, beta: &Var) -> Result<Tensor> {
    x_hat
        .broadcast_mul(gamma.as_tensor())?
        .broadcast_add(beta.as_tensor())
}

#[cfg(test)]
mod tests {
    use candle_core::{Tensor, Var};

    use super::StackedNorm;
    use crate::nn::group_norm::StackedGroupNorm;
    use crate::nn::init::InitRng;
    use crate::nn::rms_norm::StackedRmsNorm;
    use crate::nn::BnStats;
    use crate::test_support::{gradients, max_relative, random};

    /// A method's fused per-agent op against its tensor-op form with a ReLU after it:
    /// the same outputs and the same gradients of `h` and of every variable.
    fn fused_equals_reference(norm: &dyn StackedNorm, h: &Var, what: &str) {
        fused_equals_reference_with(norm, norm, h, BnStats::Batch, what);
    }

    /// [`fused_equals_reference`] with the fused op of `fused` and the tensor form of
    /// `reference`, two copies of one state (a method with running statistics changes
    /// them in its forward).
    fn fused_equals_reference_with(
        fused: &dyn StackedNorm,
        reference: &dyn StackedNorm,
        h: &Var,
        stats: BnStats,
        what: &str,
    ) {
        let mut rng = InitRng::new(7);
        let weights = random(&mut rng, h.dims());
        let y = fused.forward_relu(h.as_tensor(), stats, None).unwrap();
        let y = y.unwrap_or_else(|| panic!("{what}: no fused op on the CPU"));
        let y_ref = reference.forward(h.as_tensor().clone(), stats).unwrap();
        let y_ref = y_ref.relu().unwrap();
        assert!(max_relative(&y, &y_ref) < 1e-5, "{what}: outputs differ");
        let grads = |y: &Tensor| gradients(y, &weights);
        let (gf, gr) = (grads(&y), grads(&y_ref));
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

    #[test]
    fn fused_population_batch_norm_equals_its_tensor_form() {
        use crate::nn::batch_norm::StackedBatchNorm;
        use crate::nn::{NormConfig, NormKind, Role};
        for kind in [NormKind::BatchNorm, NormKind::BatchRenorm] {
            for (h, unit) in [
                (vec![3, 5, 8], vec![3, 1, 8]),
                (vec![3, 5, 4, 6], vec![3, 1, 4, 1]),
            ] {
                let config = NormConfig {
                    kind,
                    brn_warmup: 0,
                    brn_r_max: 1.2,
                    brn_d_max: 0.3,
                    ..Default::default()
                };
                let mut rng = InitRng::new(4);
                let make = |rng: &mut InitRng| {
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
                    (StackedBatchNorm::stack(&mut take, &config).unwrap(), vars)
                };
                // Two copies of one state: the same draws.
                let (fused_bn, _) = make(&mut InitRng::new(4));
                let (reference_bn, _) = make(&mut rng);
                let x = Var::from_tensor(&random(&mut InitRng::new(8), &h)).unwrap();
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
        use crate::nn::mean_only_bn::StackedMeanOnly;
        use crate::nn::{NormConfig, Role};
        for (h, unit) in [
            (vec![3, 5, 8], vec![3, 1, 8]),
            (vec![3, 5, 4, 6], vec![3, 1, 4, 1]),
        ] {
            let mut rng = InitRng::new(6);
            let running = random(&mut rng, &unit);
            let make = || {
                let mut take = |_: &str, _: Role| Var::from_tensor(&running);
                StackedMeanOnly::stack(&mut take, &NormConfig::default()).unwrap()
            };
            let (fused, reference) = (make(), make());
            let x = Var::from_tensor(&random(&mut rng, &h)).unwrap();
            let bias = Var::from_tensor(&random(&mut rng, &unit)).unwrap();
            let weights = random(&mut rng, &h);
            for stats in [BnStats::Batch, BnStats::Running] {
                let y = fused
                    .forward_relu(x.as_tensor(), stats, Some(&bias))
                    .unwrap()
                    .unwrap();
                let y_ref = reference.forward(x.as_tensor().clone(), stats).unwrap();
                let y_ref = y_ref
                    .broadcast_add(bias.as_tensor())
                    .unwrap()
                    .relu()
                    .unwrap();
                assert!(
                    max_relative(&y, &y_ref) < 1e-5,
                    "{h:?} {stats:?}: outputs differ"
                );
                let grads = |y: &Tensor| gradients(y, &weights);
                let (gf, gr) = (grads(&y), grads(&y_ref));
                for v in [&x, &bias] {
                    let (a, b) = (
                        gf.get(v.as_tensor()).unwrap(),
                        gr.get(v.as_tensor()).unwrap(),
                    );
                    assert!(
                        max_relative(a, b) < 1e-4,
                        "{h:?} {stats:?}: gradient of {:?}",
                        v.dims()
                    );
                }
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
        let mut rng = InitRng::new(3);
        let mut var = |dims: &[usize]| Var::from_tensor(&random(&mut rng, dims)).unwrap();
        // Three agents; MLP pre-activations [P, B, units] and feature maps [P, B, C, positions].
        for (h, gain, groups, what) in [
            (vec![3, 5, 8], vec![3, 1, 8], 1, "layer norm, MLP"),
            (vec![3, 5, 8], vec![3, 1, 8], 2, "group norm, MLP"),
            (vec![3, 5, 4, 6], vec![3, 1, 4, 6], 1, "layer norm, CNN"),
            (vec![3, 5, 4, 6], vec![3, 1, 4, 1], 2, "group norm, CNN"),
        ] {
            let norm = StackedGroupNorm::new(var(&gain), var(&gain), groups, 1e-5);
            fused_equals_reference(&norm, &var(&h), what);
        }
        for (h, gain, what) in [
            (vec![3, 5, 8], vec![3, 1, 8], "RMSNorm, MLP"),
            (vec![3, 5, 4, 6], vec![3, 1, 4, 6], "RMSNorm, CNN"),
        ] {
            let norm = StackedRmsNorm::new(var(&gain), 1e-5);
            fused_equals_reference(&norm, &var(&h), what);
        }
    }
}
