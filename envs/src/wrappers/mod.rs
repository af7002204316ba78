//! Wrappers that add behaviour around any [`Env`](crate::Env).

mod monitor;
mod time_limit;

pub use monitor::Monitor;
pub use time_limit::TimeLimit;
