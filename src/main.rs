//! The `normrl` command-line program.

use std::process::ExitCode;

use clap::Parser;

// Small networks allocate and free the same tensor sizes every update; glibc returns
// large blocks to the OS each time (page faults on every reuse), mimalloc keeps them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = normrl::cli::Cli::parse();
    match normrl::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            // 3: the run diverged (its summary says where); 2: anything else.
            match err.downcast_ref::<normrl::train_cmd::Diverged>() {
                Some(_) => ExitCode::from(3),
                None => ExitCode::from(2),
            }
        }
    }
}
