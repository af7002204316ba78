//! Q-networks and the normalization methods (`docs/methods.md`), on candle, for
//! Linear and Conv2d layers alike.
//!
//! A layer ([`Layer`]) is a kernel whose weight a weight rule keeps (plain, weight-normed
//! ([`WeightNorm`]), projected, unit rows, held at its initial norm, or SVB's: `parts.rs`,
//! its steps in `after_step.rs`), an activation normalization ([`BatchNorm`] with or
//! without batch renormalization, [`MeanOnlyBn`], [`LayerNorm`], [`GroupNorm`],
//! [`RmsNorm`], [`Hyperspherical`]'s unit features, or none, each one type implementing
//! one trait, `normalization::Normalization`, in its own file), a bias and a ReLU. Each
//! method's file holds its parameters, init, tensor form, graph forward, the host path's
//! forward and backward and a population's fused forward, for a single network and a
//! population alike (the methods' files are in `methods/`, away from the network's
//! plumbing here); the CPU loops they call are in [`crate::kernels`].

pub(crate) mod after_step;
mod config;
mod host_mlp;
pub mod init;
mod layer;
mod linear_map;
mod methods;
mod norm;
pub(crate) mod normalization;
pub(crate) mod params;
pub(crate) mod parts;
#[cfg(test)]
mod population_forms_tests;
mod qnet;
mod registry;
pub(crate) mod weight;

pub use methods::svb;
pub(crate) use methods::{batch_norm, batch_renorm, group_norm, layer_norm, mean_only_bn};
pub(crate) use methods::{hyperspherical, nap, rms_norm, weight_norm, wn_projected};

pub use batch_norm::BatchNorm;
pub use batch_renorm::RenormConfig;
pub use config::{Architecture, QNetworkConfig};
pub use group_norm::GroupNorm;
pub use host_mlp::{expectations, softmax_runs, HostTape};
pub use hyperspherical::Hyperspherical;
pub use layer::{Layer, LayerStats};
pub use layer_norm::LayerNorm;
pub use linear_map::{unit_moments, LinearMap};
pub use mean_only_bn::MeanOnlyBn;
pub use normalization::HostGradients;
pub use params::{Param, ParamStore, Role};
pub use parts::{Activation, WeightRule};
pub use qnet::{expected_q, QNetwork};
pub use registry::{NormConfig, NormKind, SphereHead, COMBINATIONS};
pub use rms_norm::RmsNorm;
pub use weight_norm::{UnitNorms, WeightNorm};

/// Which statistics the batch-statistics layers (batch norm, BBN, mean-only BN)
/// normalize with. Configs write them `"train"` and `"eval"`, as PyTorch's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BnStats {
    /// This batch's statistics; the running statistics are updated from them.
    #[serde(rename = "train")]
    Batch,
    /// The running statistics, unchanged.
    #[serde(rename = "eval")]
    Running,
}

/// One forward through candle's graph: which batch-norm statistics, and whether
/// gradients flow to weight norm's `v` and `g` (else the layer uses its cached,
/// detached `w`). The two are separate choices: an update with
/// `dqn.online_bn_mode = "eval"` is differentiable with running statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub stats: BnStats,
    pub differentiable: bool,
}

impl Pass {
    /// Training: batch statistics, differentiable.
    pub const TRAIN: Pass = Pass::differentiable(BnStats::Batch);
    /// Evaluation (acting, TD targets, tests of a policy): running statistics, no
    /// gradients.
    pub const EVAL: Pass = Pass::gradient_free(BnStats::Running);

    /// An update's forward: differentiable, with `stats`.
    pub const fn differentiable(stats: BnStats) -> Self {
        Self {
            stats,
            differentiable: true,
        }
    }

    /// A forward whose result is a constant (acting, TD targets), with `stats`.
    pub const fn gradient_free(stats: BnStats) -> Self {
        Self {
            stats,
            differentiable: false,
        }
    }
}
