//! One writer per run directory: a run holds an OS advisory lock (`flock`) on its
//! `lock` file for as long as it trains. The OS releases it when the holder ends, by
//! any means (kill -9 included), so a crashed run needs no clean-up before it resumes;
//! the file itself stays, holding the last holder's pid, host and start, which a
//! refused process names.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub const LOCK_FILE: &str = "lock";

/// Who holds a run's lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    /// Seconds since the Unix epoch when it took the lock.
    pub since: f64,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let since = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(self.since.max(0.0));
        write!(
            f,
            "pid {} on host {} since {}",
            self.pid,
            self.host,
            humantime::format_rfc3339_seconds(since)
        )
    }
}

/// A run directory another process writes: `train` refuses it (exit 2), `compare`
/// skips it.
#[derive(Debug, Clone)]
pub struct Locked {
    pub dir: PathBuf,
    /// `None` when the holder has not written its name yet.
    pub holder: Option<Holder>,
}

impl std::fmt::Display for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = self
            .holder
            .as_ref()
            .map_or_else(|| "another process".to_string(), ToString::to_string);
        write!(
            f,
            "{} is being trained by {who} (it holds {}): one process writes a run at a time; \
             wait for it to end or stop it, then resume",
            self.dir.display(),
            self.dir.join(LOCK_FILE).display()
        )
    }
}

impl std::error::Error for Locked {}

/// A held lock: released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    _file: Option<File>,
}

impl RunLock {
    /// Takes the lock of `dir` (created if absent), or fails at once with [`Locked`].
    /// On a file system without locks it says so and goes on unlocked.
    pub fn acquire(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        // A `status` probe holds a shared lock for a moment: try a few times.
        let mut tries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if tries < 20 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => {
                    let holder = read_holder(&mut file);
                    return Err(Locked {
                        dir: dir.to_path_buf(),
                        holder,
                    }
                    .into());
                }
                Err(TryLockError::Error(e)) if unsupported(&e) => {
                    eprintln!(
                        "note: {} cannot be locked ({e}): nothing stops a second process from writing this run (see docs/cluster.md)",
                        path.display()
                    );
                    return Ok(Self { _file: None });
                }
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("cannot lock {}", path.display()))
                }
            }
        }
        let holder = Holder {
            pid: std::process::id(),
            host: super::host_name(),
            since: super::unix_seconds(),
        };
        let text = serde_json::to_string(&holder)?;
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(text.as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self { _file: Some(file) })
    }
}

/// Who holds the lock of `dir` now, if anyone (`None` also where it cannot tell).
pub fn holder(dir: &Path) -> Option<Holder> {
    let mut file = File::open(dir.join(LOCK_FILE)).ok()?;
    match file.try_lock_shared() {
        Ok(()) => None,
        Err(TryLockError::WouldBlock) => Some(read_holder(&mut file).unwrap_or(Holder {
            pid: 0,
            host: "?".into(),
            since: 0.0,
        })),
        Err(TryLockError::Error(_)) => None,
    }
}

fn read_holder(file: &mut File) -> Option<Holder> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Errors of a file system that has no locks (some network file systems).
fn unsupported(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(37 | 38 | 95)) // ENOLCK, ENOSYS, EOPNOTSUPP
        || e.kind() == std::io::ErrorKind::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock on the same directory is refused with the holder's name while
    /// the first is held, and granted once it is dropped.
    #[test]
    fn one_holder_at_a_time() {
        let dir = std::env::temp_dir().join(format!("normrl-lock-{}", std::process::id()));
        let first = RunLock::acquire(&dir).unwrap();
        let err = RunLock::acquire(&dir).unwrap_err();
        let locked = err.downcast_ref::<Locked>().expect("a Locked error");
        let holder = locked.holder.as_ref().expect("the holder's name");
        assert_eq!(holder.pid, std::process::id());
        assert!(err
            .to_string()
            .contains(&format!("pid {}", std::process::id())));
        assert_eq!(super::holder(&dir).map(|h| h.pid), Some(std::process::id()));
        drop(first);
        assert_eq!(super::holder(&dir), None);
        let _again = RunLock::acquire(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
