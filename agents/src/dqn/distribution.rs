//! The value as a distribution, on host values: C51's fixed atoms and its projection of
//! a shifted target distribution onto them ([`Atoms`]), HL-Gauss's histogram of a
//! scalar target over fixed bins ([`Bins`]), and the running return scale that SimbaV2
//! and XQC divide rewards by ([`ReturnScale`]); and in tensor ops, a distributional
//! head's Q-values ([`expected_q`]) and its loss ([`cross_entropy`]). The formulations
//! are those of `docs/methods.md` ("The value as a distribution"). The agent
//! (`dqn.loss = "c51"`, `"hl_gauss"`) builds its targets and loss from these.

use candle_core::{Result, Tensor, D};
use serde::{Deserialize, Serialize};

pub use crate::nn::expected_q;

use super::td::first_argmax;
use super::td_loss::{mean_taken, LossInfo};
use crate::Metric;

/// C51's support: `atoms` values evenly spaced on `[v_min, v_max]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Atoms {
    pub atoms: usize,
    pub v_min: f32,
    pub v_max: f32,
}

/// The most atoms or bins a support may have (C51 takes 51, HL-Gauss about 100).
pub const MAX_ATOMS: usize = 4096;

/// Why a support cannot be built.
pub fn support_problem(atoms: usize, v_min: f32, v_max: f32) -> Option<&'static str> {
    // Bounded above too: the head is `actions x atoms` wide and the support a list
    // of `atoms` values, both allocated as the agent is built.
    if !(2..=MAX_ATOMS).contains(&atoms) {
        return Some("from 2 to 4096 atoms or bins");
    }
    (!(v_min.is_finite() && v_max.is_finite() && v_min < v_max))
        .then_some("finite bounds with v_min < v_max")
}

impl Atoms {
    /// The spacing between neighbouring atoms.
    pub fn delta(&self) -> f32 {
        (self.v_max - self.v_min) / (self.atoms - 1) as f32
    }

    /// Atom `j`'s value, `z_j`.
    pub fn atom(&self, j: usize) -> f32 {
        self.v_min + j as f32 * self.delta()
    }

    /// The expectation `sum_j p_j z_j` of a distribution over the atoms (a Q-value).
    pub fn mean(&self, p: &[f32]) -> f32 {
        p.iter().enumerate().map(|(j, &pj)| pj * self.atom(j)).sum()
    }

    /// C51's target: distribution `p` over the atoms moved to `reward + discount z_j`
    /// (`discount` is `gamma^n (1 - done)`), each shifted atom clipped to the support,
    /// and its mass split between the two atoms around it in proportion to nearness
    /// (all of it to the atom it lands on). `out` receives the projected distribution.
    pub fn project(&self, p: &[f32], reward: f32, discount: f32, out: &mut [f32]) {
        out.fill(0.0);
        let (dz, last) = (self.delta(), (self.atoms - 1) as f32);
        for (j, &pj) in p.iter().enumerate() {
            let tz = (reward + discount * self.atom(j)).clamp(self.v_min, self.v_max);
            // Rounding may put a clipped atom a hair beyond the last index.
            let b = ((tz - self.v_min) / dz).clamp(0.0, last);
            let (l, u) = (b.floor(), b.ceil());
            if l == u {
                out[l as usize] += pj;
            } else {
                out[l as usize] += pj * (u - b);
                out[u as usize] += pj * (b - l);
            }
        }
    }
}

/// The rows of a batch's bootstrap: rewards and terminations `[B]`, and the discount.
pub struct Bootstrap<'a> {
    pub rewards: &'a [f32],
    pub terminated: &'a [f32],
    pub gamma: f32,
}

/// A distributional loss's target distributions `[B, K]` from the next observations'
/// logits `next_logits` `[B, A, K]` over the head's `values` `[K]`: C51's projections
/// of the next distributions at the best next action, or HL-Gauss's histograms of the
/// scalar TD targets whose next Q-values are the distributions' expectations; with
/// Double DQN the `chooser`'s Q-values `[B, A]` pick the next action. One function for
/// a single agent and each agent of a population.
pub(crate) fn target_distributions(
    loss: super::ValueLoss,
    support: &super::Support,
    values: &[f32],
    next_logits: &[f32],
    chooser: Option<&[f32]>,
    rows: &Bootstrap,
) -> Vec<f32> {
    let (k, v_min, v_max) = (support.atoms, support.v_min as f32, support.v_max as f32);
    if loss == super::ValueLoss::HlGauss {
        let next_q = crate::nn::expectations(next_logits, values);
        let n_actions = next_q.len() / rows.rewards.len().max(1);
        let bootstrap = (rows.rewards, rows.terminated);
        let y = super::td::bootstrap_values(&next_q, chooser, n_actions, bootstrap, rows.gamma);
        return Bins {
            bins: k,
            v_min,
            v_max,
        }
        .targets(&y);
    }
    let next_p = crate::nn::softmax_runs(next_logits, k);
    Atoms {
        atoms: k,
        v_min,
        v_max,
    }
    .targets(&next_p, chooser, rows)
}

impl Atoms {
    /// C51's targets `[B, K]`: each row's next distribution under the target network
    /// (`next_p`, probabilities `[B, A, K]`) at `a*`, the action of the largest
    /// expected value (or, with Double DQN, of the online network's Q-values
    /// `online_q` `[B, A]`), moved by the reward and `gamma (1 - terminated)` and
    /// projected onto the atoms. A terminal row's target is the reward's alone.
    pub fn targets(&self, next_p: &[f32], online_q: Option<&[f32]>, rows: &Bootstrap) -> Vec<f32> {
        let k = self.atoms;
        let b = rows.rewards.len();
        let a = next_p.len() / (b * k).max(1);
        let mut out = vec![0f32; b * k];
        for (row, target) in out.chunks_exact_mut(k).enumerate() {
            let dists: Vec<&[f32]> = next_p[row * a * k..][..a * k].chunks_exact(k).collect();
            let best = match online_q {
                Some(q) => first_argmax(&q[row * a..][..a]),
                None => first_argmax(&dists.iter().map(|p| self.mean(p)).collect::<Vec<_>>()),
            };
            let discount = rows.gamma * (1.0 - rows.terminated[row]);
            self.project(dists[best], rows.rewards[row], discount, target);
        }
        out
    }
}

/// HL-Gauss's support: `bins` bins of equal width on `[v_min, v_max]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bins {
    pub bins: usize,
    pub v_min: f32,
    pub v_max: f32,
}

/// The Gaussian's spread in bin widths (Farebrother et al. 2024's recommended ratio).
pub const SIGMA_BINS: f64 = 0.75;

impl Bins {
    /// A bin's width.
    pub fn width(&self) -> f32 {
        (self.v_max - self.v_min) / self.bins as f32
    }

    /// Bin `i`'s centre.
    pub fn centre(&self, i: usize) -> f32 {
        self.v_min + (i as f32 + 0.5) * self.width()
    }

    /// The probability each bin holds of `N(y, sigma^2)`, `sigma` 0.75 bin widths, with
    /// `y` clipped to the support and the mass outside it left out (renormalized):
    /// the cross-entropy target of a scalar TD target `y`. Without the clip a target
    /// far outside the support leaves no mass to normalize.
    pub fn histogram(&self, y: f32, out: &mut [f32]) {
        let (lo, width) = (f64::from(self.v_min), f64::from(self.width()));
        let y = f64::from(y.clamp(self.v_min, self.v_max));
        let sigma = SIGMA_BINS * width;
        let cdf =
            |edge: f64| 0.5 * (1.0 + libm::erf((edge - y) / (sigma * std::f64::consts::SQRT_2)));
        let edges: Vec<f64> = (0..=self.bins)
            .map(|i| cdf(lo + i as f64 * width))
            .collect();
        let total = edges[self.bins] - edges[0];
        for (i, o) in out.iter_mut().enumerate().take(self.bins) {
            *o = ((edges[i + 1] - edges[i]) / total) as f32;
        }
    }

    /// HL-Gauss's targets `[B, bins]`: each scalar TD target's histogram.
    pub fn targets(&self, scalar: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; scalar.len() * self.bins];
        for (y, row) in scalar.iter().zip(out.chunks_exact_mut(self.bins)) {
            self.histogram(*y, row);
        }
        out
    }
}

/// The running discounted return `G <- gamma (1 - done) G + r` and its running
/// variance (Welford's), which SimbaV2 and XQC divide rewards by. Kept in checkpoints,
/// so that a resumed run scales as the uninterrupted one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReturnScale {
    gamma: f64,
    running: f64,
    count: u64,
    mean: f64,
    m2: f64,
    max_abs: f64,
}

impl ReturnScale {
    pub fn new(gamma: f64) -> Self {
        Self {
            gamma,
            running: 0.0,
            count: 0,
            mean: 0.0,
            m2: 0.0,
            max_abs: 0.0,
        }
    }

    /// One environment step's reward; `done` ends the return after it.
    pub fn push(&mut self, reward: f64, done: bool) {
        self.running = self.gamma * self.running + reward;
        self.count += 1;
        let delta = self.running - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (self.running - self.mean);
        self.max_abs = self.max_abs.max(self.running.abs());
        if done {
            self.running = 0.0;
        }
    }

    /// The returns' variance so far (population variance; 0 before two returns).
    pub fn variance(&self) -> f64 {
        match self.count {
            0 | 1 => 0.0,
            n => self.m2 / n as f64,
        }
    }

    /// SimbaV2's divisor: `max(sqrt(Var[G] + 1e-8), max|G| / v_max)`.
    pub fn simbav2_divisor(&self, v_max: f64) -> f64 {
        (self.variance() + 1e-8).sqrt().max(self.max_abs / v_max)
    }

    /// XQC's divisor: `sqrt(Var[G]) + 1e-8`.
    pub fn xqc_divisor(&self) -> f64 {
        self.variance().sqrt() + 1e-8
    }
}

/// The distributional loss: the cross-entropy of each row's taken action's distribution
/// (`logits` `[B, A, K]`, `actions` `[B]`) against its target distribution `targets`
/// `[B, K]` (C51's projection or HL-Gauss's histogram, no gradient), `-sum_k m_k log
/// p_k`, averaged over the batch. Its gradient with respect to the taken action's
/// logits is `(p - m) / B`, and 0 for the other actions.
pub fn cross_entropy(logits: &Tensor, actions: &[u32], targets: &Tensor) -> Result<Tensor> {
    let (b, _, k) = logits.dims3()?;
    let index = Tensor::from_slice(actions, (b, 1, 1), logits.device())?
        .broadcast_as((b, 1, k))?
        .contiguous()?;
    let taken = logits.gather(&index, 1)?.squeeze(1)?;
    let log_p = candle_nn::ops::log_softmax(&taken, D::Minus1)?;
    (targets.detach() * log_p)?.sum(1)?.mean(0)?.neg()
}

/// The mean entropy (nats) of the taken actions' distributions, from the logits
/// `[B, A, K]` (row-major, `a` actions of `k` values): how spread the value's
/// distribution is (a head collapsing onto one atom goes to 0, a uniform one is `ln K`).
pub fn mean_entropy(logits: &[f32], (a, k): (usize, usize), actions: &[u32]) -> f64 {
    let taken = actions.iter().enumerate().map(|(row, &action)| {
        let at = (row * a + action as usize) * k;
        entropy(&crate::nn::softmax_runs(&logits[at..at + k], k))
    });
    taken.sum::<f64>() / actions.len().max(1) as f64
}

/// `-sum_j p_j ln p_j` of a distribution `p`.
fn entropy(p: &[f32]) -> f64 {
    let terms = p.iter().filter(|&&p| p > 0.0).map(|&p| f64::from(p));
    -terms.map(|p| p * p.ln()).sum::<f64>()
}

/// [`distribution_loss`] on the host path: logits `[B, A, K]` (row-major, `shape`) over
/// `values` against target distributions `[B, K]`; what is logged and the loss's
/// gradient with respect to the logits, `(p - m) / B` on each taken action's, 0 on the
/// others'.
pub(crate) fn host_distribution_loss(
    logits: &[f32],
    (b, a, k): (usize, usize, usize),
    values: &[f32],
    actions: &[u32],
    targets: &[f32],
) -> Result<(LossInfo, Vec<f32>)> {
    if logits.len() != b * a * k || targets.len() != b * k || actions.len() != b {
        candle_core::bail!(
            "distributional loss: {} logits, {} targets, {} actions for [{b}, {a}, {k}]",
            logits.len(),
            targets.len(),
            actions.len()
        );
    }
    let mut gradient = vec![0f32; logits.len()];
    let (mut loss, mut q_sum, mut entropy_sum) = (0f64, 0f64, 0f64);
    for (row, (&action, m)) in actions.iter().zip(targets.chunks_exact(k)).enumerate() {
        let at = (row * a + action as usize) * k;
        let l = &logits[at..at + k];
        let p = crate::nn::softmax_runs(l, k);
        let log_total = log_sum_exp(l);
        entropy_sum += entropy(&p);
        for j in 0..k {
            let log_p = f64::from(l[j]) - log_total;
            loss -= f64::from(m[j]) * log_p;
            q_sum += f64::from(p[j] * values[j]);
            gradient[at + j] = (p[j] - m[j]) / b as f32;
        }
    }
    let n = b.max(1) as f64;
    let info = LossInfo {
        value: Metric::Host(loss / n),
        q_mean: Metric::Host(q_sum / n),
        entropy: Some(entropy_sum / n),
    };
    Ok((info, gradient))
}

/// `ln sum_j exp(l_j)` in `f64`, shifted by the largest `l_j` so that nothing overflows.
fn log_sum_exp(l: &[f32]) -> f64 {
    let top = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = l.iter().map(|&v| f64::from(v - top).exp()).sum();
    f64::from(top) + total.ln()
}

/// The distributional loss of a head's `logits` `[B, A, K]` over `values` `[K]`
/// against host target distributions `targets` `[B, K]`: the loss tensor to
/// differentiate, and what is logged (the loss, and the mean expected Q of the taken
/// actions).
pub(crate) fn distribution_loss(
    logits: &Tensor,
    values: &Tensor,
    actions: &[u32],
    targets: &[f32],
) -> Result<(LossInfo, Tensor)> {
    let (b, a, k) = logits.dims3()?;
    let targets = Tensor::from_slice(targets, (b, k), logits.device())?;
    let loss = cross_entropy(logits, actions, &targets)?;
    let q = expected_q(&logits.detach(), values)?;
    let host_logits = logits.detach().flatten_all()?.to_vec1()?;
    let info = LossInfo {
        value: Metric::of(&loss)?,
        q_mean: Metric::Host(mean_taken(&q, actions)?),
        entropy: Some(mean_entropy(&host_logits, (a, k), actions)),
    };
    Ok((info, loss))
}

#[cfg(test)]
#[path = "distribution_tests.rs"]
mod tests;
