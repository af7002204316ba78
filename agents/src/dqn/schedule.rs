//! A linear schedule, for epsilon-greedy exploration.
//!
//! ```
//! use normrl_agents::dqn::LinearSchedule;
//!
//! let eps = LinearSchedule { start: 1.0, end: 0.1, steps: 100 };
//! assert_eq!(eps.at(0), 1.0);
//! assert!((eps.at(50) - 0.55).abs() < 1e-12);
//! assert_eq!(eps.at(1000), 0.1);
//! ```

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinearSchedule {
    pub start: f64,
    pub end: f64,
    /// Steps from `start` to `end`; `end` after that.
    pub steps: u64,
}

/// Epsilon from 1.0 to 0.05 over 10,000 steps: each key may be left out.
impl Default for LinearSchedule {
    fn default() -> Self {
        Self {
            start: 1.0,
            end: 0.05,
            steps: 10_000,
        }
    }
}

impl LinearSchedule {
    pub fn at(&self, step: u64) -> f64 {
        if self.steps == 0 || step >= self.steps {
            return self.end;
        }
        self.start + (self.end - self.start) * step as f64 / self.steps as f64
    }
}
