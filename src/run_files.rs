//! The files a run leaves for the tools that watch and merge runs: `result.json` (all
//! that `normrl report` needs of a finished run) and `heartbeat` (when a training run
//! last logged, for `normrl status`).

use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::train::RunSummary;

/// A finished run's compact record: everything `normrl report` needs, so that results
/// from many machines merge by copying these files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub normrl_version: String,
    pub host: String,
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

/// This machine's name.
pub fn host_name() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}
