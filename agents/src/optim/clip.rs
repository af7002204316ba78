//! Gradient clipping by global norm, one rule for every path: gradients whose norm
//! exceeds `max` are scaled by `max / (norm + 1e-6)`, others are kept. On the host with
//! the norm as a number; as tensor ops with the norm on the device, one per agent
//! (`[P]`) for a population or a scalar for a single agent, so nothing waits for the
//! device.

use candle_core::{Result, Tensor};

/// Added to the norm in the clipping factor, as PyTorch's `clip_grad_norm_` does.
const NORM_EPS: f64 = 1e-6;

/// The factor gradients of global norm `norm` are scaled by (`max <= 0`: no clipping).
pub fn scale(norm: f64, max: f64) -> f64 {
    if max > 0.0 && norm > max {
        max / (norm + NORM_EPS)
    } else {
        1.0
    }
}

/// [`scale`] of each norm in `norms` (any shape), as tensor ops; `None` without
/// clipping.
pub fn scale_tensor(norms: &Tensor, max: f64) -> Result<Option<Tensor>> {
    if max <= 0.0 {
        return Ok(None);
    }
    let clipped = norms.affine(1.0, NORM_EPS)?.recip()?.affine(max, 0.0)?;
    Ok(Some(
        norms.gt(max)?.where_cond(&clipped, &norms.ones_like()?)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor rule equals the host's, per element, on both sides of the bound and
    /// at it.
    #[test]
    fn the_tensor_rule_is_the_hosts() {
        let norms = [0.0f32, 0.5, 1.0, 1.000_000_1, 3.0, 1e6];
        let t = Tensor::new(&norms, &candle_core::Device::Cpu).unwrap();
        let got: Vec<f32> = scale_tensor(&t, 1.0).unwrap().unwrap().to_vec1().unwrap();
        for (n, g) in norms.iter().zip(got) {
            let expected = scale(f64::from(*n), 1.0) as f32;
            assert!(
                (g - expected).abs() <= 1e-7 * expected,
                "{n}: {g} against {expected}"
            );
        }
        assert_eq!(scale(5.0, 0.0), 1.0);
        assert!(scale_tensor(&t, 0.0).unwrap().is_none());
    }
}
