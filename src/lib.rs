//! normrl: which normalization makes deep Q-learning train best when the data is
//! non-i.i.d. and the batches are small?
//!
//! The root crate holds the command-line program; the environments live in
//! [`normrl_envs`] and the learning in [`normrl_agents`].

pub mod cli;
mod env_cmd;
