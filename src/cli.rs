//! Command-line interface definitions and dispatch.

use clap::{Parser, Subcommand};

use crate::{bench, compare_cmd, env_cmd, train_cmd};

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
    /// Train a DQN agent from a config file (or resume an interrupted run).
    Train(train_cmd::TrainArgs),
    /// Evaluate a saved agent.
    Eval(train_cmd::EvalArgs),
    /// Run a comparison grid (normalizations x batch sizes x samplers x envs x seeds).
    Compare(Box<compare_cmd::CompareArgs>),
    /// Aggregate finished runs into a report with statistics and plots.
    Report(compare_cmd::ReportArgs),
    /// Where each run of a comparison stands: done, running, failed, interrupted, not
    /// started.
    Status(crate::status::StatusArgs),
    /// Benchmark updates, acting, replay sampling and end-to-end training.
    Bench(bench::BenchArgs),
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
        Command::Train(args) => {
            crate::interrupt::install()?;
            train_cmd::train(&args)
        }
        Command::Eval(args) => train_cmd::eval(&args),
        Command::Bench(args) => bench::bench(&args),
        Command::Compare(args) => {
            crate::interrupt::install()?;
            compare_cmd::compare(&args)
        }
        Command::Report(args) => compare_cmd::report(&args),
        Command::Status(args) => crate::status::status(&args),
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
