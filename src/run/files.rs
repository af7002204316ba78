//! The files a run leaves for the tools that watch and merge runs: `result.json` (all
//! that `normrl report` needs of a finished run) and `heartbeat` (when a training run
//! last logged, for `normrl status`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
pub use crate::storage::{host_name, unix_seconds};

/// What a finished run reports (also written to `summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub env: String,
    pub norm: String,
    pub seed: u64,
    pub steps: u64,
    pub episodes: u64,
    pub updates: u64,
    /// `(environment step, mean evaluation return)` for every evaluation.
    pub eval_curve: Vec<(u64, f64)>,
    /// `(environment step, training episode return)` for every finished episode.
    pub train_curve: Vec<(u64, f64)>,
    pub final_eval_return: f64,
    pub wall_seconds: f64,
    pub steps_per_second: f64,
    /// Set when training stopped on a non-finite loss, Q-value or parameter: the run
    /// is over, and reports count it apart instead of averaging its return in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged: Option<Divergence>,
    /// Each diagnostic's `(environment step, value)` curve, by name (`effective_rank`,
    /// `dormant_tau0/fc0`, `q_overestimation`, ...; see `diagnostics.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub diagnostics: BTreeMap<String, Vec<(u64, f64)>>,
    /// Seconds the diagnostics took (of `wall_seconds`).
    #[serde(default)]
    pub diagnostics_seconds: f64,
}

/// Where and how a run diverged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub step: u64,
    /// What was not finite, e.g. `td_loss = NaN` or `parameter fc0.weight`.
    pub what: String,
}

/// A finished run's compact record: everything `normrl report` needs, so that results
/// from many machines merge by copying these files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub normrl_version: String,
    pub host: String,
    /// The matrix products' kernel family on the machine that trained the run
    /// (`normrl_agents::product_kernels`): `avx512`, `avx2`, ... A run retrains bit for
    /// bit where its family is the same; empty in results written before it was kept.
    #[serde(default)]
    pub product_kernels: String,
    /// The comparison's label of the run (`b32-uniform-none`), if it had one.
    pub variant: Option<String>,
    /// The resolved training config, as TOML.
    pub config: String,
    pub summary: RunSummary,
}

impl RunResult {
    pub(crate) fn new(config: &TrainConfig, variant: Option<String>, summary: RunSummary) -> Self {
        Self {
            normrl_version: env!("CARGO_PKG_VERSION").to_string(),
            host: host_name(),
            product_kernels: normrl_agents::product_kernels().to_string(),
            variant,
            config: config.to_toml(),
            summary,
        }
    }
}

/// A finished run's summary: its presence marks the run finished (and final).
pub const SUMMARY_FILE: &str = "summary.json";
/// A finished run's `result.json`.
pub const RESULT_FILE: &str = "result.json";
/// A run directory moved aside because its results were unreadable is renamed
/// `<dir>.damaged-<unix seconds>` (by `compare`, which trains the run again); reports
/// and status skip such directories.
pub const DAMAGED_MARK: &str = ".damaged-";

/// Whether `dir` is a run directory moved aside for its damaged results.
pub fn is_moved_aside(dir: &std::path::Path) -> bool {
    dir.file_name()
        .is_some_and(|n| n.to_string_lossy().contains(DAMAGED_MARK))
}

/// A failed run's last error (removed when the run starts again), for `normrl status`.
pub const ERROR_FILE: &str = "error.txt";
/// A training run's last sign of life (see [`Heartbeat`]).
pub const HEARTBEAT_FILE: &str = "heartbeat";

/// When a run last logged, where: a fresh one means the run is training now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub unix_seconds: f64,
    pub host: String,
    pub pid: u32,
    pub step: u64,
}

/// A run that stopped on a non-finite value: `normrl train` exits with status 3.
#[derive(Debug)]
pub struct Diverged(pub Divergence);

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "diverged at step {}: {} (recorded in summary.json)",
            self.0.step, self.0.what
        )
    }
}

impl std::error::Error for Diverged {}
