//! Command-line interface definitions and dispatch.

use clap::{Parser, Subcommand};

use crate::bench;

mod compare;
mod env;
pub mod train;

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
    Train(train::TrainArgs),
    /// Evaluate a saved agent.
    Eval(train::EvalArgs),
    /// Run a comparison grid (normalizations x batch sizes x samplers x envs x seeds).
    Compare(Box<compare::CompareArgs>),
    /// Aggregate finished runs into a report with statistics and plots.
    Report(compare::ReportArgs),
    /// Where each run of a comparison stands: done, running, failed, interrupted, not
    /// started.
    Status(crate::study::status::StatusArgs),
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
    Rollout(env::RolloutArgs),
    /// Measure single-thread stepping speed with random actions.
    Bench(env::BenchArgs),
    /// List the environment ids and their options.
    List,
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Train(args) => {
            crate::run::interrupt::install()?;
            train::train(&args)
        }
        Command::Eval(args) => train::eval(&args),
        Command::Bench(args) => bench::bench(&args),
        Command::Compare(args) => {
            crate::run::interrupt::install()?;
            compare::compare(&args)
        }
        Command::Report(args) => compare::report(&args),
        Command::Status(args) => crate::study::status::status(&args),
        Command::Env { command } => match command {
            EnvCommand::Rollout(args) => env::rollout(&args),
            EnvCommand::Bench(args) => env::bench(&args),
            EnvCommand::List => {
                env::list();
                Ok(())
            }
        },
    }
}
