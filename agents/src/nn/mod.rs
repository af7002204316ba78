//! Q-networks and the seven normalization methods of `shared/spec/normalization.md`,
//! on candle, for Linear and Conv2d layers alike.

mod batch_norm;
mod batch_norm_op;
mod config;
mod data_conv;
pub(crate) mod dense;
mod feature_pass;
pub mod fused;
mod host_mlp;
pub mod init;
mod kernel;
mod kernel_core;
mod layer;
mod layer_norm;
mod linear_op;
mod mean_only_bn;
mod mean_only_bn_op;
mod params;
mod qnet;
pub mod svb;
mod unit_norms;
mod weight_norm;
mod weight_norm_op;

pub use batch_norm::BatchNorm;
pub use config::{Architecture, NormConfig, NormKind, QNetworkConfig};
pub use host_mlp::{HostGradients, HostTape};
pub use kernel::{unit_moments, Kernel};
pub use layer::{LayerStats, NormLayer};
pub use layer_norm::LayerNorm;
pub use mean_only_bn::MeanOnlyBn;
pub use params::{Group, Param, ParamStore};
pub use qnet::QNetwork;
pub use unit_norms::UnitNorms;
pub use weight_norm::WeightNorm;

/// Whether a forward pass trains or evaluates. Batch-norm layers use batch statistics
/// (and update their running statistics) in `Train`, running statistics in `Eval`.
/// `Eval` forwards are gradient-free: weight-normalized layers use their cached `w` (on
/// the graph) or cached norms (on the host path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Train,
    Eval,
}
