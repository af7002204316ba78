//! The TD rule in tensor ops, written once for any leading axes: a single agent's
//! `[B, actions]` Q-values or a population's `[P, B, actions]`. Used by a single
//! agent's device engine and by populations; the host engine computes the same in
//! loops on its buffers (`Dqn::bootstrap`).

use candle_core::{Result, Tensor};

use super::TargetUpdate;

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
    let not_ended = terminated.affine(-1.0, 1.0)?;
    let keep = match gamma {
        Discount::All(gamma) => (not_ended * gamma)?,
        Discount::PerAgent(gammas) => not_ended.broadcast_mul(gammas)?,
    };
    (rewards + (best.detach() * keep)?)?.detach().contiguous()
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
