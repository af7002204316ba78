//! normrl: which normalization makes deep Q-learning train best when the data is
//! non-i.i.d. and the batches are small?
//!
//! The root crate holds the configuration, the training loop, logging, checkpoints and
//! the command-line program; the environments live in [`normrl_envs`] and the learning
//! in [`normrl_agents`].

mod bench;
pub mod cli;
pub mod config;
pub mod logging;
pub mod report;
pub mod run;
pub mod storage;
pub mod study;

// The paths the library's users and tests know.
pub use config::{device_memory, validate};
pub use run::{checkpoint, interrupt, population, train};
pub use study::compare;
