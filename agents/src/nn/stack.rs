//! The registry of population forms: which method's form a hidden layer of a
//! `NormKind` stacks (`nn/stacked.rs` holds their contract).

use candle_core::Result;

use super::stacked::{StackedNorm, Take};
use super::{batch_norm, group_norm, layer_norm, mean_only_bn, rms_norm, svb};
use super::{NormConfig, NormKind};

/// A hidden layer's normalization of every agent, as `config.kind` writes it: the
/// registry of population forms. `None` for a layer without one.
pub(crate) fn stack_norm(
    take: &mut Take,
    config: &NormConfig,
) -> Result<Option<Box<dyn StackedNorm>>> {
    Ok(match config.kind {
        NormKind::LayerNorm => {
            // Group norm with one group: each sample over all its features.
            let (gamma, beta) = layer_norm::stacked_vars(take)?;
            let eps = config.ln_eps;
            Some(Box::new(group_norm::StackedGroupNorm::new(
                gamma, beta, 1, eps,
            )))
        }
        NormKind::GroupNorm => Some(Box::new(group_norm::StackedGroupNorm::stack(take, config)?)),
        NormKind::RmsNorm => Some(Box::new(rms_norm::StackedRmsNorm::stack(take, config)?)),
        NormKind::BatchNorm | NormKind::BatchRenorm => {
            Some(Box::new(batch_norm::StackedBatchNorm::stack(take, config)?))
        }
        NormKind::WnMeanOnlyBn => Some(Box::new(mean_only_bn::StackedMeanOnly::stack(
            take, config,
        )?)),
        NormKind::Svb => Some(Box::new(svb::StackedSvb::new(config, None))),
        NormKind::Bbn => {
            let bn = batch_norm::StackedBatchNorm::stack(take, config)?;
            Some(Box::new(svb::StackedSvb::new(config, Some(Box::new(bn)))))
        }
        NormKind::None | NormKind::WeightNorm => None,
    })
}
