//! Deep Q-learning: online and target networks, the TD update, epsilon-greedy acting.
//! Batches come from [`crate::replay`].

mod agent;
mod config;
pub mod distribution;
pub mod distribution_targets;
mod schedule;
pub mod td;
mod td_loss;

pub use agent::{epsilon_greedy, Dqn, Engine, UpdateInfo};
pub use config::{AgentConfig, DqnConfig, Loss, RewardScale, Support, TargetUpdate, ValueLoss};
pub use schedule::LinearSchedule;
pub use td_loss::{
    mean_taken, population_mean_taken, population_td, population_td_loss,
    population_td_loss_tensor_ops, td_loss, td_loss_tensor_ops, TdOutput,
};
