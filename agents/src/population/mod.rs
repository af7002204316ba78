//! Populations (issue 20): P agents trained as one program whose every
//! tensor carries a leading population axis, so that the number of operations per
//! step does not grow with P (on a GPU, a fixed number of kernel launches for a whole
//! study). So far: MLPs and MinAtar's CNN with no normalization, weight norm (and its
//! data-dependent init on each agent's first batch), weight norm with mean-only batch
//! norm or batch norm (statistics per agent), and MLPs with layer norm, group norm or
//! RMSNorm, stacked from single networks; their DQN update (Adam, hard target syncs),
//! acting (one forward and one read of the P actions) and saved state, each agent
//! exactly as alone (`agents/tests/population.rs`); measured by `normrl bench
//! population`. Not yet: batch renormalization and SVB/BBN's projections, per-sample
//! norms on CNNs, the trainer's `run.population` and comparisons' grouping, device
//! replay.

mod conv;
pub mod count;
mod dqn;
mod net;

pub use dqn::{PopulationDqn, PopulationInfo};
pub use net::PopulationNet;

use crate::dqn::{DqnConfig, TargetUpdate};
use crate::nn::NormKind;
use crate::optim::OptimizerConfig;

/// Why agents of this kind cannot train as a population yet, as `(key, what is
/// supported)`; `None` when they can.
pub fn unsupported(
    norm: NormKind,
    convolutional: bool,
    dqn: &DqnConfig,
    optimizer: &OptimizerConfig,
) -> Option<(&'static str, &'static str)> {
    if !norm_supported(norm, convolutional) {
        return Some((
            "norm.kind",
            "none, weight_norm, wn_mean_only_bn, batch_norm or layer_norm (and group_norm or rms_norm on MLPs)",
        ));
    }
    // Every optimizer (Adam, RMSprop) updates each value from its own gradient and
    // moments: the single agents' optimizer over the stacked variables is each agent's.
    let _ = optimizer;
    if !matches!(dqn.target_update, TargetUpdate::Hard { .. }) {
        return Some(("dqn.target_update", "a hard update (every N updates)"));
    }
    if dqn.joint_forward {
        return Some(("dqn.joint_forward", "false"));
    }
    None
}

/// Whether a population stacks networks normalized by `norm`.
pub(crate) fn norm_supported(norm: NormKind, convolutional: bool) -> bool {
    match norm {
        NormKind::None
        | NormKind::BatchNorm
        | NormKind::WeightNorm
        | NormKind::WnMeanOnlyBn
        | NormKind::LayerNorm => true,
        NormKind::GroupNorm | NormKind::RmsNorm => !convolutional,
        _ => false,
    }
}
