//! A dense layer's forward `y = x W^T` for a batch of 2 to 4 rows with AVX-512: each
//! output's weights read once, against every row.
//!
//! Why not gemm: gemm's column-major microkernel puts the batch along its 16 lanes, so
//! at 2-4 rows three quarters of every multiply-add is idle, and a row-major
//! destination instead packs all of `W` at every call. The study's batch 4 spends a
//! quarter of its update in the two forwards of the MinAtar network's 1600 x 128 layer
//! (`docs/performance.md`, "Few rows"). Here two outputs go together, so 2 x rows
//! independent sums (up to 8) keep both FMA units busy, and `W` streams from the cache
//! once. Only where gemm itself takes AVX-512 (`dense::product_kernels`), so that a
//! CPU's products keep one family; elsewhere, and for other batch sizes, gemm.
//!
//! Each output sums its 16 lanes' partial sums in one fixed order, then the inputs
//! beyond the last whole 16 in order: the same on every AVX-512 CPU, run after run.
//!
//! Not at one row: gemm's one-row path reads `W` about as fast as the cache gives it
//! (this kernel, eight outputs at a time, left a batch-1 update at 124 us and the
//! study's setting at batch 1 within noise, 25.9-26.0k frames/s against 24.6-25.7k).

/// The rows this kernel serves.
const ROWS: std::ops::RangeInclusive<usize> = 2..=4;

/// Whether this kernel computes the product of `rows` rows of `n_in` inputs here.
pub(crate) fn serves(rows: usize, n_in: usize) -> bool {
    ROWS.contains(&rows) && n_in >= 16 && super::dense::product_kernels() == "avx512"
}

/// `y [rows, n_out] = x [rows, n_in] W^T` (`w` `[n_out, n_in]`, all row-major), or
/// `None` where this kernel does not serve (see the module's doc).
pub(crate) fn forward(
    x: &[f32],
    w: &[f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) -> Option<Vec<f32>> {
    if !serves(rows, n_in) || n_out == 0 {
        return None;
    }
    assert!(
        x.len() >= rows * n_in && w.len() >= n_out * n_in,
        "few-rows product out of bounds"
    );
    let mut y = vec![0f32; rows * n_out];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F (`product_kernels`), and the slices hold the values
    // the loops read and write, checked just above.
    unsafe {
        match rows {
            2 => avx512::forward::<2, 2>(x, w, (n_in, n_out), &mut y),
            3 => avx512::forward::<3, 2>(x, w, (n_in, n_out), &mut y),
            _ => avx512::forward::<4, 2>(x, w, (n_in, n_out), &mut y),
        }
    }
    Some(y)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::forward`] for `M` rows, `J` outputs at a time (`M J` independent sums:
    /// at least 8 keep both FMA units busy through their latency).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `x` holds `M * n_in` values, `w` `n_out * n_in`, `y`
    /// `M * n_out`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn forward<const M: usize, const J: usize>(
        x: &[f32],
        w: &[f32],
        (n_in, n_out): (usize, usize),
        y: &mut [f32],
    ) {
        let mut j = 0;
        while j < n_out {
            let outs = outputs::<M, J>(x, w, n_in, j);
            // Past the last output the loads repeat it; those sums are dropped.
            for (i, out) in outs.iter().enumerate().take(n_out - j) {
                for (r, &v) in out.iter().enumerate() {
                    y[r * n_out + j + i] = v;
                }
            }
            j += J;
        }
    }

    /// Outputs `j` to `j + J - 1` (the last output again past the end) of each of the
    /// `M` rows.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn outputs<const M: usize, const J: usize>(
        x: &[f32],
        w: &[f32],
        n_in: usize,
        j: usize,
    ) -> [[f32; M]; J] {
        let n_out = w.len() / n_in;
        let mut rows = [w.as_ptr(); J];
        for (i, row) in rows.iter_mut().enumerate() {
            *row = w.as_ptr().add((j + i).min(n_out - 1) * n_in);
        }
        // Row `r`'s sums for the `J` outputs.
        let mut acc = [[_mm512_setzero_ps(); J]; M];
        let whole = n_in / 16 * 16;
        let mut k = 0;
        while k < whole {
            let mut wk = [_mm512_setzero_ps(); J];
            for (v, row) in wk.iter_mut().zip(&rows) {
                *v = _mm512_loadu_ps(row.add(k));
            }
            for (r, sums) in acc.iter_mut().enumerate() {
                let xr = _mm512_loadu_ps(x.as_ptr().add(r * n_in + k));
                for (sum, v) in sums.iter_mut().zip(&wk) {
                    *sum = _mm512_fmadd_ps(xr, *v, *sum);
                }
            }
            k += 16;
        }
        let mut out = [[0f32; M]; J];
        for (r, sums) in acc.iter().enumerate() {
            for (o, (sum, row)) in out.iter_mut().zip(sums.iter().zip(&rows)) {
                let mut s = _mm512_reduce_add_ps(*sum);
                for i in whole..n_in {
                    s += x[r * n_in + i] * *row.add(i);
                }
                o[r] = s;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a sum in `f64`, for 2, 3 and 4 rows, an odd number of outputs and inputs
    /// that are not a whole number of 16s: within `f32` rounding of the sums; and run
    /// twice, the same bits.
    #[test]
    fn few_rows_equal_the_sums() {
        let (n_in, n_out) = (1600 + 7, 129);
        let value = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let w: Vec<f32> = (0..n_in * n_out).map(value).collect();
        for rows in 2..=4 {
            let x: Vec<f32> = (0..rows * n_in).map(|i| value(i * 31 + 3)).collect();
            let Some(y) = forward(&x, &w, rows, n_in, n_out) else {
                assert_ne!(super::super::dense::product_kernels(), "avx512");
                eprintln!("no AVX-512 here: the few-rows kernel serves nothing");
                return;
            };
            assert_eq!(Some(y.clone()), forward(&x, &w, rows, n_in, n_out));
            for r in 0..rows {
                for j in 0..n_out {
                    let exact: f64 = (0..n_in)
                        .map(|i| f64::from(x[r * n_in + i]) * f64::from(w[j * n_in + i]))
                        .sum();
                    let scale: f64 = (0..n_in)
                        .map(|i| f64::from(x[r * n_in + i] * w[j * n_in + i]).abs())
                        .sum();
                    let got = f64::from(y[r * n_out + j]);
                    let close = (got - exact).abs() <= 1e-6 * scale;
                    assert!(close, "row {r} output {j}: {got} against {exact}");
                }
            }
        }
        assert!(
            forward(&[0.0; 1600], &w, 1, 1600, 1).is_none(),
            "one row stays gemm's"
        );
    }
}
