//! The normalization methods' files, one per method (or weight rule's step): each holds
//! its parameters, init, tensor form, graph forward, host loops' calls and a
//! population's fused forward, for a single network and a population alike
//! (`nn/normalization.rs`'s trait). `nn/registry.rs` is the only file that builds them.

pub(crate) mod batch_norm;
pub(crate) mod batch_renorm;
pub(crate) mod group_norm;
pub(crate) mod hyperspherical;
pub(crate) mod layer_norm;
pub(crate) mod mean_only_bn;
pub(crate) mod nap;
pub(crate) mod rms_norm;
pub mod svb;
pub(crate) mod weight_norm;
pub(crate) mod wn_projected;
