//! How a run's files reach the disk: through [`CheckedFile`], so that a failed write
//! names its file and the OS's reason (`No space left on device`) instead of a
//! serializer's wording, every file is synced before it is published, and its checksum
//! is known; and the lock that keeps one writer per run directory ([`lock`]).
//!
//! Below `run/`, `logging/`, `study/` and `report/`: each writes through it, and it
//! imports none of them.

mod file;
pub mod lock;

use std::path::Path;

use anyhow::{Context, Result};

pub use file::{fail_write_at, CheckedFile, Digest};

/// Writes `bytes` to `path` through a temporary file and a rename: a reader sees the
/// old file or the new one, never a part. On a failure the temporary file goes and
/// the error names `path` and the OS's reason.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = write_temporary(path, bytes)?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot move {} into place", path.display())
    })
}

/// Writes `bytes` to `path` as [`write_atomic`] does, unless `path` exists: then
/// nothing is written and the answer is `false`. Of several processes (on one host or
/// on hosts sharing the disk) that race to create the same file, exactly one wins: the
/// publishing step is a hard link, which never replaces a file.
pub fn create_atomic(path: &Path, bytes: &[u8]) -> Result<bool> {
    let tmp = write_temporary(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot move {} into place", path.display())),
    }
}

/// `bytes` in a synced temporary file beside `path`, named after this host, process
/// and call so that no other writer (another process, another host on a shared disk)
/// can be writing the same one.
fn write_temporary(path: &Path, bytes: &[u8]) -> Result<std::path::PathBuf> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path
        .file_name()
        .map_or_else(|| "file".to_string(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.{call}.tmp",
        sanitize(&host_name()),
        std::process::id()
    ));
    let written = CheckedFile::create_for(&tmp, path).and_then(|mut file| {
        let result = std::io::Write::write_all(&mut file, bytes);
        file.blame(result)?;
        file.finish()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// The JSON file at `path` as a `T`, or `None` if there is no file; a file that is not
/// a `T` is an error naming it as `what` ("a run summary").
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<Option<T>> {
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value =
        serde_json::from_str(&text).with_context(|| format!("{} is not {what}", path.display()))?;
    Ok(Some(value))
}

/// Syncs a directory, so that the renames into it survive a crash of the machine.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

/// `bytes` for people: `1.23 MB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} bytes"),
        _ => format!("{value:.2} {}", UNITS[unit]),
    }
}

/// A short, directory-safe form of `s`: ASCII letters, digits, `.`, `-` and `_` kept,
/// anything else `_`, none at either end.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .trim_matches('_')
        .to_string()
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name.
pub fn host_name() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The disk fills at the first write: the error names the file and the OS's
    /// reason, and neither the file nor its temporary copy is left.
    #[test]
    fn a_full_disk_names_the_file_and_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("normrl-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("summary.json");
        fail_write_at(1, 28);
        let err = write_atomic(&path, b"{}").unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("summary.json"), "{text}");
        assert!(text.contains("No space left on device"), "{text}");
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // The fault was used up: the next write succeeds.
        write_atomic(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two writers of one file never share a temporary file, and of two creators
    /// exactly one publishes: the other is told, and the file is the first one's.
    #[test]
    fn concurrent_writers_do_not_collide() {
        let dir = std::env::temp_dir().join(format!("normrl-atomic-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plan.json");
        let a = write_temporary(&path, b"a").unwrap();
        let b = write_temporary(&path, b"b").unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), b"a");
        assert!(create_atomic(&path, b"first").unwrap());
        assert!(!create_atomic(&path, b"second").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        write_atomic(&path, b"third").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"third");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 3, "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(999), "999 bytes");
        assert_eq!(human_bytes(1_234_567), "1.23 MB");
    }
}
