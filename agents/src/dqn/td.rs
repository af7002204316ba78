//! The TD rule in tensor ops, written once for any leading axes: a single agent's
//! `[B, actions]` Q-values or a population's `[P, B, actions]`. Used by a single
//! agent's device engine and by populations; the host engine computes the same in
//! loops on its buffers (`Dqn::bootstrap`).

use candle_core::{CustomOp3, Result, Shape, Tensor};

use super::TargetUpdate;
use crate::kernels::{cpu_forward, with_values};

/// Each next observation's value to bootstrap from, along the last axis: the target
/// network's best Q-value, or with Double DQN (`online_q` given) the target's Q-value
/// of the online network's best action.
pub fn best_next(target_q: &Tensor, online_q: Option<&Tensor>) -> Result<Tensor> {
    let last = target_q.rank() - 1;
    match online_q {
        None => target_q.max(last),
        Some(q) => target_q
            .gather(&q.argmax_keepdim(last)?, last)?
            .squeeze(last),
    }
}

/// The discount: one for every agent, or each agent's own (`[P, 1]`).
#[derive(Clone, Copy)]
pub enum Discount<'a> {
    All(f64),
    PerAgent(&'a Tensor),
}

/// The TD targets `r + gamma (1 - terminated) best`, detached: no gradient reaches the
/// values they bootstrap from.
pub fn bootstrap(
    rewards: &Tensor,
    terminated: &Tensor,
    best: &Tensor,
    gamma: Discount,
) -> Result<Tensor> {
    let keep = discounts(terminated, gamma)?;
    (rewards + (best.detach() * keep)?)?.detach().contiguous()
}

/// Each row's discount of its next value, `gamma (1 - terminated)`.
pub fn discounts(terminated: &Tensor, gamma: Discount) -> Result<Tensor> {
    let not_ended = terminated.affine(-1.0, 1.0)?;
    match gamma {
        Discount::All(gamma) => not_ended * gamma,
        Discount::PerAgent(gammas) => not_ended.broadcast_mul(gammas),
    }
}

/// The index of the first largest value (0 for an empty slice).
pub(crate) fn first_argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// [`bootstrap`] on host values: `r + gamma (1 - terminated) Q(s', a*)` of one batch,
/// from its next observations' Q-values `target_q` `[B, n_actions]`, `a*` their argmax
/// or, with Double DQN, `online_q`'s.
pub(crate) fn bootstrap_values(
    target_q: &[f32],
    online_q: Option<&[f32]>,
    n_actions: usize,
    (rewards, terminated): (&[f32], &[f32]),
    gamma: f32,
) -> Vec<f32> {
    let target_q: Vec<&[f32]> = target_q.chunks_exact(n_actions.max(1)).collect();
    let chosen: Vec<usize> = match online_q {
        Some(q) => q.chunks_exact(n_actions.max(1)).map(first_argmax).collect(),
        None => target_q.iter().map(|q| first_argmax(q)).collect(),
    };
    target_q
        .iter()
        .zip(&chosen)
        .zip(rewards.iter().zip(terminated))
        .map(|((q, &a), (&r, &t))| r + q[a] * ((1.0 - t) * gamma))
        .collect()
}

/// Each agent's TD targets `[P, B]` from the target network's next Q-values `[P, B,
/// actions]` (the best of each, no Double DQN), rewards and terminations `[P, B]`: on
/// the CPU one op, the single agent's loop per agent; elsewhere tensor ops.
pub fn population_targets(
    next_q: &Tensor,
    rewards: &Tensor,
    terminated: &Tensor,
    gamma: Discount,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if next_q.device().is_cuda() {
        // One kernel; the discounts as a tensor on the device (no read of them).
        let p = next_q.dim(0)?;
        let gammas = match gamma {
            Discount::All(g) => Tensor::from_vec(vec![g as f32; p], p, next_q.device())?,
            Discount::PerAgent(g) => g.flatten_all()?.contiguous()?,
        };
        let next_q = next_q.contiguous()?;
        return crate::kernels::cuda::device::td_targets(&next_q, rewards, terminated, &gammas);
    }
    if !next_q.device().is_cpu() {
        return bootstrap(rewards, terminated, &best_next(next_q, None)?, gamma);
    }
    let p = next_q.dim(0)?;
    let gammas = match gamma {
        Discount::All(g) => vec![g as f32; p],
        Discount::PerAgent(g) => with_values(&g.contiguous()?, |v| Ok(v.to_vec()))?,
    };
    if gammas.len() != p {
        candle_core::bail!("TD targets: {} discounts for {p} agents", gammas.len());
    }
    next_q.contiguous()?.apply_op3_no_bwd(
        &rewards.contiguous()?,
        &terminated.contiguous()?,
        &PopulationTargets { gammas },
    )
}

/// [`population_targets`]' op: each agent's discount.
struct PopulationTargets {
    gammas: Vec<f32>,
}

impl CustomOp3 for PopulationTargets {
    cpu_forward!("population-td-targets", |op, q @ lq, r @ lr, t @ lt| {
        let (p, b, a) = lq.shape().dims3()?;
        if lr.shape().elem_count() != p * b || lt.shape().elem_count() != p * b {
            candle_core::bail!(
                "TD targets: rewards {:?} for Q-values {:?}",
                lr.shape(),
                lq.shape()
            );
        }
        let mut targets = Vec::with_capacity(p * b);
        for (i, &gamma) in op.gammas.iter().enumerate() {
            let rows = (&r[i * b..(i + 1) * b], &t[i * b..(i + 1) * b]);
            let q = &q[i * b * a..(i + 1) * b * a];
            targets.extend(bootstrap_values(q, None, a, rows, gamma));
        }
        Ok((targets, Shape::from((p, b))))
    });
}

/// CrossQ's joint forward split along `axis`, where `q_all` holds the observations'
/// Q-values then the next observations' (`rows` each): the first half (for the loss)
/// and the second, detached (for the targets).
pub fn split_joint(q_all: &Tensor, axis: usize, rows: usize) -> Result<(Tensor, Tensor)> {
    let q = q_all.narrow(axis, 0, rows)?.contiguous()?;
    Ok((q, q_all.narrow(axis, rows, rows)?.detach()))
}

/// What the target network does after an update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TargetSync {
    /// Nothing this update.
    Keep,
    /// `target = online`.
    Copy,
    /// `target = (1 - tau) target + tau online`.
    Average(f64),
}

impl TargetUpdate {
    /// After update number `updates` (counted from 1).
    pub fn after(self, updates: u64) -> TargetSync {
        match self {
            TargetUpdate::Hard { every } if updates.is_multiple_of(every) => TargetSync::Copy,
            TargetUpdate::Polyak { tau } => TargetSync::Average(tau),
            _ => TargetSync::Keep,
        }
    }

    /// Whether the TD targets come from the online network (no target network).
    pub fn bootstraps_from_online(self) -> bool {
        self == TargetUpdate::None
    }
}
