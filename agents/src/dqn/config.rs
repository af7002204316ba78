//! DQN settings.

use serde::{Deserialize, Serialize};

use crate::check::positive;
use crate::nn::BnStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Smooth L1 with threshold 1 (the DQN paper's error clipping).
    Huber,
    Mse,
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
    pub loss: Loss,
    pub target_update: TargetUpdate,
    /// Batch-norm mode of the target network in the update (`eval`: running
    /// statistics; `train`: statistics of the next-observation batch).
    pub target_bn_mode: BnStats,
    /// Batch-norm mode of the online network in the update.
    pub online_bn_mode: BnStats,
    /// Batch-norm mode when choosing actions.
    pub acting_bn_mode: BnStats,
    /// CrossQ's joint forward: one training forward over the observations and the next
    /// observations together (2B rows, so batch statistics come from both); the second
    /// half's Q-values, detached, make the targets. Needs `target_update = "none"`.
    pub joint_forward: bool,
}

impl Default for DqnConfig {
    fn default() -> Self {
        Self {
            gamma: 0.99,
            double_dqn: false,
            loss: Loss::Huber,
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
        if self.joint_forward && !target_free {
            p.push((
                "joint_forward",
                "used with target_update = { type = \"none\" } (the targets come from the joint forward)",
            ));
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

/// What an agent is made of, the learning half of a run's config: its network, its
/// normalization, its optimizer and its DQN settings ([`super::Dqn::new`]).
#[derive(Debug, Clone, Copy)]
pub struct AgentConfig<'a> {
    pub network: &'a crate::nn::QNetworkConfig,
    pub norm: &'a crate::nn::NormConfig,
    pub optimizer: &'a crate::optim::OptimizerConfig,
    pub dqn: &'a DqnConfig,
}
