//! Aggregate statistics for deep-RL comparisons as recommended by rliable (Agarwal et
//! al., NeurIPS 2021): interquartile mean, stratified bootstrap confidence intervals,
//! probability of improvement, performance profiles.
//!
//! ```
//! use normrl::report::stats::iqm;
//! // The middle half of 1..=8 is 3, 4, 5, 6.
//! assert_eq!(iqm(&[8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]), 4.5);
//! ```

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Interquartile mean: the mean of the values left after discarding the lowest and
/// highest `floor(n / 4)` (scipy's `trim_mean(x, 0.25)`, which rliable uses).
pub fn iqm(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let cut = v.len() / 4;
    let kept = &v[cut..v.len() - cut];
    kept.iter().sum::<f64>() / kept.len() as f64
}

pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// IQM over all runs of all tasks together.
pub fn aggregate_iqm(tasks: &[Vec<f64>]) -> f64 {
    iqm(&tasks.concat())
}

/// rliable's aggregate median: the median over tasks of each task's mean score.
pub fn aggregate_median(tasks: &[Vec<f64>]) -> f64 {
    let mut means: Vec<f64> = tasks.iter().map(|t| mean(t)).collect();
    if means.is_empty() {
        return f64::NAN;
    }
    means.sort_by(f64::total_cmp);
    let n = means.len();
    match n % 2 {
        1 => means[n / 2],
        _ => (means[n / 2 - 1] + means[n / 2]) / 2.0,
    }
}

/// rliable's aggregate mean: the mean over tasks of each task's mean score.
pub fn aggregate_mean(tasks: &[Vec<f64>]) -> f64 {
    mean(&tasks.iter().map(|t| mean(t)).collect::<Vec<_>>())
}

/// rliable's optimality gap: how far runs fall short of a normalized score of 1 on
/// average (scores above 1 count as 1), all runs together; lower is better.
pub fn optimality_gap(tasks: &[Vec<f64>]) -> f64 {
    let all = tasks.concat();
    1.0 - mean(&all.iter().map(|s| s.min(1.0)).collect::<Vec<_>>())
}

/// `stat(x, y)` of two independent samples of tasks, with a stratified-bootstrap
/// interval: every task of `x` and of `y` is a stratum, resampled on its own.
pub fn paired_ci(
    x: &[Vec<f64>],
    y: &[Vec<f64>],
    stat: impl Fn(&[Vec<f64>], &[Vec<f64>]) -> f64,
    reps: usize,
    salt: u64,
) -> (f64, (f64, f64)) {
    let both: Vec<Vec<f64>> = x.iter().chain(y).cloned().collect();
    let n = x.len();
    let split = |t: &[Vec<f64>]| stat(&t[..n], &t[n..]);
    (
        split(&both),
        stratified_bootstrap_ci(&both, split, reps, 0.95, salt),
    )
}

/// A percentile confidence interval of `stat` by the stratified bootstrap: runs are
/// resampled with replacement within each task (stratum), `reps` times.
///
/// The resampling is seeded by the data and `salt` (which statistic is asked), never by
/// where the data sits in a report: the same runs get the same interval in every row,
/// report and order, and adding or leaving out a method moves no other's interval.
pub fn stratified_bootstrap_ci(
    tasks: &[Vec<f64>],
    stat: impl Fn(&[Vec<f64>]) -> f64,
    reps: usize,
    confidence: f64,
    salt: u64,
) -> (f64, f64) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(data_seed(tasks, salt));
    let mut resampled: Vec<Vec<f64>> = tasks.iter().map(|t| vec![0.0; t.len()]).collect();
    let mut stats = Vec::with_capacity(reps);
    for _ in 0..reps {
        for (task, sample) in tasks.iter().zip(resampled.iter_mut()) {
            for s in sample.iter_mut() {
                *s = task[rng.random_range(0..task.len())];
            }
        }
        stats.push(stat(&resampled));
    }
    stats.sort_by(f64::total_cmp);
    let lo = ((1.0 - confidence) / 2.0 * reps as f64).floor() as usize;
    let hi = (((1.0 + confidence) / 2.0 * reps as f64).ceil() as usize).min(reps) - 1;
    (stats[lo.min(reps - 1)], stats[hi])
}

/// A seed from `salt` and every task's values, in order (FNV-1a over their bits and
/// the tasks' lengths, so that [1], [2] and [1, 2] differ).
fn data_seed(tasks: &[Vec<f64>], salt: u64) -> u64 {
    let words = tasks
        .iter()
        .flat_map(|t| std::iter::once(t.len() as u64).chain(t.iter().map(|v| v.to_bits())));
    fnv1a(
        std::iter::once(salt)
            .chain(words)
            .flat_map(u64::to_le_bytes),
    )
}

/// FNV-1a of `bytes`: stable across builds and platforms, unlike std's hasher (a
/// method's color and a bootstrap's seed must not change with the build).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Probability that a run of X scores higher than a run of Y (ties count half),
/// averaged over tasks: rliable's probability of improvement.
pub fn probability_of_improvement(x: &[Vec<f64>], y: &[Vec<f64>]) -> f64 {
    let per_task: Vec<f64> = x
        .iter()
        .zip(y)
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .map(|(a, b)| {
            let mut wins = 0.0;
            for &xa in a {
                for &yb in b {
                    wins += if xa > yb {
                        1.0
                    } else if xa == yb {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
            wins / (a.len() * b.len()) as f64
        })
        .collect();
    mean(&per_task)
}

/// Fraction of runs (all tasks together) whose score exceeds each threshold `tau`.
pub fn performance_profile(tasks: &[Vec<f64>], taus: &[f64]) -> Vec<f64> {
    let all = tasks.concat();
    taus.iter()
        .map(|&tau| all.iter().filter(|&&s| s > tau).count() as f64 / all.len().max(1) as f64)
        .collect()
}

/// `(score - random) / (reference - random)`.
pub fn normalize(score: f64, random: f64, reference: f64) -> f64 {
    let span = reference - random;
    if span.abs() < 1e-12 {
        0.0
    } else {
        (score - random) / span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iqm_matches_scipy_trim_mean() {
        // scipy.stats.trim_mean([1..10], 0.25) cuts 2 from each end: mean(3..8) = 5.5.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(iqm(&v), 5.5);
        // Outliers do not move it.
        assert_eq!(iqm(&[1.0, 2.0, 3.0, 1000.0]), 2.5);
        assert_eq!(iqm(&[7.0]), 7.0);
    }

    #[test]
    fn probability_of_improvement_by_hand() {
        // Task 1: x = [1, 3], y = [2]: P = 0.5. Task 2: x = [5], y = [5, 4]: (0.5 + 1) / 2.
        let p =
            probability_of_improvement(&[vec![1.0, 3.0], vec![5.0]], &[vec![2.0], vec![5.0, 4.0]]);
        assert!((p - (0.5 + 0.75) / 2.0).abs() < 1e-12);
        let same = vec![vec![1.0, 2.0, 3.0]];
        assert_eq!(probability_of_improvement(&same, &same), 0.5);
    }

    #[test]
    fn bootstrap_interval_covers_known_mean_at_nominal_rate() {
        // 200 synthetic experiments of 3 tasks x 10 runs from N(mu, 1): the 95%
        // interval of the mean should contain mu about 95% of the time.
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let mut covered = 0;
        let trials = 200;
        for t in 0..trials {
            let tasks: Vec<Vec<f64>> = (0..3)
                .map(|_| {
                    (0..10)
                        .map(|_| {
                            let z: f64 = rand_distr::Distribution::sample(
                                &rand_distr::StandardNormal,
                                &mut rng,
                            );
                            2.0 + z
                        })
                        .collect()
                })
                .collect();
            let (lo, hi) = stratified_bootstrap_ci(&tasks, |t| mean(&t.concat()), 500, 0.95, t);
            if lo <= 2.0 && 2.0 <= hi {
                covered += 1;
            }
        }
        let rate = covered as f64 / trials as f64;
        assert!((0.88..=0.99).contains(&rate), "coverage {rate}");
    }

    /// Seeded by the data: the same tasks, the same interval; another salt or other
    /// data (a value moved to another task), another resampling.
    #[test]
    fn a_bootstrap_is_seeded_by_its_data_and_salt() {
        let tasks = vec![vec![1.0, 4.0, 2.0, 8.0, 5.0], vec![3.0, 7.0, 0.5]];
        let ci = |t: &[Vec<f64>], salt| stratified_bootstrap_ci(t, aggregate_iqm, 50, 0.95, salt);
        assert_eq!(ci(&tasks, 1), ci(&tasks.clone(), 1));
        assert_ne!(ci(&tasks, 1), ci(&tasks, 2));
        assert_ne!(data_seed(&tasks, 1), data_seed(&tasks, 2));
        let moved = vec![vec![1.0, 4.0, 2.0, 8.0], vec![5.0, 3.0, 7.0, 0.5]];
        assert_ne!(data_seed(&tasks, 1), data_seed(&moved, 1));
    }

    #[test]
    fn performance_profile_counts_runs_above_threshold() {
        let p = performance_profile(&[vec![0.1, 0.5], vec![0.9, 1.2]], &[0.0, 0.5, 1.0]);
        assert_eq!(p, vec![1.0, 0.5, 0.25]);
    }
}
