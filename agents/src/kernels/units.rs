//! How a per-unit op walks a contiguous tensor: the units (features or channels) on
//! dim 1, a batch before them and any spatial positions after.

use candle_core::{Result, Shape};

use super::dense::lane_sum;

/// How a contiguous tensor's values group around dim 1 (the units: features or
/// channels): `outer` blocks, each of `units` runs of `inner` values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Units {
    pub outer: usize,
    pub units: usize,
    pub inner: usize,
}

impl Units {
    pub(crate) fn of(shape: &Shape) -> Result<Self> {
        let dims = shape.dims();
        if dims.len() < 2 {
            candle_core::bail!("per-unit ops need a batch and a unit dimension, got {dims:?}");
        }
        Ok(Self {
            outer: dims[0],
            units: dims[1],
            inner: dims[2..].iter().product(),
        })
    }

    /// Values per unit.
    pub(crate) fn per_unit(&self) -> usize {
        self.outer * self.inner
    }

    /// Calls `f(unit, run)` for each run of one unit's indices, in memory order.
    #[inline(always)]
    pub(crate) fn runs(&self, mut f: impl FnMut(usize, std::ops::Range<usize>)) {
        for o in 0..self.outer {
            for u in 0..self.units {
                let start = (o * self.units + u) * self.inner;
                f(u, start..start + self.inner);
            }
        }
    }

    /// `x` and `y` cut to this layout's values and `per_unit` to its units (which also
    /// checks, once, that they hold that many).
    #[inline(always)]
    fn views<'a, P>(
        &self,
        x: &'a [f32],
        y: &'a [f32],
        per_unit: &'a [P],
    ) -> (&'a [f32], &'a [f32], &'a [P]) {
        let len = self.outer * self.units * self.inner;
        (&x[..len], &y[..len], &per_unit[..self.units])
    }

    /// `f(x, per_unit[u])` for every value `x` (of unit `u`), in memory order.
    #[inline]
    pub(crate) fn map<P: Copy>(
        &self,
        x: &[f32],
        per_unit: &[P],
        f: impl Fn(f32, P) -> f32,
    ) -> Vec<f32> {
        self.map2(x, x, per_unit, |x, _, p| f(x, p))
    }

    /// `f(x, y, per_unit[u])` for every pair of values of `x` and `y` (of unit `u`).
    #[inline]
    pub(crate) fn map2<P: Copy>(
        &self,
        x: &[f32],
        y: &[f32],
        per_unit: &[P],
        f: impl Fn(f32, f32, P) -> f32,
    ) -> Vec<f32> {
        let (x, y, per_unit) = self.views(x, y, per_unit);
        let units = self.units;
        let mut out = Vec::with_capacity(x.len());
        if self.inner == 1 {
            // Runs of one value: a whole row of units at a time.
            for (xs, ys) in x.chunks_exact(units).zip(y.chunks_exact(units)) {
                out.extend(
                    xs.iter()
                        .zip(ys)
                        .zip(per_unit)
                        .map(|((&x, &y), &p)| f(x, y, p)),
                );
            }
        } else {
            self.runs(|u, run| {
                let p = per_unit[u];
                let (xs, ys) = (&x[run.clone()], &y[run]);
                out.extend(xs.iter().zip(ys).map(|(&x, &y)| f(x, y, p)));
            });
        }
        out
    }

    /// Per-unit sums of `f(x, y, per_unit[u])` over the values of `x` and `y`.
    #[inline]
    pub(crate) fn sums2<P: Copy>(
        &self,
        x: &[f32],
        y: &[f32],
        per_unit: &[P],
        f: impl Fn(f32, f32, P) -> f32,
    ) -> Vec<f32> {
        let (x, y, per_unit) = self.views(x, y, per_unit);
        let units = self.units;
        let mut sums = vec![0f32; units];
        if self.inner == 1 {
            for (xs, ys) in x.chunks_exact(units).zip(y.chunks_exact(units)) {
                for (((s, &x), &y), &p) in sums.iter_mut().zip(xs).zip(ys).zip(per_unit) {
                    *s += f(x, y, p);
                }
            }
        } else {
            self.runs(|u, run| {
                let p = per_unit[u];
                let (xs, ys) = (&x[run.clone()], &y[run]);
                sums[u] += lane_sum(xs, ys, |x, y| f(x, y, p));
            });
        }
        sums
    }

    /// Per-unit sums of the values of `x`.
    #[inline]
    pub(crate) fn sums(&self, x: &[f32]) -> Vec<f32> {
        self.sums2(x, x, &vec![(); self.units], |x, _, _| x)
    }
}
