//! A layer's weight side, one type for any number of leading axes: a single network's
//! layer (`lead` 0, the kernel's own layout) and a population's (`lead` 1, `[P, out,
//! in]`, each agent's weights its own) hold a [`Weight`]. It is the variable the
//! optimizer steps (plain `w`, or weight norm's `v` with its gains), the rule that keeps
//! it after each step (its `after_step` is in `after_step.rs`, with the rules) and NaP's
//! initial norm where the rule needs one.

use candle_core::{Result, Var};

use super::normalization::copy_var;
use super::parts::AfterStep;
use super::WeightNorm;

/// The weight as the product sees it: `w` itself, or weight norm's `v` and gains.
pub(crate) enum WeightParam {
    Plain(Var),
    Normed(WeightNorm),
}

pub(crate) struct Weight {
    pub(crate) param: WeightParam,
    /// The rule's step after each optimizer step.
    pub(crate) after: AfterStep,
    /// NaP's target: the weight's norm at init (a buffer, `<layer>.rho`).
    pub(crate) rho: Option<Var>,
    /// Leading axes before the weight's own (0 for one network, 1 for a population).
    pub(crate) lead: usize,
}

impl Weight {
    pub(crate) fn new(param: WeightParam, after: AfterStep, lead: usize) -> Self {
        Self {
            param,
            after,
            rho: None,
            lead,
        }
    }

    /// The variable the optimizer steps: `w`, or weight norm's direction `v`.
    pub(crate) fn var(&self) -> &Var {
        match &self.param {
            WeightParam::Plain(w) => w,
            WeightParam::Normed(wn) => &wn.v,
        }
    }

    pub(crate) fn weight_norm(&self) -> Option<&WeightNorm> {
        match &self.param {
            WeightParam::Normed(wn) => Some(wn),
            WeightParam::Plain(_) => None,
        }
    }

    /// The trainable variables, in a fixed order: `w` (or `v`), then the gains.
    pub(crate) fn trainable(&self) -> Vec<&Var> {
        let mut vars = vec![self.var()];
        vars.extend(self.weight_norm().map(|wn| &wn.g));
        vars
    }

    /// An independent copy (a target network's).
    pub(crate) fn copied(&self) -> Result<Self> {
        let param = match &self.param {
            WeightParam::Plain(w) => WeightParam::Plain(copy_var(w)?),
            WeightParam::Normed(wn) => WeightParam::Normed(wn.copied()?),
        };
        Ok(Self {
            param,
            after: self.after,
            rho: self.rho.as_ref().map(copy_var).transpose()?,
            lead: self.lead,
        })
    }
}
