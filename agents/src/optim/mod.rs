//! Optimizers for Q-networks: Adam and (centered) RMSprop with per-group learning
//! rates (weight norm's `g`), a learning-rate schedule, and global gradient-norm
//! clipping.
//!
//! On the CPU one fused loop updates each variable in place from its gradient; on
//! other devices the same arithmetic runs as tensor ops (also kept as the reference
//! the fused loop is tested against). The fused loop sets state values below 1e-36 to
//! 0 rather than let them decay through the CPU's slow subnormal range.

pub mod clip;
mod config;
mod optimizer;
mod staggered;

pub use config::{LrSchedule, OptimizerConfig, OptimizerKind};
pub use optimizer::{Gradients, Optimizer};
