//! The choices a user makes about a Q-network's architecture (its normalization's are
//! `registry.rs`'s `NormConfig`).

use serde::{Deserialize, Serialize};

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
