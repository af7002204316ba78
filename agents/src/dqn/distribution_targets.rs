//! A distributional loss's target distributions in tensor ops, for any leading axes
//! (`[B, ...]` for one agent, `[P, B, ...]` for a population): what a device computes
//! without reading the next observations' logits back to the host. The host functions
//! of [`super::distribution`] are their reference (`distribution_targets_tests.rs`) and
//! stay what the CPU's fused path and single agents use, so that those keep their
//! rounding.
//!
//! C51's projection scatters each shifted atom's mass onto its two neighbours
//! (`scatter_add`: memory `[.., B, K]`, not the `[.., B, K, K]` of the hat-function
//! form, so a population of hundreds fits); HL-Gauss's histogram differences the
//! Gaussian's CDF at the bin edges with `erf`.

use candle_core::{DType, Device, Result, Tensor, D};

use super::distribution::SIGMA_BINS;
use super::td::{best_next, bootstrap, discounts, Discount};
use super::{Support, ValueLoss};
use crate::nn::expected_q;

/// A support's constant tensors, made once on the device (no upload inside a step).
#[derive(Debug, Clone)]
pub struct SupportTensors {
    loss: ValueLoss,
    support: Support,
    /// The head's values `[K]`: C51's atoms, HL-Gauss's bin centres.
    values: Tensor,
    /// HL-Gauss's bin edges `[K + 1]`, scaled by `1 / (sigma sqrt 2)` (the `erf`'s
    /// argument is `(edge - y) / (sigma sqrt 2)`).
    scaled_edges: Option<Tensor>,
    /// The clips' bounds, `(v_min, v_max)` and `(0, K - 1)` as one-value tensors: a
    /// scalar bound would be uploaded at every call, which a captured CUDA graph
    /// cannot replay.
    support_bounds: (Tensor, Tensor),
    index_bounds: (Tensor, Tensor),
}

/// `x` clipped to `[lo, hi]` (one-value tensors).
fn clip(x: &Tensor, (lo, hi): &(Tensor, Tensor)) -> Result<Tensor> {
    x.broadcast_maximum(lo)?.broadcast_minimum(hi)
}

/// The rows of a batch's bootstrap as tensors: rewards and terminations `[.., B]`,
/// and the discount (one, or each agent's `[P, 1]`).
pub struct TensorBootstrap<'a> {
    pub rewards: &'a Tensor,
    pub terminated: &'a Tensor,
    pub gamma: Discount<'a>,
}

impl SupportTensors {
    /// The constants of `loss`'s support, whose values `values` the head was built with.
    pub fn new(
        loss: ValueLoss,
        support: &Support,
        values: &[f32],
        device: &Device,
    ) -> Result<Self> {
        let scaled_edges = match loss {
            ValueLoss::HlGauss => {
                let k = support.atoms;
                let (width, scale) = (bin_width(support), erf_scale(support));
                let edges: Vec<f32> = (0..=k)
                    .map(|i| ((support.v_min + i as f64 * width) * scale) as f32)
                    .collect();
                Some(Tensor::from_vec(edges, k + 1, device)?)
            }
            _ => None,
        };
        let bound = |v: f64| Tensor::from_vec(vec![v as f32], 1, device);
        let last = (support.atoms - 1) as f64;
        Ok(Self {
            loss,
            support: *support,
            values: Tensor::from_slice(values, values.len(), device)?,
            scaled_edges,
            support_bounds: (bound(support.v_min)?, bound(support.v_max)?),
            index_bounds: (bound(0.0)?, bound(last)?),
        })
    }

    /// The head's values `[K]`.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// Q-values `[.., A]` of a head's logits `[.., A K]`: the expectations over the
    /// support.
    pub fn q_values(&self, logits: &Tensor) -> Result<Tensor> {
        expected_q(&self.per_atom(logits)?, &self.values)
    }

    /// A head's logits `[.., A K]` as `[.., A, K]`.
    fn per_atom(&self, logits: &Tensor) -> Result<Tensor> {
        let mut dims = logits.dims().to_vec();
        let (k, last) = (self.values.dim(0)?, dims.len() - 1);
        dims[last] /= k;
        dims.push(k);
        logits.reshape(dims)
    }

    /// The target distributions `[.., B, K]` from the next observations' logits
    /// `next_logits` `[.., B, A K]`, `chooser`'s Q-values `[.., B, A]` picking the next
    /// action under Double DQN (else the largest expected value): the tensor form of
    /// [`super::distribution::target_distributions`]. Detached.
    pub fn targets(
        &self,
        next_logits: &Tensor,
        chooser: Option<&Tensor>,
        rows: &TensorBootstrap,
    ) -> Result<Tensor> {
        let next_logits = next_logits.detach();
        let out = match self.loss {
            ValueLoss::HlGauss => {
                let chooser = chooser.map(|c| c.detach());
                let best = best_next(&self.q_values(&next_logits)?, chooser.as_ref())?;
                self.histograms(&bootstrap(
                    rows.rewards,
                    rows.terminated,
                    &best,
                    rows.gamma,
                )?)?
            }
            _ => self.projections(&next_logits, chooser, rows)?,
        };
        out.detach().contiguous()
    }

    /// HL-Gauss: each scalar TD target of `y` `[.., B]`, clipped to the support, turned
    /// into the mass its Gaussian puts in each bin (renormalized to the support).
    fn histograms(&self, y: &Tensor) -> Result<Tensor> {
        let Some(edges) = &self.scaled_edges else {
            candle_core::bail!("HL-Gauss's targets without its bin edges");
        };
        let s = &self.support;
        let y = clip(y, &self.support_bounds)?.affine(erf_scale(s), 0.0)?;
        // The CDF at every edge `[.., B, K + 1]`, as the host reference computes it.
        let cdf = edges
            .broadcast_sub(&y.unsqueeze(D::Minus1)?)?
            .erf()?
            .affine(0.5, 0.5)?;
        let k = self.support.atoms;
        let last = cdf.rank() - 1;
        let mass = (cdf.narrow(last, 1, k)? - cdf.narrow(last, 0, k)?)?;
        let total = (cdf.narrow(last, k, 1)? - cdf.narrow(last, 0, 1)?)?;
        mass.broadcast_div(&total)
    }

    /// C51: the next distribution at `a*` moved to `r + gamma (1 - done) z_j`, each atom
    /// clipped to the support, its mass split between the atoms around it in
    /// proportion to nearness.
    fn projections(
        &self,
        next: &Tensor,
        chooser: Option<&Tensor>,
        rows: &TensorBootstrap,
    ) -> Result<Tensor> {
        // `[.., B, A, K]`.
        let probs = candle_nn::ops::softmax_last_dim(&self.per_atom(next)?)?;
        let q = match chooser {
            Some(c) => c.detach(),
            None => probs.broadcast_mul(&self.values)?.sum(D::Minus1)?,
        };
        // The chosen action's distribution `[.., B, K]`.
        let action_axis = probs.rank() - 2;
        let mut index_dims = probs.dims().to_vec();
        index_dims[action_axis] = 1;
        let best = q.argmax_keepdim(D::Minus1)?.unsqueeze(D::Minus1)?;
        let best = best.broadcast_as(index_dims)?.contiguous()?;
        let p = probs.gather(&best, action_axis)?.squeeze(action_axis)?;
        let positions = self.positions(rows)?;
        // Mass to the atom below each position and the one above it (the last atom's
        // neighbour above is itself, with no mass: `b - l` is 0 there).
        let below = positions.floor()?;
        let above = (&below + 1.0)?.broadcast_minimum(&self.index_bounds.1)?;
        let to_below = (&p * (&below + 1.0)?.sub(&positions)?)?;
        let to_above = (&p * positions.sub(&below)?)?;
        let zeros = p.zeros_like()?;
        let axis = p.rank() - 1;
        zeros
            .scatter_add(&below.to_dtype(DType::U32)?, &to_below, axis)?
            .scatter_add(&above.to_dtype(DType::U32)?, &to_above, axis)
    }

    /// Where each atom lands, `(clip(r + gamma (1 - done) z_j) - v_min) / dz`, in atom
    /// indices `[.., B, K]`, clipped to `[0, K - 1]` against rounding.
    fn positions(&self, rows: &TensorBootstrap) -> Result<Tensor> {
        let s = &self.support;
        let k = s.atoms;
        let dz = (s.v_max - s.v_min) / (k - 1) as f64;
        let shifted = discounts(rows.terminated, rows.gamma)?
            .unsqueeze(D::Minus1)?
            .broadcast_mul(&self.values)?
            .broadcast_add(&rows.rewards.unsqueeze(D::Minus1)?)?;
        let at = clip(&shifted, &self.support_bounds)?.affine(1.0 / dz, -s.v_min / dz)?;
        clip(&at, &self.index_bounds)
    }
}

/// HL-Gauss's bin width.
fn bin_width(s: &Support) -> f64 {
    (s.v_max - s.v_min) / s.atoms as f64
}

/// `1 / (sigma sqrt 2)`, sigma 0.75 bin widths: the factor of the `erf`'s argument.
fn erf_scale(s: &Support) -> f64 {
    1.0 / (SIGMA_BINS * bin_width(s) * std::f64::consts::SQRT_2)
}

#[cfg(test)]
#[path = "distribution_targets_tests.rs"]
mod tests;
