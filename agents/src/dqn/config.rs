//! DQN settings.

use serde::{Deserialize, Serialize};

use super::distribution::{support_problem, Atoms, Bins};
use crate::check::positive;
use crate::nn::BnStats;

/// A regression of the taken action's Q-value on its TD target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Smooth L1 with threshold 1 (the DQN paper's error clipping).
    Huber,
    Mse,
}

/// `dqn.loss`: a regression of Q on the TD target, or the cross-entropy of a
/// distribution over fixed values (`dqn.support`) against a target distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueLoss {
    Huber,
    Mse,
    /// C51 (Bellemare et al. 2017): the target network's distribution at the best next
    /// action, moved by the reward and the discount and projected onto the atoms.
    C51,
    /// HL-Gauss (Farebrother et al. 2024): the scalar TD target as a Gaussian histogram
    /// over the bins, sigma 0.75 bin widths.
    HlGauss,
}

impl ValueLoss {
    /// The regression loss, or `None` for a distributional one.
    pub fn regression(self) -> Option<Loss> {
        match self {
            ValueLoss::Huber => Some(Loss::Huber),
            ValueLoss::Mse => Some(Loss::Mse),
            ValueLoss::C51 | ValueLoss::HlGauss => None,
        }
    }

    pub fn is_distributional(self) -> bool {
        self.regression().is_none()
    }
}

/// `dqn.reward_scale`: what the rewards of a batch are divided by before the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardScale {
    /// The rewards as the environment gives them.
    #[default]
    None,
    /// SimbaV2's: the running discounted return's spread,
    /// `max(sqrt(Var[G] + 1e-8), max|G| / v_max)` with `v_max` the support's
    /// ([`super::distribution::ReturnScale`]), over every step so far.
    RunningReturn,
    /// XQC's: the running discounted return's standard deviation, `sqrt(Var[G]) + 1e-8`.
    ReturnStd,
}

/// `dqn.support`: the fixed values a distributional head puts its probability on: C51's
/// `atoms` atoms from `v_min` to `v_max`, or HL-Gauss's `atoms` bins of equal width
/// covering `[v_min, v_max]`. Defaults: 51 on [-10, 10], Bellemare et al.'s on Atari.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Support {
    pub atoms: usize,
    pub v_min: f64,
    pub v_max: f64,
}

impl Default for Support {
    fn default() -> Self {
        Self {
            atoms: 51,
            v_min: -10.0,
            v_max: 10.0,
        }
    }
}

/// How the target network follows the online one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", deny_unknown_fields)]
pub enum TargetUpdate {
    /// Copy every `every` updates.
    Hard { every: u64 },
    /// `target = (1 - tau) * target + tau * online` after every update.
    Polyak { tau: f64 },
    /// No target network: the TD targets come from the online network, detached (PQN,
    /// CrossQ).
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DqnConfig {
    /// Discount factor.
    pub gamma: f64,
    pub double_dqn: bool,
    pub loss: ValueLoss,
    /// The values of a distributional loss's head (unused by `huber` and `mse`).
    pub support: Support,
    pub reward_scale: RewardScale,
    pub target_update: TargetUpdate,
    /// Batch-norm mode of the target network in the update (`eval`: running
    /// statistics; `train`: statistics of the next-observation batch).
    pub target_bn_mode: BnStats,
    /// Batch-norm mode of the online network in the update.
    pub online_bn_mode: BnStats,
    /// Batch-norm mode when choosing actions.
    pub acting_bn_mode: BnStats,
    /// CrossQ's joint forward: one training forward over the observations and the next
    /// observations together (2B rows, so batch statistics come from both). Without a
    /// target network the second half's Q-values, detached, make the targets (CrossQ);
    /// with one, the target network's forward over the same 2B rows does (CrossQ with
    /// weight norm, XQC).
    pub joint_forward: bool,
}

impl Default for DqnConfig {
    fn default() -> Self {
        Self {
            gamma: 0.99,
            double_dqn: false,
            loss: ValueLoss::Huber,
            support: Support::default(),
            reward_scale: RewardScale::None,
            target_update: TargetUpdate::Hard { every: 1000 },
            target_bn_mode: BnStats::Running,
            online_bn_mode: BnStats::Batch,
            acting_bn_mode: BnStats::Running,
            joint_forward: false,
        }
    }
}

impl DqnConfig {
    /// Range problems, each as `(field, what is allowed)`.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = vec![];
        if !(0.0..=1.0).contains(&self.gamma) {
            p.push(("gamma", "a number in [0, 1]"));
        }
        match self.target_update {
            TargetUpdate::Hard { every: 0 } => {
                p.push(("target_update.every", "a positive integer"))
            }
            TargetUpdate::Polyak { tau } if !(positive(tau) && tau <= 1.0) => {
                p.push(("target_update.tau", "a number in (0, 1]"))
            }
            _ => {}
        }
        let target_free = self.target_update == TargetUpdate::None;
        if self.loss.is_distributional() {
            let s = &self.support;
            if let Some(why) = support_problem(s.atoms, s.v_min as f32, s.v_max as f32) {
                p.push(("support", why));
            }
        }
        if self.double_dqn && target_free {
            p.push((
                "double_dqn",
                "used with a target network (Double DQN picks with one network and evaluates with the other)",
            ));
        }
        p
    }
}

impl DqnConfig {
    /// The support's values: C51's atoms, or HL-Gauss's bin centres.
    pub fn support_values(&self) -> Vec<f32> {
        let (k, v_min, v_max) = (self.support.atoms, self.support.v_min, self.support.v_max);
        let (v_min, v_max) = (v_min as f32, v_max as f32);
        match self.loss {
            ValueLoss::HlGauss => {
                let bins = Bins {
                    bins: k,
                    v_min,
                    v_max,
                };
                (0..k).map(|i| bins.centre(i)).collect()
            }
            _ => {
                let atoms = Atoms {
                    atoms: k,
                    v_min,
                    v_max,
                };
                (0..k).map(|j| atoms.atom(j)).collect()
            }
        }
    }
}

/// What an agent is made of, the learning half of a run's config: its network, its
/// normalization, its optimizer and its DQN settings ([`super::Dqn::new`]).
#[derive(Debug, Clone, Copy)]
pub struct AgentConfig<'a> {
    pub network: &'a crate::nn::QNetworkConfig,
    pub norm: &'a crate::nn::NormConfig,
    pub optimizer: &'a crate::optim::OptimizerConfig,
    pub dqn: &'a DqnConfig,
}
