//! The `normrl` command-line program.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = normrl::cli::Cli::parse();
    match normrl::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
