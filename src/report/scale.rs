//! The value axis of a figure of curves: linear, or symmetric-log where a few runs
//! reach values thousands of times the others'. The study's first-batch weight-norm
//! runs start at a parameter norm of 1.4e7 (the others' 50-150) and overestimate Q by
//! 4.6e11; on a shared linear axis every other method lies flat on zero. Symmetric-log
//! is linear within `±c` and logarithmic beyond, so that signed quantities (Q
//! overestimation) keep their sign and zero.

/// How a figure maps values onto its y axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum YScale {
    Linear,
    /// Linear within `±c` (a power of ten), a decade per unit beyond.
    SymLog {
        c: f64,
    },
}

/// A spread of this many times the typical magnitude makes the axis symmetric-log.
const WIDE: f64 = 1_000.0;
/// Ticks on a symmetric-log axis: at most about this many, whole decades apart.
const MAX_TICKS: usize = 7;

impl YScale {
    /// Linear unless the largest magnitude of `values` is over [`WIDE`] times their
    /// median magnitude; then symmetric-log, linear up to the median's decade.
    pub fn of(values: impl Iterator<Item = f64>) -> Self {
        let mut magnitudes: Vec<f64> = values
            .filter(|v| v.is_finite() && *v != 0.0)
            .map(f64::abs)
            .collect();
        if magnitudes.is_empty() {
            return YScale::Linear;
        }
        magnitudes.sort_by(f64::total_cmp);
        let typical = magnitudes[magnitudes.len() / 2];
        let largest = magnitudes[magnitudes.len() - 1];
        match largest > WIDE * typical {
            true => YScale::SymLog {
                c: 10f64.powf(typical.log10().floor()),
            },
            false => YScale::Linear,
        }
    }

    /// Where `v` lies on the axis.
    pub fn axis(self, v: f64) -> f64 {
        match self {
            YScale::Linear => v,
            YScale::SymLog { c } if v.abs() <= c => v / c,
            YScale::SymLog { c } => v.signum() * (1.0 + (v.abs() / c).log10()),
        }
    }

    /// A symmetric-log axis's ticks between axis positions `low` and `high`, as
    /// `(position, value)`: zero, `±c` and whole decades beyond, every so many decades
    /// so that there are at most about [`MAX_TICKS`]. None for a linear axis, whose
    /// ticks the plotting library places.
    pub fn ticks(self, (low, high): (f64, f64)) -> Vec<(f64, f64)> {
        let YScale::SymLog { c } = self else {
            return vec![];
        };
        // Decade k >= 0 is the value c 10^k at position 1 + k, on either side.
        let decades = |end: f64| (end.abs() - 1.0).max(0.0).floor() as i32;
        let (below, above) = (decades(low.min(0.0)), decades(high.max(0.0)));
        let count = (below + above + 3) as usize;
        let every = count.div_ceil(MAX_TICKS).max(1) as i32;
        let mut ticks = vec![(0.0, 0.0)];
        for k in (0..=above).filter(|k| k % every == 0) {
            ticks.push((1.0 + f64::from(k), c * 10f64.powi(k)));
        }
        for k in (0..=below).filter(|k| k % every == 0) {
            ticks.push((-1.0 - f64::from(k), -c * 10f64.powi(k)));
        }
        ticks.retain(|(at, _)| (low..=high).contains(at));
        ticks.sort_by(|a, b| a.0.total_cmp(&b.0));
        ticks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_of_three_decades_over_the_median_is_symmetric_log() {
        // The study's parameter norms: six methods near 100, one near 1.4e7.
        let norms = [53.0, 80.0, 120.0, 95.0, 150.0, 70.0, 1.4e7];
        assert_eq!(YScale::of(norms.into_iter()), YScale::SymLog { c: 10.0 });
        // Returns from 0 to 30: linear.
        let returns = [0.0, 0.4, 3.2, 12.0, 29.8];
        assert_eq!(YScale::of(returns.into_iter()), YScale::Linear);
        assert_eq!(YScale::of(std::iter::empty()), YScale::Linear);
    }

    #[test]
    fn symmetric_log_is_linear_within_c_and_a_decade_a_unit_beyond() {
        let s = YScale::SymLog { c: 10.0 };
        assert_eq!(s.axis(5.0), 0.5);
        assert_eq!(s.axis(-10.0), -1.0);
        assert!((s.axis(1_000.0) - 3.0).abs() < 1e-12);
        assert!((s.axis(-1e7) + 7.0).abs() < 1e-12);
        assert_eq!(YScale::Linear.axis(-3.5), -3.5);
        // Monotone across the joint.
        let xs = [-1e5, -11.0, -9.0, 0.0, 9.0, 11.0, 1e5];
        assert!(xs.windows(2).all(|w| s.axis(w[0]) < s.axis(w[1])));
    }

    #[test]
    fn ticks_are_zero_and_whole_decades_thinned_to_a_handful() {
        let s = YScale::SymLog { c: 10.0 };
        // 10 to 1e7 above zero: 0, 10, 100, ..., 10M, eight ticks; thinned to every
        // second decade.
        let values: Vec<f64> = s.ticks((-0.2, 7.1)).iter().map(|t| t.1).collect();
        assert_eq!(values, [0.0, 10.0, 1e3, 1e5, 1e7]);
        // Both signs, few decades: all of them.
        let values: Vec<f64> = s.ticks((-2.5, 2.5)).iter().map(|t| t.1).collect();
        assert_eq!(values, [-100.0, -10.0, 0.0, 10.0, 100.0]);
        for (at, v) in s.ticks((-2.5, 2.5)) {
            assert!((s.axis(v) - at).abs() < 1e-12);
        }
        assert!(YScale::Linear.ticks((0.0, 1.0)).is_empty());
    }
}
