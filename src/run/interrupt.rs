//! Stop requests from a scheduler or a person. Slurm sends SIGTERM at a time limit or a
//! preemption (then SIGKILL after its `KillWait`), and SIGUSR1 ahead of the limit when
//! the job asks (`--signal=B:USR1@120`); Ctrl-C sends SIGINT. The handler only records
//! the signal; the training loop reads the record between environment steps, writes a
//! checkpoint and ends with [`Interrupted`]. The program then exits with
//! [`EXIT_REQUEUE`] after asking Slurm to requeue the task, whose next start resumes
//! exactly, or for Ctrl-C with [`EXIT_SIGINT`] and the command that resumes. A second
//! Ctrl-C ends the process at once (the published checkpoints stay intact).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};

/// The exit status of an interrupted run that wrote its checkpoint: "try again"
/// (sysexits' EX_TEMPFAIL). A cluster whose `slurm.conf` lists it in `RequeueExit`
/// requeues on it alone.
pub const EXIT_REQUEUE: u8 = 75;

/// The exit status after Ctrl-C with a checkpoint written: 128 + SIGINT, as a shell
/// reports a program that Ctrl-C ended.
pub const EXIT_SIGINT: u8 = 130;

static RECEIVED: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// Records SIGTERM, SIGUSR1 and SIGINT from now on (for `train` and `compare`; once
/// per process); a second SIGINT exits at once with [`EXIT_SIGINT`].
pub fn install() -> Result<()> {
    if RECEIVED.get().is_some() {
        return Ok(());
    }
    let flag = RECEIVED.get_or_init(|| Arc::new(AtomicUsize::new(0)));
    let interrupted_once = Arc::new(AtomicBool::new(false));
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
    // Handlers run in the order registered: the exit reads the flag the first
    // SIGINT sets after it.
    signal_hook::flag::register_conditional_shutdown(
        SIGINT,
        i32::from(EXIT_SIGINT),
        interrupted_once.clone(),
    )
    .context("cannot install the signal handlers")?;
    signal_hook::flag::register(SIGINT, interrupted_once)
        .context("cannot install the signal handlers")?;
    for signal in [SIGTERM, SIGUSR1, SIGINT] {
        signal_hook::flag::register_usize(signal, flag.clone(), signal as usize)
            .context("cannot install the signal handlers")?;
    }
    Ok(())
}

/// The signal that asked this process to stop, if one did.
#[inline]
pub fn requested() -> Option<i32> {
    let received = RECEIVED.get()?.load(Ordering::Relaxed);
    (received != 0).then_some(received as i32)
}

/// A run stopped by a signal after writing its checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct Interrupted {
    pub signal: i32,
    pub step: u64,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.signal {
            signal_hook::consts::SIGTERM => "SIGTERM",
            signal_hook::consts::SIGUSR1 => "SIGUSR1",
            signal_hook::consts::SIGINT => "SIGINT (Ctrl-C)",
            _ => "a signal",
        };
        write!(
            f,
            "{name} at step {}: a checkpoint is written and the run resumes from it",
            self.step
        )
    }
}

impl std::error::Error for Interrupted {}

/// How to resume after `err`, an [`Interrupted`]: the command a caller put in its
/// context (`normrl train` names its run), else both ways.
pub fn resume_hint(err: &anyhow::Error) -> String {
    match err.chain().next() {
        Some(top) if top.downcast_ref::<Interrupted>().is_none() => top.to_string(),
        _ => "to resume, run the same `normrl compare` again, or `normrl train --resume RUN_DIR`"
            .into(),
    }
}

/// Inside a Slurm job, asks Slurm to requeue this task (the job must allow it:
/// `--requeue`), and says what happened; outside Slurm, says how to resume (`hint`).
pub fn requeue(hint: &str) -> String {
    let Ok(job) = std::env::var("SLURM_JOB_ID") else {
        return format!("not a Slurm job: {hint}");
    };
    // An array task is `<array job>_<index>`; its own job id works as well.
    let id = match (
        std::env::var("SLURM_ARRAY_JOB_ID"),
        std::env::var("SLURM_ARRAY_TASK_ID"),
    ) {
        (Ok(array), Ok(task)) => format!("{array}_{task}"),
        _ => job,
    };
    let out = std::process::Command::new("scontrol")
        .args(["requeue", &id])
        .output();
    match out {
        Ok(o) if o.status.success() => format!("requeued Slurm job {id} (scontrol requeue)"),
        Ok(o) => format!(
            "scontrol requeue {id} failed: {}; exit status {EXIT_REQUEUE} asks the cluster to requeue (RequeueExit)",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run scontrol ({e}); exit status {EXIT_REQUEUE} asks the cluster to requeue (RequeueExit)"),
    }
}
