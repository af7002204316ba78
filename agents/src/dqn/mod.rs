//! Deep Q-learning: replay with pluggable samplers, online and target networks, the
//! TD update, epsilon-greedy acting.

mod agent;
mod config;
mod replay;
mod schedule;
mod td_loss;

pub use agent::{Dqn, UpdateInfo};
pub use config::{DqnConfig, Loss, TargetUpdate};
pub use replay::{Batch, FrameEncoding, ReplayBuffer, ReplayError, Sampler};
pub use schedule::LinearSchedule;
pub use td_loss::{mean_taken, td_loss, td_loss_reference};
