//! The weight rules' work after an optimizer step ([`AfterStep`]), written once for any
//! leading axes: a single network's layer (`lead` 0: `Layer::after_step`) and a
//! population's (`lead` 1, each agent's weights its own: `PopulationNet`) call
//! [`after_step`]. Unit rows (`wn_projected.rs`) and NaP's initial norms (`nap.rs`) run
//! every step, in place on the CPU and by tensor ops on a device (inside a captured
//! update); SVB's projection (`svb.rs`) and a bounded batch norm's bound of its gains run
//! every `svb_interval` steps, on the host.

use candle_core::{Result, Var};

use super::normalization::Normalization;
use super::parts::AfterStep;
use super::{nap, svb, wn_projected, NormConfig};

/// One layer as its weight rule's step sees it.
pub(crate) struct WeightStep<'a> {
    pub rule: AfterStep,
    /// The weight the optimizer steps: `w`, or weight norm's direction `v`.
    pub weight: &'a Var,
    /// NaP's target: the weight's norm at init.
    pub rho: Option<&'a Var>,
    /// The layer's activation normalization (a bounded batch norm's gains, a layer
    /// norm's gain and offset).
    pub norm: &'a dyn Normalization,
    /// Leading axes before the weight's own (0 for one network, 1 for a population).
    pub lead: usize,
}

impl AfterStep {
    /// The rule runs after every step (inside the update; on a device, inside its
    /// captured graph), not at an interval on the host.
    pub(crate) fn every_step(self) -> bool {
        matches!(self, AfterStep::UnitRows | AfterStep::InitialNorm)
    }
}

/// The layer's step after optimizer step `updates` (counting from 1), when due; whether
/// it ran.
pub(crate) fn after_step(layer: &WeightStep, updates: u64, config: &NormConfig) -> Result<bool> {
    match layer.rule {
        AfterStep::Nothing => return Ok(false),
        AfterStep::Svb if !svb::due(updates, config.svb_interval) => return Ok(false),
        AfterStep::Svb => {
            svb::project_var(layer.weight, config.svb_eps, layer.lead)?;
            if config.bounds_gains() {
                layer.norm.bound_gains(config.bbn_eps)?;
            }
        }
        AfterStep::UnitRows => wn_projected::project(layer.weight, layer.lead)?,
        AfterStep::InitialNorm => {
            let Some(rho) = layer.rho else {
                candle_core::bail!("a weight held at its initial norm has no initial norm");
            };
            nap::project(layer.weight, rho, layer.norm.affine(), layer.lead)?;
        }
    }
    Ok(true)
}
