//! Command-line interface definitions and dispatch.

use clap::{Parser, Subcommand};

use crate::env_cmd;

#[derive(Debug, Parser)]
#[command(
    name = "normrl",
    version,
    about = "Normalization studies for deep Q-learning"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with environments directly: roll out a policy, benchmark stepping.
    Env {
        #[command(subcommand)]
        command: EnvCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Play episodes with a simple policy and print their returns.
    Rollout(env_cmd::RolloutArgs),
    /// Measure single-thread stepping speed with random actions.
    Bench(env_cmd::BenchArgs),
    /// List the environment ids and their options.
    List,
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Env { command } => match command {
            EnvCommand::Rollout(args) => env_cmd::rollout(&args),
            EnvCommand::Bench(args) => env_cmd::bench(&args),
            EnvCommand::List => {
                env_cmd::list();
                Ok(())
            }
        },
    }
}
