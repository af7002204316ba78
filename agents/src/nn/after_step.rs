//! The weight rules' work after an optimizer step ([`AfterStep`]), written once for any
//! leading axes: a single network's layer (`lead` 0: `Layer::after_step`) and a
//! population's (`lead` 1, each agent's weights its own: `PopulationNet`) call
//! [`Weight::after_step`]. Unit rows (`wn_projected.rs`) and NaP's initial norms (`nap.rs`) run
//! every step, in place on the CPU and by tensor ops on a device (inside a captured
//! update); SVB's projection (`svb.rs`) and a bounded batch norm's bound of its gains run
//! every `svb_interval` steps, on the host.

use candle_core::Result;

use super::normalization::Normalization;
use super::parts::AfterStep;
use super::weight::Weight;
use super::{nap, svb, wn_projected, NormConfig};

impl AfterStep {
    /// The rule runs after every step (inside the update; on a device, inside its
    /// captured graph), not at an interval on the host.
    pub(crate) fn every_step(self) -> bool {
        matches!(self, AfterStep::UnitRows | AfterStep::InitialNorm)
    }
}

impl Weight {
    /// The rule's step after optimizer step `updates` (counting from 1), when due, with
    /// the layer's activation normalization `norm` (a bounded batch norm's gains, a
    /// layer norm's gain and offset). Whether it ran.
    pub(crate) fn after_step(
        &self,
        updates: u64,
        config: &NormConfig,
        norm: &dyn Normalization,
    ) -> Result<bool> {
        let (var, lead) = (self.var(), self.lead);
        match self.after {
            AfterStep::Nothing => return Ok(false),
            AfterStep::Svb if !svb::due(updates, config.svb_interval) => return Ok(false),
            AfterStep::Svb => {
                svb::project_var(var, config.svb_eps, lead)?;
                if config.bounds_gains() {
                    norm.bound_gains(config.bbn_eps)?;
                }
            }
            AfterStep::UnitRows => wn_projected::project(var, lead)?,
            AfterStep::InitialNorm => {
                let Some(rho) = &self.rho else {
                    candle_core::bail!("a weight held at its initial norm has no initial norm");
                };
                nap::project(var, rho, norm.affine(), lead)?;
            }
        }
        Ok(true)
    }
}
