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
            // 75: stopped by a signal with a checkpoint written (Slurm is asked to
            // requeue); 3: the run diverged (its summary says where); 2: anything else.
            if let Some(stop) = err.downcast_ref::<normrl::interrupt::Interrupted>() {
                eprintln!("normrl: {stop}; {}", normrl::interrupt::requeue());
                return ExitCode::from(normrl::interrupt::EXIT_REQUEUE);
            }
            eprintln!("error: {err:#}");
            match err.downcast_ref::<normrl::run::files::Diverged>() {
                Some(_) => ExitCode::from(3),
                None => ExitCode::from(2),
            }
        }
    }
}
