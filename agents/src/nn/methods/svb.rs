//! Singular Value Bounding (Jia et al., CVPR 2017): every `svb_interval` optimizer steps
//! each hidden weight matrix `W = U S V^T` (conv weights as `(c_out, c_in*kh*kw)`) is
//! rewritten as `U S' V^T` with every singular value clamped into `[1/(1+eps), 1+eps]`.
//! Bounded Batch Normalization bounds BN's per-channel gains the same way.
//!
//! The SVD runs on the host with faer (candle has none). A single network's layer and a
//! population's take these steps through one function, `after_step.rs`'s.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::svb;
//!
//! let w = Tensor::new(&[[3.0f32, 0.0], [0.0, 0.1]], &Device::Cpu).unwrap();
//! let bounded = svb::clamp_singular_values(&w, 1.0 / 1.5, 1.5).unwrap();
//! let s = svb::singular_values(&bounded).unwrap();
//! assert!((s[0] - 1.5).abs() < 1e-5 && (s[1] - 1.0 / 1.5).abs() < 1e-5);
//! ```

use candle_core::{Result, Tensor, Var};
use faer::Mat;

/// `(rows, cols)` of the matrix view of a weight: `(c_out, everything else)`.
fn matrix_dims(w: &Tensor) -> (usize, usize) {
    let rows = w.dims()[0];
    (rows, w.elem_count() / rows.max(1))
}

fn to_mat(w: &Tensor) -> Result<Mat<f64>> {
    let (rows, cols) = matrix_dims(w);
    let data: Vec<f32> = w.flatten_all()?.to_vec1()?;
    Ok(Mat::from_fn(rows, cols, |i, j| {
        f64::from(data[i * cols + j])
    }))
}

fn svd_error(e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!("SVD did not converge: {e:?}"))
}

/// Singular values of the matrix view of `w`, largest first.
pub fn singular_values(w: &Tensor) -> Result<Vec<f64>> {
    to_mat(w)?.singular_values().map_err(svd_error)
}

/// `U clamp(S, low, high) V^T` in `w`'s shape, on `w`'s device.
pub fn clamp_singular_values(w: &Tensor, low: f64, high: f64) -> Result<Tensor> {
    let (rows, cols) = matrix_dims(w);
    let svd = to_mat(w)?.thin_svd().map_err(svd_error)?;
    let s = svd.S().column_vector();
    let mut us = svd.U().to_owned();
    for r in 0..us.ncols() {
        let clamped = s[r].clamp(low, high);
        for i in 0..rows {
            us[(i, r)] *= clamped;
        }
    }
    let product = &us * svd.V().transpose();
    let out: Vec<f32> = (0..rows * cols)
        .map(|idx| product[(idx / cols, idx % cols)] as f32)
        .collect();
    Tensor::from_vec(out, w.shape(), w.device())
}

/// Whether SVB's projection (and BBN's bound) is due after optimizer step `updates`
/// (counting from 1): every `interval` steps, for a single network and a population.
pub(crate) fn due(updates: u64, interval: u64) -> bool {
    updates.is_multiple_of(interval)
}

/// SVB's projection with bound `eps`.
pub fn project(w: &Tensor, eps: f64) -> Result<Tensor> {
    clamp_singular_values(w, 1.0 / (1.0 + eps), 1.0 + eps)
}

/// SVB's projection of `weight` in place: one network's (`lead` 0), or each agent's of a
/// population's `[P, ...]` (`lead` 1), an SVD per agent on the host (so this work grows
/// with P, at SVB's interval only).
pub(crate) fn project_var(weight: &Var, eps: f64, lead: usize) -> Result<()> {
    let w = weight.as_tensor();
    let projected = match lead {
        0 => project(w, eps)?,
        _ => {
            let agents = (0..w.dim(0)?)
                .map(|i| project(&w.get(i)?, eps))
                .collect::<Result<Vec<_>>>()?;
            Tensor::stack(&agents, 0)?.contiguous()?
        }
    };
    weight.set(&projected)
}

/// Bounded BN: with per-channel gain magnitudes `|gamma_i| / sigma_i` and `alpha` their
/// mean, rewrites each `|gamma_i|` so that `|gamma_i| / (sigma_i * alpha)` lies in
/// `[1/(1+eps), 1+eps]`, keeping each gamma's sign (a negative gain in front of a ReLU
/// is a learned value; clamping the signed ratio turned such gains positive and made
/// BBN collapse on CartPole). A gamma of 0 stays 0. Returns the new `gamma`.
///
/// ```
/// let gamma = normrl_agents::nn::svb::bound_bn_gains(&[2.0, -3.0, 0.0, 0.1], &[1.0; 4], 0.2);
/// // alpha = 1.275: 2 and -3 are bounded to ±1.2 alpha, 0.1 raised to alpha / 1.2.
/// let expected = [1.53, -1.53, 0.0, 1.0625];
/// assert!(gamma.iter().zip(expected).all(|(g, e)| (g - e).abs() < 1e-5), "{gamma:?}");
/// ```
pub fn bound_bn_gains(gamma: &[f32], sigma: &[f32], eps: f64) -> Vec<f32> {
    let magnitudes: Vec<f64> = gamma
        .iter()
        .zip(sigma)
        .map(|(&g, &s)| f64::from(g).abs() / f64::from(s))
        .collect();
    let alpha = magnitudes.iter().sum::<f64>() / magnitudes.len().max(1) as f64;
    if alpha < f64::MIN_POSITIVE || !alpha.is_finite() {
        return gamma.to_vec();
    }
    gamma
        .iter()
        .zip(sigma)
        .zip(&magnitudes)
        .map(|((&g, &s), &m)| {
            if g == 0.0 {
                return 0.0;
            }
            let bounded = (m / alpha).clamp(1.0 / (1.0 + eps), 1.0 + eps);
            (f64::from(g).signum() * bounded * f64::from(s) * alpha) as f32
        })
        .collect()
}
