//! Whether a comparison's run is finished, read from its files rather than from their
//! presence: a run whose `result.json` or `summary.json` was damaged after it finished
//! (truncated by a file server's crash, a bad copy) would otherwise be skipped as done
//! and then refused by `report`. One damaged file is rewritten from the other, which
//! holds the same summary; a run with neither readable is moved aside and trained again.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::TrainConfig;
use crate::run::files::{RunResult, DAMAGED_MARK, RESULT_FILE, SUMMARY_FILE};
use crate::run::train::RunSummary;
use crate::storage::{read_json, write_atomic};

/// What a run's files say about it.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// Not finished: train or resume it.
    Pending,
    /// Finished, its results readable.
    Done,
    /// Finished; one of its result files was damaged and is rewritten (the message).
    Repaired(String),
    /// Its results are unreadable: the directory was moved aside (the message) and the
    /// run is to be trained again.
    Retrain(String),
}

/// Reads the run in `dir` (labelled `variant` in the comparison) and repairs what it
/// can; see [`Finish`].
pub fn check(dir: &Path, variant: &str) -> Result<Finish> {
    let result = read_json::<RunResult>(&dir.join(RESULT_FILE), "a run result");
    let summary = read_json::<RunSummary>(&dir.join(SUMMARY_FILE), "a run summary");
    match (result, summary) {
        (Ok(None), Ok(None)) => Ok(Finish::Pending),
        (Ok(Some(_)), Ok(_)) | (Ok(None), Ok(Some(_))) => Ok(Finish::Done),
        (Ok(Some(result)), Err(damage)) => {
            let text = serde_json::to_string_pretty(&result.summary)?;
            write_atomic(&dir.join(SUMMARY_FILE), text.as_bytes())?;
            Ok(Finish::Repaired(format!(
                "{damage:#}; rewritten from its result.json"
            )))
        }
        (Err(damage), Ok(Some(summary))) => match result_from(dir, variant, summary) {
            Ok(result) => {
                write_atomic(
                    &dir.join(RESULT_FILE),
                    serde_json::to_string(&result)?.as_bytes(),
                )?;
                Ok(Finish::Repaired(format!(
                    "{damage:#}; rewritten from its summary.json and config.toml"
                )))
            }
            Err(why) => move_aside(dir, &format!("{damage:#}, and {why:#}")),
        },
        (Err(damage), Ok(None)) | (_, Err(damage)) => move_aside(dir, &format!("{damage:#}")),
    }
}

/// The `result.json` the run would have written: its summary, its resolved config and
/// its label.
fn result_from(dir: &Path, variant: &str, summary: RunSummary) -> Result<RunResult> {
    let config = TrainConfig::load(&dir.join("config.toml"), &[])?;
    Ok(RunResult::new(&config, Some(variant.to_string()), summary))
}

/// Moves `dir` to `<dir>.damaged-<unix seconds>`, keeping what was there for a look.
fn move_aside(dir: &Path, damage: &str) -> Result<Finish> {
    let mut aside = dir.as_os_str().to_owned();
    aside.push(format!(
        "{DAMAGED_MARK}{}",
        crate::storage::unix_seconds() as u64
    ));
    let aside = PathBuf::from(aside);
    match std::fs::rename(dir, &aside) {
        Ok(()) => Ok(Finish::Retrain(format!(
            "{damage}; moved to {} and trained again",
            aside.display()
        ))),
        // Another invocation moved it first: the run is pending here too.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Finish::Pending),
        Err(e) => Err(e).with_context(|| format!("cannot move {} aside", dir.display())),
    }
}
