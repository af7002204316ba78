//! One training run, start to finish: the loop (`train.rs`), populations of runs trained
//! as one, checkpoints, the files a run leaves, its diagnostics, and signals.

pub mod checkpoint;
pub mod diagnostics;
pub mod evaluate;
pub mod files;
pub mod interrupt;
pub(crate) mod periodic;
pub mod population;
pub(crate) mod record;
pub mod train;
