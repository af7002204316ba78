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
            // 130: stopped by Ctrl-C with a checkpoint written; 75: stopped by a
            // scheduler's signal with a checkpoint written (Slurm is asked to requeue);
            // 3: the run diverged (its summary says where); 2: anything else.
            if let Some(stop) = err.downcast_ref::<normrl::interrupt::Interrupted>() {
                let hint = normrl::interrupt::resume_hint(&err);
                if stop.signal == signal_hook::consts::SIGINT {
                    eprintln!("normrl: {stop}; {hint}");
                    return ExitCode::from(normrl::interrupt::EXIT_SIGINT);
                }
                eprintln!("normrl: {stop}; {}", normrl::interrupt::requeue(&hint));
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
