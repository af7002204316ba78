//! The choices a user makes about a Q-network: its architecture and its normalization.

use serde::{Deserialize, Serialize};

use super::{NormKind, RenormConfig};
use crate::check::{non_negative, positive};

/// Normalization settings; every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormConfig {
    /// Which method normalizes the hidden layers.
    pub kind: NormKind,
    /// Learning-rate multiplier of the weight-norm gains `g` (the paper's ablation
    /// favours 10).
    pub g_lr_scale: f64,
    /// Weight-normalize the output layer too (weight-norm methods only).
    pub wn_output_layer: bool,
    /// Weight norm's data-dependent init on the first batch.
    pub data_dependent_init: bool,
    /// Weight of the new batch in BN running statistics.
    pub bn_momentum: f64,
    /// BN's variance epsilon (> 0).
    pub bn_eps: f64,
    /// LN's variance epsilon, and RMSNorm's and GN's (> 0).
    pub ln_eps: f64,
    /// Group norm's groups per layer; it must divide every hidden layer's units or
    /// channels.
    pub groups: usize,
    /// SVB bound: singular values are kept in `[1/(1+eps), 1+eps]`.
    pub svb_eps: f64,
    /// Optimizer steps between SVB projections.
    pub svb_interval: u64,
    /// BBN bound on the relative per-channel gains: each within `[1/(1+eps), 1+eps]`
    /// of the layer's mean gain. 0.5: with 0.2 BBN did not learn CartPole (best
    /// evaluations 72, 111, 74 on seeds 1-3), with 0.5 it does on 4 of 5 seeds.
    pub bbn_eps: f64,
    /// Batch renormalization's bound on `r` (>= 1): `r` in `[1/r_max, r_max]`.
    pub brn_r_max: f64,
    /// Batch renormalization's bound on `d` (>= 0): `d` in `[-d_max, d_max]`.
    pub brn_d_max: f64,
    /// Updates of plain batch norm before batch renormalization's clip opens.
    pub brn_warmup: u64,
}

impl NormConfig {
    /// Batch renormalization's clip and warm-up.
    pub fn renorm(&self) -> RenormConfig {
        RenormConfig {
            r_max: self.brn_r_max,
            d_max: self.brn_d_max,
            warmup: self.brn_warmup,
        }
    }
}

impl Default for NormConfig {
    fn default() -> Self {
        Self {
            kind: NormKind::None,
            g_lr_scale: 1.0,
            wn_output_layer: true,
            data_dependent_init: true,
            bn_momentum: 0.1,
            bn_eps: 1e-5,
            ln_eps: 1e-5,
            groups: 4,
            svb_eps: 0.05,
            svb_interval: 200,
            bbn_eps: 0.5,
            brn_r_max: 3.0,
            brn_d_max: 5.0,
            brn_warmup: 1000,
        }
    }
}

impl NormConfig {
    /// Range problems, each as `(field, what is allowed)`.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = vec![];
        if !positive(self.g_lr_scale) {
            p.push(("g_lr_scale", "a positive number"));
        }
        if !(self.bn_momentum > 0.0 && self.bn_momentum <= 1.0) {
            p.push(("bn_momentum", "a number in (0, 1]"));
        }
        if !positive(self.bn_eps) {
            p.push(("bn_eps", "a positive number"));
        }
        if !positive(self.ln_eps) {
            p.push(("ln_eps", "a positive number"));
        }
        if self.groups == 0 {
            p.push(("groups", "a positive integer"));
        }
        if !non_negative(self.svb_eps) {
            p.push(("svb_eps", "a non-negative number"));
        }
        if self.svb_interval == 0 {
            p.push(("svb_interval", "a positive integer"));
        }
        if !non_negative(self.bbn_eps) {
            p.push(("bbn_eps", "a non-negative number"));
        }
        if !(self.brn_r_max >= 1.0 && self.brn_r_max.is_finite()) {
            p.push(("brn_r_max", "a finite number >= 1"));
        }
        if !non_negative(self.brn_d_max) {
            p.push(("brn_d_max", "a finite number >= 0"));
        }
        p
    }
}

/// The Q-network's layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", deny_unknown_fields)]
pub enum Architecture {
    /// Fully connected layers of the given widths.
    Mlp { hidden: Vec<usize> },
    /// MinAtar's network: conv 16 filters 3x3 stride 1, FC 128.
    MinatarCnn,
    /// The Nature DQN network for 4x84x84 frames: conv 32 8x8/4, 64 4x4/2, 64 3x3/1,
    /// FC 512.
    NatureCnn,
}

impl Architecture {
    /// The convolutions, input to output: `(channels out, kernel size, stride)` each.
    pub fn convolutions(&self) -> &'static [(usize, usize, usize)] {
        match self {
            Architecture::Mlp { .. } => &[],
            Architecture::MinatarCnn => &[(16, 3, 1)],
            Architecture::NatureCnn => &[(32, 8, 4), (64, 4, 2), (64, 3, 1)],
        }
    }

    /// The fully connected hidden layers' widths, after the convolutions.
    pub fn dense_widths(&self) -> Vec<usize> {
        match self {
            Architecture::Mlp { hidden } => hidden.clone(),
            Architecture::MinatarCnn => vec![128],
            Architecture::NatureCnn => vec![512],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QNetworkConfig {
    pub architecture: Architecture,
}

impl QNetworkConfig {
    pub fn mlp(hidden: Vec<usize>) -> Self {
        Self {
            architecture: Architecture::Mlp { hidden },
        }
    }

    pub fn minatar_cnn() -> Self {
        Self {
            architecture: Architecture::MinatarCnn,
        }
    }

    pub fn nature_cnn() -> Self {
        Self {
            architecture: Architecture::NatureCnn,
        }
    }
}
