//! The projections after an optimizer step, in place on the CPU (`nn/methods/wn_projected.rs`,
//! `nn/methods/nap.rs`): no tensor is created, so a population's step keeps its fixed count of
//! operations. Each is tested against its tensor-op form, which a device runs.

use candle_core::{CpuStorage, InplaceOp1, InplaceOp2, Layout, Result};

/// Floor of a norm in a projection: a zero row or block stays zero.
pub(crate) const NORM_FLOOR: f32 = 1e-12;

fn values_mut<'a>(storage: &'a mut CpuStorage, layout: &Layout) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(v) = storage else {
        candle_core::bail!("projections run on f32 values");
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&mut v[start..end]),
        None => candle_core::bail!("projections run on contiguous values"),
    }
}

fn values<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = storage else {
        candle_core::bail!("projections run on f32 values");
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&v[start..end]),
        None => candle_core::bail!("projections run on contiguous values"),
    }
}

/// The norm of `x`, summed in f64 (a block is a whole layer's weight).
fn norm(x: &[f32]) -> f32 {
    x.iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt() as f32
}

/// Each row of `row` values scaled to norm 1.
pub(crate) struct UnitRows {
    pub row: usize,
}

impl InplaceOp1 for UnitRows {
    fn name(&self) -> &'static str {
        "unit-rows"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        for r in values_mut(storage, layout)?.chunks_exact_mut(self.row.max(1)) {
            let inv = 1.0 / norm(r).max(NORM_FLOOR);
            r.iter_mut().for_each(|x| *x *= inv);
        }
        Ok(())
    }
}

/// Each block of `block` values (an agent's weight) scaled to its norm in `rho` (one
/// value per block).
pub(crate) struct ToNorm {
    pub block: usize,
}

impl InplaceOp2 for ToNorm {
    fn name(&self) -> &'static str {
        "to-norm"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        l: &Layout,
        rho: &CpuStorage,
        lr: &Layout,
    ) -> Result<()> {
        let rho = values(rho, lr)?;
        let blocks = values_mut(dst, l)?.chunks_exact_mut(self.block.max(1));
        for (b, &target) in blocks.zip(rho) {
            let factor = target / norm(b).max(NORM_FLOOR);
            b.iter_mut().for_each(|x| *x *= factor);
        }
        Ok(())
    }
}

/// Each block of a layer norm's gain (`dst`) and offset (`beta`) scaled by one factor
/// per block so that together they have norm `sqrt(block)`: the offset first, then the
/// gain from the offset's new values (one op cannot write two tensors).
pub(crate) struct JointToNorm {
    pub block: usize,
    /// Which of the two this call writes: the offset (`true`), then the gain.
    pub offset: bool,
}

impl InplaceOp2 for JointToNorm {
    fn name(&self) -> &'static str {
        "joint-to-norm"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        l: &Layout,
        other: &CpuStorage,
        lo: &Layout,
    ) -> Result<()> {
        let n = self.block.max(1);
        let target = (n as f64).sqrt();
        let other = values(other, lo)?;
        for (d, o) in values_mut(dst, l)?
            .chunks_exact_mut(n)
            .zip(other.chunks_exact(n))
        {
            let (sd, so) = (f64::from(norm(d)).powi(2), f64::from(norm(o)).powi(2));
            let factor = match self.offset {
                // The offset `d`, with the gain `o`: the joint factor.
                true => target / (sd + so).sqrt().max(f64::from(NORM_FLOOR)),
                // The gain `d`, with the offset `o` already scaled by that factor `f`:
                // `f^2 (|g|^2 + |b|^2) = n` and `|o|^2 = f^2 |b|^2` give `f`.
                false => ((target * target - so).max(0.0) / sd.max(f64::from(NORM_FLOOR))).sqrt(),
            };
            d.iter_mut()
                .for_each(|x| *x = (f64::from(*x) * factor) as f32);
        }
        Ok(())
    }
}
