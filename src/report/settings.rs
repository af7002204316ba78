//! What a report is asked for (a comparison's `[report]` table): the baseline, the
//! thresholds and score ranges per environment. Here, below `study/`, which reads it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Random and reference scores of one environment, for normalized scores.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScoreRange {
    pub random: f64,
    pub reference: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReportConfig {
    /// The variant the others are compared with (probability of improvement).
    pub baseline: Option<String>,
    /// Return that counts as solved, for steps-to-threshold (per environment id).
    pub thresholds: BTreeMap<String, f64>,
    /// Score ranges per environment id; missing ones use built-in random scores and
    /// the best variant's mean as the reference.
    pub scores: BTreeMap<String, ScoreRange>,
}

impl ReportConfig {
    /// Ranges and thresholds a report can use: finite, each range rising (an empty or
    /// reversed one would make every normalized score 0, or flip its sign).
    pub fn check(&self) -> anyhow::Result<()> {
        for (env, r) in &self.scores {
            if !(r.random.is_finite() && r.reference.is_finite() && r.random < r.reference) {
                anyhow::bail!(
                    "report.scores.\"{env}\" = {{ random = {}, reference = {} }}: both must be finite numbers with random below reference",
                    r.random,
                    r.reference
                );
            }
        }
        for (env, t) in &self.thresholds {
            if !t.is_finite() {
                anyhow::bail!("report.thresholds.\"{env}\" = {t} must be a finite number");
            }
        }
        Ok(())
    }
}
