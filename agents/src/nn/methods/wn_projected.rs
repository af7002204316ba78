//! Projected weight norm (`wn_projected`): weight norm whose direction `v` is put back
//! on the unit sphere, per output unit, after every optimizer step, `v <- v / ||v||`.
//!
//! With weight norm the loss does not change when a unit's `v` is scaled, so its
//! gradient is orthogonal to `v` and every step lengthens it: the angle a step turns
//! `v` by, about `||step|| / ||v||`, shrinks on its own schedule (Lyle et al. 2024).
//! Keeping `||v|| = 1` holds that effective step at what the optimizer's schedule says,
//! and changes nothing else: the forward divides by `||v||` anyway, and `g` carries
//! the scale. The layer is weight norm's in every other respect (`weight_norm.rs`); the
//! projection is [`unit_rows`], which hyperspherical layers share.

use candle_core::{Result, Tensor, Var};

use crate::kernels::projection::{UnitRows, NORM_FLOOR};

/// `w` with each output unit's incoming weights scaled to norm 1. `lead` counts the
/// leading axes before the unit axis (0 for one network's `[out, in...]`, 1 for a
/// population's `[P, out, in]`); a unit's weights are everything after it.
pub(crate) fn unit_rows(w: &Tensor, lead: usize) -> Result<Tensor> {
    let rows = w.flatten_from(lead + 1)?;
    let norms = rows
        .sqr()?
        .sum_keepdim(lead + 1)?
        .sqrt()?
        .maximum(f64::from(NORM_FLOOR))?;
    rows.broadcast_div(&norms)?.reshape(w.shape())
}

/// Projects `weight` (weight norm's `v`, or a hyperspherical layer's `w`) in place:
/// each unit's row to norm 1 (see [`unit_rows`]). On the CPU by one in-place op that
/// creates no tensor; elsewhere by the tensor form.
pub(crate) fn project(weight: &Var, lead: usize) -> Result<()> {
    let w = weight.as_tensor();
    if w.device().is_cpu() {
        let row = w.dims()[lead + 1..].iter().product();
        return w.inplace_op1(&UnitRows { row });
    }
    weight.set(&unit_rows(w, lead)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::{project, unit_rows};

    /// Each unit's row ends at norm 1 in its direction, whatever the leading axes.
    #[test]
    fn rows_reach_unit_norm_in_their_direction() {
        let w = Tensor::new(&[[3.0f32, 4.0], [0.0, -2.0], [0.0, 0.0]], &Device::Cpu).unwrap();
        let got = unit_rows(&w, 0).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(got, vec![vec![0.6, 0.8], vec![0.0, -1.0], vec![0.0, 0.0]]);
        // A population of two of them: each agent's rows alike.
        let stacked = Tensor::stack(&[&w, &(&w * 2.0).unwrap()], 0).unwrap();
        let got = unit_rows(&stacked, 1).unwrap();
        assert_eq!(
            got.get(1).unwrap().to_vec2::<f32>().unwrap()[0],
            vec![0.6, 0.8]
        );
        // A conv filter `[out, c_in, k, k]`: the unit is the whole filter.
        let conv = Tensor::ones((2, 3, 2, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
        let got = unit_rows(&conv, 0).unwrap().flatten_all().unwrap();
        let expected = 1.0 / 12f32.sqrt();
        assert!(got
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|&x| (x - expected).abs() < 1e-7));
    }

    /// The CPU's in-place projection is the tensor form's, to rounding.
    #[test]
    fn in_place_projection_matches_the_tensor_form() {
        let w = Tensor::randn(0f32, 1.0, (3, 4, 6), &Device::Cpu).unwrap();
        for lead in [0, 1] {
            let var = Var::from_tensor(&w.copy().unwrap()).unwrap();
            project(&var, lead).unwrap();
            let want = unit_rows(&w, lead).unwrap();
            let diff = (var.as_tensor() - &want).unwrap().abs().unwrap();
            let max = diff.flatten_all().unwrap().max(0).unwrap();
            let max = max.to_scalar::<f32>().unwrap();
            assert!(max < 1e-6, "lead {lead}: {max}");
        }
    }
}
