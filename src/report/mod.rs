//! `normrl report`: aggregate statistics of finished runs (per environment and variant,
//! and across environments on normalized scores), written as Markdown, CSV and JSON,
//! with rliable's figures and the study's own (return against batch size, and the
//! change from uniform to correlated batches).

pub mod aggregate;
mod charts;
pub mod grid;
#[cfg(test)]
mod layout_tests;
mod leave_out;
mod markdown;
mod missing;
mod plots;
mod records;
mod samplers;
#[cfg(test)]
mod samplers_tests;
mod scale;
pub mod settings;
pub mod stats;
mod summary;

use std::path::Path;

use anyhow::{Context, Result};

use crate::storage::write_atomic;
pub use aggregate::{AggregateStats, BatchPoint, Estimate};
pub use leave_out::{leave_out, LeftOut};
pub use markdown::markdown;
pub use records::{load_runs, Loaded, RunRecord, VariantStats};
pub use samplers::SamplerChange;
pub use summary::{all_score_ranges, build, Report};

/// Writes `report` into `out`: `report.md`, `runs.csv`, `summary.csv`, `report.json`
/// and the charts.
pub fn write(report: &Report, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_atomic(&out.join("report.md"), markdown(report).as_bytes())?;
    write_atomic(&out.join("runs.csv"), markdown::csv_runs(report).as_bytes())?;
    write_atomic(
        &out.join("summary.csv"),
        markdown::csv_summary(report).as_bytes(),
    )?;
    write_atomic(
        &out.join("report.json"),
        serde_json::to_string_pretty(report)?.as_bytes(),
    )?;
    charts::write(report, out)
}
