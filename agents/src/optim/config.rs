//! Optimizer settings.

use serde::{Deserialize, Serialize};

use crate::check::{non_negative, positive};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// Adam (AdamW with weight decay 0), PyTorch's formulation.
    Adam,
    /// RMSprop, PyTorch's formulation (centered as in the MinAtar baselines by default).
    Rmsprop,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    /// Base learning rate.
    pub lr: f64,
    /// Adam's beta1 and beta2.
    pub betas: (f64, f64),
    /// Adam's epsilon.
    pub adam_eps: f64,
    /// RMSprop's smoothing constant (PyTorch's `alpha`).
    pub rms_alpha: f64,
    /// RMSprop's epsilon.
    pub rms_eps: f64,
    /// RMSprop subtracts the squared mean gradient (centered).
    pub centered: bool,
    /// Clip the global gradient norm to this value; 0 disables clipping.
    pub max_grad_norm: f64,
    /// How the learning rate changes over updates (constant unless set).
    pub lr_schedule: LrSchedule,
}

/// The learning rate's schedule over optimizer updates (`optimizer.lr_schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    /// `lr` at every update.
    #[default]
    Constant,
    /// `lr` at the first update, falling linearly to `lr * to` at update `updates + 1`
    /// and staying there (Normalize-and-Project pairs its projection with such a decay).
    Linear { to: f64, updates: u64 },
}

impl LrSchedule {
    /// The factor on `lr` at update `t` (1 for the first).
    pub fn factor(&self, t: u64) -> f64 {
        match *self {
            Self::Constant => 1.0,
            Self::Linear { to, updates } => {
                let done = (t.saturating_sub(1) as f64 / updates.max(1) as f64).min(1.0);
                1.0 - (1.0 - to) * done
            }
        }
    }
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            kind: OptimizerKind::Adam,
            lr: 1e-3,
            betas: (0.9, 0.999),
            adam_eps: 1e-8,
            rms_alpha: 0.95,
            rms_eps: 0.01,
            centered: true,
            max_grad_norm: 10.0,
            lr_schedule: LrSchedule::Constant,
        }
    }
}

impl OptimizerConfig {
    /// Range problems, each as `(field, what is allowed)`.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = vec![];
        if !positive(self.lr) {
            p.push(("lr", "a positive number"));
        }
        let (b1, b2) = self.betas;
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            p.push(("betas", "two numbers in [0, 1)"));
        }
        if !positive(self.adam_eps) {
            p.push(("adam_eps", "a positive number"));
        }
        if !(0.0..1.0).contains(&self.rms_alpha) {
            p.push(("rms_alpha", "a number in [0, 1)"));
        }
        if !positive(self.rms_eps) {
            p.push(("rms_eps", "a positive number"));
        }
        if !non_negative(self.max_grad_norm) {
            p.push(("max_grad_norm", "a non-negative number (0 = no clipping)"));
        }
        if let LrSchedule::Linear { to, updates } = self.lr_schedule {
            if !(0.0..=1.0).contains(&to) || updates == 0 {
                p.push((
                    "lr_schedule",
                    "{ type = \"linear\", to = a factor in [0, 1], updates = a positive count }",
                ));
            }
        }
        p
    }
}
