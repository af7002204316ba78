//! Populations: P agents trained as one program whose every tensor carries a leading
//! population axis, so that the number of operations per step does not grow with P (on
//! a GPU, a fixed number of kernel launches for a whole study; counted in `count`).
//! MLPs and MinAtar's CNN with no normalization, weight norm (and its data-dependent
//! init on each agent's first batch), weight norm with mean-only batch norm, batch norm,
//! batch renormalization, layer norm, group norm or RMSNorm (statistics per agent, and
//! per sample for the last three); Adam or RMSprop; hard, Polyak or no target updates. Agents stack from
//! single ones where they stand and export back into them (the trainer's checkpoints
//! are single runs'), and each trains exactly as alone (`agents/tests/population.rs`).
//! CrossQ's joint forward too. Gamma and the learning rate may differ per agent. Not
//! yet: SVB/BBN's projections, the replay on the device.

mod conv;
pub mod count;
mod dqn;
mod net;

pub use dqn::{PopulationDqn, PopulationInfo};
pub use net::PopulationNet;

use crate::nn::NormKind;

/// Why agents of this kind cannot train as a population yet, as `(key, what is
/// supported)`; `None` when they can. Every optimizer (Adam, RMSprop) updates each
/// value from its own gradient and moments, and every target update and the joint
/// forward are per agent, so only the normalization decides.
pub fn unsupported(norm: NormKind) -> Option<(&'static str, &'static str)> {
    (!norm_supported(norm)).then_some((
        "norm.kind",
        "none, weight_norm, wn_mean_only_bn, batch_norm, batch_renorm, layer_norm, group_norm or rms_norm",
    ))
}

/// Whether a population stacks networks normalized by `norm`.
pub(crate) fn norm_supported(norm: NormKind) -> bool {
    matches!(
        norm,
        NormKind::None
            | NormKind::BatchNorm
            | NormKind::WeightNorm
            | NormKind::WnMeanOnlyBn
            | NormKind::LayerNorm
            | NormKind::GroupNorm
            | NormKind::RmsNorm
            | NormKind::BatchRenorm
    )
}
