//! Normalize-and-Project (`nap`; Lyle et al., "Normalization and effective learning
//! rates in reinforcement learning", NeurIPS 2024, arXiv 2407.01800): a layer norm
//! before each nonlinearity (this file adds nothing to `layer_norm.rs` there), and after
//! every optimizer step each hidden layer's weight rescaled to its norm at
//! initialization, `W <- rho W / ||W||`, with `rho` kept as a buffer (`<layer>.rho`).
//!
//! Why: a weight followed by a layer norm is scale-invariant, so each step lengthens it
//! and the effective learning rate decays as `1 / ||W||`; pinning `||W||` holds it. The
//! layer norm's gain and offset together are scale-invariant too when a ReLU and the
//! next layer norm follow (`relu(c (gamma x + beta)) = c relu(gamma x + beta)`), so they
//! are projected jointly back to their initial norm, `sqrt(d)` for `gamma = 1, beta =
//! 0` over `d` features. The layer has no bias (layer norm's mean removes it). The
//! output layer is not followed by a normalization and is left free. `docs/methods.md`
//! says which of these the paper states and which normrl chose.

use candle_core::{Result, Tensor, Var};

use crate::kernels::projection::{JointToNorm, ToNorm};

/// Floor of a norm in a projection, so that a zero tensor stays zero.
const NORM_FLOOR: f64 = crate::kernels::projection::NORM_FLOOR as f64;

/// Each leading index's norm over the axes after `lead`, keeping every axis.
fn norms(t: &Tensor, lead: usize) -> Result<Tensor> {
    let flat = t.flatten_from(lead)?;
    let sq = flat.sqr()?.sum_keepdim(lead)?;
    let mut shape = t.dims()[..lead].to_vec();
    shape.resize(t.rank(), 1);
    sq.sqrt()?.reshape(shape)
}

/// The norm `rho` of `w` per leading index (a population's agent), kept as the layer's
/// buffer: `[1]` for one network, `[P, 1, 1]`-shaped values for a population.
pub(crate) fn initial_norm(w: &Tensor) -> Result<Tensor> {
    norms(w, 0)?.flatten_all()
}

/// `w` scaled to norm `rho` per leading index (`lead` leading axes; `rho` has one value
/// per leading index, in any shape).
pub(crate) fn to_norm(w: &Tensor, rho: &Tensor, lead: usize) -> Result<Tensor> {
    let n = norms(w, lead)?;
    let rho = rho.reshape(n.shape())?;
    w.broadcast_mul(&rho.broadcast_div(&n.maximum(NORM_FLOOR)?)?)
}

/// The layer's step after an optimizer step: `weight` to norm `rho`, and the layer
/// norm's `(gamma, beta)` jointly to `sqrt(d)`, in place. On the CPU by in-place ops
/// that create no tensor; elsewhere by tensor ops.
pub(crate) fn project(
    weight: &Var,
    rho: &Var,
    affine: Option<(&Var, &Var)>,
    lead: usize,
) -> Result<()> {
    let in_place = weight.device().is_cpu();
    project_with(weight, rho, affine, (lead, in_place))
}

/// [`project`], by the in-place ops (`in_place`) or by tensor ops (a device's, and the
/// reference the in-place ops are tested against).
fn project_with(
    weight: &Var,
    rho: &Var,
    affine: Option<(&Var, &Var)>,
    (lead, in_place): (usize, bool),
) -> Result<()> {
    let w = weight.as_tensor();
    match in_place {
        true => w.inplace_op2(
            rho.as_tensor(),
            &ToNorm {
                block: per_agent(w, lead),
            },
        )?,
        false => weight.set(&to_norm(w, rho.as_tensor(), lead)?)?,
    }
    match affine {
        Some((gamma, beta)) => project_affine(gamma, beta, lead, in_place),
        None => Ok(()),
    }
}

/// Values per leading index (an agent's) of `t`.
fn per_agent(t: &Tensor, lead: usize) -> usize {
    t.dims()[lead..].iter().product()
}

/// A layer norm's gain and offset, jointly to norm `sqrt(d)` per leading index: in
/// place on the CPU (`in_place`), else by tensor ops.
fn project_affine(gamma: &Var, beta: &Var, lead: usize, in_place: bool) -> Result<()> {
    let (g, b) = (gamma.as_tensor(), beta.as_tensor());
    let block = per_agent(g, lead);
    if in_place {
        b.inplace_op2(
            g,
            &JointToNorm {
                block,
                offset: true,
            },
        )?;
        return g.inplace_op2(
            b,
            &JointToNorm {
                block,
                offset: false,
            },
        );
    }
    let joint = (norms(g, lead)?.sqr()? + norms(b, lead)?.sqr()?)?;
    let factor = (joint.sqrt()?.maximum(NORM_FLOOR)?.recip()? * (block as f64).sqrt())?;
    gamma.set(&g.broadcast_mul(&factor)?)?;
    beta.set(&b.broadcast_mul(&factor)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::{initial_norm, project, project_with};

    /// The weight keeps its direction at norm `rho`; gain and offset reach joint norm
    /// `sqrt(d)` per agent.
    #[test]
    fn projects_to_the_initial_norms() {
        let dev = Device::Cpu;
        let w0 = Tensor::new(&[[1.0f32, 2.0], [2.0, 4.0]], &dev).unwrap();
        let rho = Var::from_tensor(&initial_norm(&w0).unwrap()).unwrap();
        assert_eq!(rho.as_tensor().to_vec1::<f32>().unwrap(), vec![5.0]);
        let w = Var::from_tensor(&(&w0 * 3.0).unwrap()).unwrap();
        let gamma = Var::new(&[3.0f32, 0.0], &dev).unwrap();
        let beta = Var::new(&[0.0f32, 4.0], &dev).unwrap();
        project(&w, &rho, Some((&gamma, &beta)), 0).unwrap();
        assert_eq!(
            w.as_tensor().to_vec2::<f32>().unwrap(),
            w0.to_vec2::<f32>().unwrap()
        );
        let scale = 2f32.sqrt() / 5.0;
        let g = gamma.as_tensor().to_vec1::<f32>().unwrap();
        let b = beta.as_tensor().to_vec1::<f32>().unwrap();
        assert!((g[0] - 3.0 * scale).abs() < 1e-6 && (b[1] - 4.0 * scale).abs() < 1e-6);
        // Two agents `[P, out, in]`, rho `[P, 1, 1]`: each to its own norm.
        let stacked = Tensor::stack(&[&w0, &(&w0 * 2.0).unwrap()], 0).unwrap();
        let rho = Var::from_tensor(&Tensor::new(&[[[1.0f32]], [[10.0]]], &dev).unwrap()).unwrap();
        let w = Var::from_tensor(&stacked).unwrap();
        project(&w, &rho, None, 1).unwrap();
        let norms = w
            .as_tensor()
            .sqr()
            .unwrap()
            .sum((1, 2))
            .unwrap()
            .sqrt()
            .unwrap();
        let norms = norms.to_vec1::<f32>().unwrap();
        assert!((norms[0] - 1.0).abs() < 1e-6 && (norms[1] - 10.0).abs() < 1e-5);
    }

    /// The CPU's in-place projection is the tensor form's, to rounding, for a
    /// population's weights, gains and offsets.
    #[test]
    fn in_place_projection_matches_the_tensor_form() {
        let dev = Device::Cpu;
        let var = |t: Tensor| Var::from_tensor(&t).unwrap();
        let values = [
            Tensor::randn(0f32, 1.0, (3, 5, 4), &dev).unwrap(),
            Tensor::randn(1f32, 0.3, (3, 1, 5), &dev).unwrap(),
            Tensor::randn(0f32, 0.3, (3, 1, 5), &dev).unwrap(),
        ];
        let rho = var(Tensor::new(&[[[1.0f32]], [[2.0]], [[0.5]]], &dev).unwrap());
        let fresh = || {
            values
                .iter()
                .map(|t| var(t.copy().unwrap()))
                .collect::<Vec<_>>()
        };
        let (a, b) = (fresh(), fresh());
        project(&a[0], &rho, Some((&a[1], &a[2])), 1).unwrap();
        project_with(&b[0], &rho, Some((&b[1], &b[2])), (1, false)).unwrap();
        for (x, y) in a.iter().zip(&b) {
            let diff = (x.as_tensor() - y.as_tensor()).unwrap().abs().unwrap();
            let max = diff
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(max < 2e-6, "{max}");
        }
    }
}
