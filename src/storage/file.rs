//! [`CheckedFile`]: a buffered file that keeps the OS's error, hashes what it writes,
//! and syncs before it is done; and the seam that makes a write fail on purpose.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xxhash_rust::xxh3::Xxh3;

/// What a finished file holds: its length and its XXH3-64 checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    pub bytes: u64,
    pub xxh3: u64,
}

impl Digest {
    /// The digest of `bytes` (the same as a [`CheckedFile`] that wrote them).
    pub fn of_reader(mut reader: impl io::Read) -> io::Result<Self> {
        let mut hasher = Xxh3::new();
        let mut buf = vec![0; 1 << 20];
        let mut bytes = 0;
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(Self {
                    bytes,
                    xxh3: hasher.digest(),
                });
            }
            hasher.update(&buf[..n]);
            bytes += n as u64;
        }
    }
}

/// A file being written. Serializers report a failed write in their own words
/// (postcard: "The serialize buffer is full"); [`CheckedFile::blame`] puts the OS's
/// error it kept in their place, with the file's name.
pub struct CheckedFile {
    out: BufWriter<Tap>,
    /// The name errors give: the file's published path, not its temporary one.
    shown: PathBuf,
}

/// Below the buffer, so that it sees large writes: the hash, the count, the fault seam
/// and the first error.
struct Tap {
    file: File,
    hasher: Xxh3,
    bytes: u64,
    error: Option<io::Error>,
}

impl Write for Tap {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match injected_fault().map_or_else(|| self.file.write(buf), Err) {
            Ok(n) => {
                self.hasher.update(&buf[..n]);
                self.bytes += n as u64;
                Ok(n)
            }
            Err(e) => {
                let copy = match e.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(e.kind(), e.to_string()),
                };
                self.error.get_or_insert(e);
                Err(copy)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl CheckedFile {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> Result<Self> {
        Self::create_for(path, path)
    }

    /// Creates `path`, a temporary file that will become `shown`.
    pub fn create_for(path: &Path, shown: &Path) -> Result<Self> {
        let file = File::create(path).with_context(|| cannot_write(shown))?;
        let tap = Tap {
            file,
            hasher: Xxh3::new(),
            bytes: 0,
            error: None,
        };
        Ok(Self {
            // Large writes: a checkpoint's replay can be gigabytes.
            out: BufWriter::with_capacity(1 << 18, tap),
            shown: shown.to_path_buf(),
        })
    }

    /// `result` of writing into this file, its error replaced by the OS's where a
    /// write failed underneath (the serializer's own wording hides the cause).
    pub fn blame<T, E>(&mut self, result: std::result::Result<T, E>) -> Result<T>
    where
        E: Into<anyhow::Error>,
    {
        result.map_err(|e| match self.out.get_mut().error.take() {
            Some(io) => anyhow::Error::new(io).context(cannot_write(&self.shown)),
            None => e.into().context(cannot_write(&self.shown)),
        })
    }

    /// Flushes and syncs the file: its digest once it is on the disk.
    pub fn finish(mut self) -> Result<Digest> {
        let flushed = self.out.flush();
        self.blame(flushed)?;
        let tap = self.out.get_ref();
        tap.file
            .sync_all()
            .with_context(|| cannot_write(&self.shown))?;
        Ok(Digest {
            bytes: tap.bytes,
            xxh3: tap.hasher.digest(),
        })
    }
}

impl Write for CheckedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn cannot_write(path: &Path) -> String {
    format!("cannot write {}", path.display())
}

thread_local! {
    /// The write (1: the next) that fails, and with which OS error; see
    /// [`fail_write_at`].
    static FAULT: Cell<Option<(u64, i32)>> = const { Cell::new(None) };
}

/// Makes the `n`-th write to the OS of this thread from now (1: the next) fail with OS
/// error `code` (28: no space left on device, 30: read-only file system, 5: I/O
/// error), once: the seam through which tests fill the disk at a chosen write. Per
/// thread, because tests run side by side in one process.
#[doc(hidden)]
pub fn fail_write_at(n: u64, code: i32) {
    FAULT.with(|f| f.set((n > 0).then_some((n, code))));
}

fn injected_fault() -> Option<io::Error> {
    FAULT.with(|f| {
        let (n, code) = f.get()?;
        if n > 1 {
            f.set(Some((n - 1, code)));
            return None;
        }
        f.set(None);
        Some(io::Error::from_raw_os_error(code))
    })
}
