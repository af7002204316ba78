//! Optimizers for Q-networks: Adam and (centered) RMSprop with per-group learning
//! rates (weight norm's `g`) and global gradient-norm clipping.
//!
//! On the CPU one fused loop updates each variable in place from its gradient; on
//! other devices the same arithmetic runs as tensor ops (also kept as the reference
//! the fused loop is tested against).

mod config;
mod optimizer;

pub use config::{OptimizerConfig, OptimizerKind};
pub use optimizer::Optimizer;
