//! One-pass loops over the rows of a feature layer's output (`[B, units]`, row-major),
//! for the host path of MLPs: a per-unit center (batch norm's mean), scale (weight
//! norm's `g/||v||`, batch norm's `gamma/std`), bias and ReLU forward, and everything the
//! backward needs below them in one pass back. Separate
//! passes (scale, bias, ReLU mask, bias sums, gain sums) cost more than the arithmetic
//! in them on a layer of a few thousand values.
//!
//! ```text
//! forward:   y = relu(s_u t + b_u)      (batch norm: relu((t - mean_u) s_u + beta_u))
//! backward:  d = dy where y > 0 (else 0),  db_u = Σ d,  Σ_u d t (for dL/dg),  dt = s_u d
//! ```
//!
//! The products are rounded as the graph's separate ops round them (`s t`, then `+ b`),
//! so both paths give the same values. Missing parts are 0 or 1, which changes no value.

use std::mem::MaybeUninit;

/// Which per-unit parts a layer's output has: `relu((t - center_u) * scale_u + bias_u)`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Affine<'a> {
    pub center: Option<&'a [f32]>,
    pub scale: Option<&'a [f32]>,
    pub bias: Option<&'a [f32]>,
    pub relu: bool,
}

/// The feature passes go down whole rows of `units` values; anything else is a bug of
/// the caller's.
#[inline]
fn assert_whole_rows(len: usize, units: usize) {
    assert!(
        units > 0 && len.is_multiple_of(units),
        "feature pass: {len} values are not whole rows of {units} units"
    );
}

/// `relu((t - c_u) * s_u + b_u)` for every value of `t` (`[B, units]`), each part only
/// where the layer has it, block by block of units ([`BLOCK`]) down the rows.
pub(crate) fn affine_features(t: &[f32], units: usize, affine: Affine<'_>) -> Vec<f32> {
    let mut out = Vec::new();
    affine_features_into(t, units, affine, &mut out);
    out
}

crate::kernels::avx2::dispatch! {
    /// [`affine_features`] appended to `out` (a population appends each agent's).
    pub(crate) fn affine_features_into(t: &[f32], units: usize, affine: Affine<'_>, out: &mut Vec<f32>) {
        // Checked before the length is set below: a partial row would leave values
        // unwritten.
        assert_whole_rows(t.len(), units);
        let at = out.len();
        out.reserve(t.len());
        let spare = &mut out.spare_capacity_mut()[..t.len()];
        // Loops, not a closure: that would compile outside the AVX2 copy.
        let full = units / BLOCK * BLOCK;
        for start in (0..full).step_by(BLOCK) {
            affine_block::<BLOCK>(t, spare, units, affine, start);
        }
        for start in full..units {
            affine_block::<1>(t, spare, units, affine, start);
        }
        // SAFETY: the blocks cover every unit of every row, so all `t.len()` values
        // after `at` were written. (Zeroing the buffer first cost a third of the pass.)
        unsafe { out.set_len(at + t.len()) };
    }
}

crate::kernels::avx2::dispatch! {
    /// [`affine_features`] in place, where the kernel's output is not kept: no buffer to
    /// allocate.
    pub(crate) fn affine_in_place(t: &mut [f32], units: usize, affine: Affine<'_>) {
        assert_whole_rows(t.len(), units);
        let full = units / BLOCK * BLOCK;
        for start in (0..full).step_by(BLOCK) {
            affine_block_in_place::<BLOCK>(t, units, affine, start);
        }
        for start in full..units {
            affine_block_in_place::<1>(t, units, affine, start);
        }
    }
}

/// The parts of units `start..start + W`. A missing part is 0 (center, bias) or 1
/// (scale): subtracting 0, multiplying by 1 and adding 0 are exact (but for the sign of
/// a zero), so one loop serves every layer.
#[inline(always)]
fn affine_parts<const W: usize>(affine: Affine<'_>, start: usize) -> [[f32; W]; 3] {
    let part = |values: Option<&[f32]>, missing| values.map_or([missing; W], |v| block(v, start));
    [
        part(affine.center, 0.0),
        part(affine.scale, 1.0),
        part(affine.bias, 0.0),
    ]
}

#[inline(always)]
fn affine_value(t: f32, [c, s, b]: [f32; 3], relu: bool) -> f32 {
    let y = (t - c) * s + b;
    if relu {
        y.max(0.0)
    } else {
        y
    }
}

/// Units `start..start + W` of [`affine_features`].
#[inline(always)]
fn affine_block<const W: usize>(
    t: &[f32],
    out: &mut [MaybeUninit<f32>],
    units: usize,
    affine: Affine<'_>,
    start: usize,
) {
    let [c, s, b] = affine_parts::<W>(affine, start);
    for (t, out) in t.chunks_exact(units).zip(out.chunks_exact_mut(units)) {
        let t: [f32; W] = block(t, start);
        let out = &mut out[start..start + W];
        for j in 0..W {
            out[j].write(affine_value(t[j], [c[j], s[j], b[j]], affine.relu));
        }
    }
}

/// Units `start..start + W` of [`affine_in_place`].
#[inline(always)]
fn affine_block_in_place<const W: usize>(
    t: &mut [f32],
    units: usize,
    affine: Affine<'_>,
    start: usize,
) {
    let [c, s, b] = affine_parts::<W>(affine, start);
    for row in t.chunks_exact_mut(units) {
        let t = &mut row[start..start + W];
        for j in 0..W {
            t[j] = affine_value(t[j], [c[j], s[j], b[j]], affine.relu);
        }
    }
}

/// The per-unit sums [`output_gradient`] returns.
pub(crate) struct UnitSums {
    /// `Σ d` per unit: the bias's gradient.
    pub d: Vec<f32>,
    /// `Σ d t` per unit with a scale (weight norm), else empty.
    pub d_t: Vec<f32>,
}

/// The layer's saved values that [`output_gradient`] reads.
pub(crate) struct SavedOutput<'a> {
    /// The layer's output, read where it ends in a ReLU.
    pub y: Option<&'a [f32]>,
    /// The kernel's output `t` and the scale `s` applied to it.
    pub scaled: Option<(&'a [f32], &'a [f32])>,
}

crate::kernels::avx2::dispatch! {
    /// The gradient below `relu(s t + b)`: turns the output gradient `dy` into the
    /// kernel output's, in place and in one pass, and returns the per-unit sums.
    pub(crate) fn output_gradient(dy: &mut [f32], units: usize, saved: SavedOutput<'_>) -> UnitSums {
        let none: &[f32] = &[];
        match (saved.y, saved.scaled) {
            (Some(y), Some((t, s))) => gradient_rows::<true, true>(dy, units, y, t, s),
            (Some(y), None) => gradient_rows::<true, false>(dy, units, y, none, none),
            (None, Some((t, s))) => gradient_rows::<false, true>(dy, units, none, t, s),
            (None, None) => gradient_rows::<false, false>(dy, units, none, none, none),
        }
    }
}

/// Units per block: the loops go down all the rows of one block of units, so that its
/// per-unit sums and factors stay in registers; row by row, every value also loaded and
/// stored a running sum. Sixteen is two AVX2 vectors, two running sums that pipeline
/// (with eight, each row waited on the one addition before it).
pub(crate) const BLOCK: usize = 16;

/// [`output_gradient`] for one combination of ReLU and scale, fixed at compile time so
/// that each loop has no branch but the mask (inlined into the AVX2 copy).
#[inline(always)]
fn gradient_rows<const RELU: bool, const SCALED: bool>(
    dy: &mut [f32],
    units: usize,
    y: &[f32],
    t: &[f32],
    s: &[f32],
) -> UnitSums {
    let mut sums = UnitSums {
        d: vec![0f32; units],
        d_t: vec![0f32; if SCALED { units } else { 0 }],
    };
    let full = units / BLOCK * BLOCK;
    for start in (0..full).step_by(BLOCK) {
        gradient_block::<RELU, SCALED, BLOCK>(dy, units, start, y, t, s, &mut sums);
    }
    for start in full..units {
        gradient_block::<RELU, SCALED, 1>(dy, units, start, y, t, s, &mut sums);
    }
    sums
}

/// Units `start..start + W` of [`gradient_rows`], down all the rows.
#[inline(always)]
fn gradient_block<const RELU: bool, const SCALED: bool, const W: usize>(
    dy: &mut [f32],
    units: usize,
    start: usize,
    y: &[f32],
    t: &[f32],
    s: &[f32],
    sums: &mut UnitSums,
) {
    let (mut d_sum, mut t_sum) = ([0f32; W], [0f32; W]);
    let scale: [f32; W] = if SCALED { block(s, start) } else { [1.0; W] };
    for (r, dy) in dy.chunks_exact_mut(units).enumerate() {
        let at = r * units + start;
        let dy: &mut [f32; W] = (&mut dy[start..start + W]).try_into().expect("block");
        let y: [f32; W] = if RELU { block(y, at) } else { [1.0; W] };
        let t: [f32; W] = if SCALED { block(t, at) } else { [0.0; W] };
        for j in 0..W {
            // Loaded before the choice: a load inside the branch became a masked load.
            let (g, keep) = (dy[j], !RELU || y[j] > 0.0);
            let d = if keep { g } else { 0.0 };
            d_sum[j] += d;
            if SCALED {
                t_sum[j] += d * t[j];
                dy[j] = d * scale[j];
            } else {
                // `+ 0.0` (not an identity: -0 becomes +0) keeps the store whole. Storing
                // `d` itself became a masked store of the zeros, which is slow on AMD.
                dy[j] = d + 0.0;
            }
        }
    }
    sums.d[start..start + W].copy_from_slice(&d_sum);
    if SCALED {
        sums.d_t[start..start + W].copy_from_slice(&t_sum);
    }
}

/// `values[at..at + W]` as an array.
#[inline(always)]
pub(crate) fn block<const W: usize>(values: &[f32], at: usize) -> [f32; W] {
    values[at..at + W].try_into().expect("block of W values")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-1, 1), about a third of them below 0 after a shift.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// 19 units: one whole block of [`BLOCK`] and three single units.
    const UNITS: usize = BLOCK + 3;
    const ROWS: usize = 5;

    #[test]
    #[should_panic(expected = "not whole rows")]
    fn a_partial_row_is_refused_before_any_value_is_written() {
        affine_features(&values(2 * UNITS + 1, 1), UNITS, Affine::default());
    }

    #[test]
    fn affine_matches_its_definition_value_for_value() {
        let t = values(ROWS * UNITS, 1);
        let (c, s, b) = (values(UNITS, 2), values(UNITS, 3), values(UNITS, 4));
        for relu in [false, true] {
            let all = Affine {
                center: Some(&c),
                scale: Some(&s),
                bias: Some(&b),
                relu,
            };
            let out = affine_features(&t, UNITS, all);
            let plain = affine_features(
                &t,
                UNITS,
                Affine {
                    relu,
                    ..Default::default()
                },
            );
            for (i, t) in t.iter().enumerate() {
                let u = i % UNITS;
                let y = (t - c[u]) * s[u] + b[u];
                assert_eq!(out[i], if relu { y.max(0.0) } else { y }, "value {i}");
                assert_eq!(plain[i], if relu { t.max(0.0) } else { *t }, "value {i}");
            }
        }
    }

    #[test]
    fn output_gradient_matches_its_definition_value_for_value() {
        let (dy, y, t, s) = (
            values(ROWS * UNITS, 5),
            values(ROWS * UNITS, 6),
            values(ROWS * UNITS, 7),
            values(UNITS, 8),
        );
        for relu in [false, true] {
            for scaled in [false, true] {
                let mut dt = dy.clone();
                let saved = SavedOutput {
                    y: relu.then_some(&y[..]),
                    scaled: scaled.then_some((&t[..], &s[..])),
                };
                let sums = output_gradient(&mut dt, UNITS, saved);
                let (mut d_sums, mut t_sums) = (vec![0f32; UNITS], vec![0f32; UNITS]);
                for i in 0..dy.len() {
                    let u = i % UNITS;
                    let d = if relu && y[i] <= 0.0 { 0.0 } else { dy[i] };
                    d_sums[u] += d;
                    t_sums[u] += d * t[i];
                    let want = if scaled { d * s[u] } else { d };
                    assert_eq!(dt[i], want, "relu {relu} scaled {scaled} value {i}");
                }
                assert_eq!(sums.d, d_sums);
                assert_eq!(sums.d_t, if scaled { t_sums } else { vec![] });
            }
        }
    }
}
