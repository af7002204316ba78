//! normrl: which normalization makes deep Q-learning train best when the data is
//! non-i.i.d. and the batches are small?
//!
//! The root crate holds the configuration, the training loop, logging, checkpoints and
//! the command-line program; the environments live in [`normrl_envs`] and the learning
//! in [`normrl_agents`].

mod bench;
pub mod checkpoint;
pub mod cli;
pub mod compare;
mod compare_cmd;
pub mod config;
pub mod diagnostics;
mod env_cmd;
pub mod hparams;
pub mod interrupt;
pub mod parity;
pub mod plan;
mod plots;
pub mod population;
mod progress;
pub mod report;
pub mod run_files;
pub mod slurm;
pub mod stats;
pub mod status;
pub mod tensorboard;
pub mod train;
pub mod train_cmd;
pub use config::{device_memory, validate};
