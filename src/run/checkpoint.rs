//! Checkpoints: network weights and optimizer state as safetensors (readable by other
//! tools), the rest of the run's state (counters, random streams, environment, replay)
//! as one binary file, and `manifest.json` with each file's length and XXH3-64
//! checksum. Each checkpoint is written to a temporary directory (every file synced,
//! the manifest last), renamed into place, and then published by atomically replacing
//! the `latest` pointer, so an interrupted write never leaves a half checkpoint behind;
//! a resume verifies the checksums and falls back to the previous checkpoint when a
//! file was damaged after it was written.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::storage::{human_bytes, read_json, sync_dir, write_atomic, CheckedFile, Digest};

pub const LATEST: &str = "latest";
/// Each file's length and checksum, written last: a checkpoint with it is complete.
pub const MANIFEST: &str = "manifest.json";
/// The files every checkpoint holds.
const FILES: [&str; 4] = [
    "online.safetensors",
    "target.safetensors",
    "optimizer.safetensors",
    "state.bin",
];

/// Writes a checkpoint's `state.bin` into the stream it is given.
pub type StateWriter<'a> = Box<dyn Fn(&mut dyn std::io::Write) -> Result<()> + 'a>;

/// The files of one checkpoint, by name.
pub struct CheckpointFiles<'a> {
    pub tensors: Vec<(&'static str, HashMap<String, Tensor>)>,
    /// Writes `state.bin` (streamed: a replay buffer can be gigabytes, so it is not
    /// first copied into memory).
    pub state: StateWriter<'a>,
}

/// `manifest.json`: what each file of a checkpoint held when it was written, and a
/// checksum of that list itself (a damaged manifest names itself, not a file it
/// lists).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub step: u64,
    pub files: BTreeMap<String, FileEntry>,
    /// XXH3-64 of `files` as compact JSON.
    pub check: String,
}

impl Manifest {
    fn check_of(files: &BTreeMap<String, FileEntry>) -> Result<String> {
        let text = serde_json::to_string(files)?;
        Ok(format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(text.as_bytes())
        ))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub bytes: u64,
    /// XXH3-64, as 16 hexadecimal digits.
    pub xxh3: String,
}

impl FileEntry {
    fn of(digest: Digest) -> Self {
        Self {
            bytes: digest.bytes,
            xxh3: format!("{:016x}", digest.xxh3),
        }
    }
}

/// Saves a checkpoint for `step` under `run_dir/checkpoints/` and points `latest` at
/// it; then keeps the `keep` newest checkpoints (all if `None`). A failure removes the
/// partial checkpoint (its space is freed), leaves the published ones as they were,
/// and says which file failed, why, and how much space the checkpoint needs.
pub fn save(
    run_dir: &Path,
    step: u64,
    files: &CheckpointFiles<'_>,
    keep: Option<usize>,
) -> Result<PathBuf> {
    let root = run_dir.join("checkpoints");
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = format!("step-{step:012}");
    let tmp = root.join(format!("{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    let mut sizes = vec![];
    if let Err(e) = write_files(&tmp, step, files, &mut sizes) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.context(not_written(run_dir, step, files, &sizes)));
    }
    let dir = root.join(&name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("cannot move {} into place", dir.display()))?;
    sync_dir(&root)?;
    write_atomic(&root.join(LATEST), name.as_bytes())?;
    if let Some(keep) = keep {
        prune(run_dir, keep);
    }
    Ok(dir)
}

/// Writes every file of a checkpoint into `tmp`, the manifest last; `sizes` gets each
/// file's length as it is known.
fn write_files(
    tmp: &Path,
    step: u64,
    files: &CheckpointFiles<'_>,
    sizes: &mut Vec<u64>,
) -> Result<()> {
    std::fs::create_dir_all(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut listed = BTreeMap::new();
    for (file, tensors) in &files.tensors {
        let bytes = safetensors_bytes(tensors)?;
        sizes.push(bytes.len() as u64);
        let path = tmp.join(format!("{file}.safetensors"));
        let mut out = CheckedFile::create(&path)?;
        let written = std::io::Write::write_all(&mut out, &bytes);
        out.blame(written)?;
        let digest = out.finish()?;
        listed.insert(format!("{file}.safetensors"), FileEntry::of(digest));
    }
    let path = tmp.join("state.bin");
    let mut out = CheckedFile::create(&path)?;
    let written = (files.state)(&mut out);
    out.blame(written)?;
    let digest = out.finish()?;
    sizes.push(digest.bytes);
    listed.insert("state.bin".into(), FileEntry::of(digest));
    let manifest = Manifest {
        step,
        check: Manifest::check_of(&listed)?,
        files: listed,
    };
    let mut out = CheckedFile::create(&tmp.join(MANIFEST))?;
    let written = serde_json::to_writer_pretty(&mut out, &manifest);
    out.blame(written)?;
    out.finish()?;
    sync_dir(tmp)
}

/// The safetensors file of `tensors` (moved to the CPU), in memory: networks are small
/// beside the replay, and the checkpoint's size is then known before it is written.
fn safetensors_bytes(tensors: &HashMap<String, Tensor>) -> Result<Vec<u8>> {
    let on_cpu: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    Ok(safetensors::tensor::serialize(&on_cpu, None)?)
}

/// The context of a checkpoint that failed: the space it needs (its state measured
/// again into a counter, which writes nothing), and what is left to resume from.
fn not_written(run_dir: &Path, step: u64, files: &CheckpointFiles<'_>, sizes: &[u64]) -> String {
    let mut counter = Counter(0);
    let state = match (files.state)(&mut counter) {
        Ok(()) => counter.0,
        Err(_) => 0,
    };
    let tensors: u64 = sizes.iter().take(files.tensors.len()).sum();
    let needed = match tensors {
        0 => String::new(),
        _ => format!(" (it needs {})", human_bytes(tensors + state)),
    };
    let kept = match complete(run_dir).last() {
        Some((s, _)) => format!("the run's last checkpoint is at step {s}"),
        None => "the run has no checkpoint yet".into(),
    };
    format!("the checkpoint at step {step} was not written{needed}; {kept}")
}

/// Counts what is written to it.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Removes every checkpoint of the run but the `keep` newest complete ones, and any
/// partial one.
pub fn prune(run_dir: &Path, keep: usize) {
    let kept: Vec<PathBuf> = complete(run_dir)
        .into_iter()
        .rev()
        .take(keep)
        .map(|(_, dir)| dir)
        .collect();
    let root = run_dir.join("checkpoints");
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let other = entry.file_name().to_string_lossy().into_owned();
        if other.starts_with("step-") && !kept.contains(&entry.path()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Every complete checkpoint of the run (one with its manifest, or from before
/// manifests, its `state.bin`), by step.
pub fn complete(run_dir: &Path) -> Vec<(u64, PathBuf)> {
    let root = run_dir.join("checkpoints");
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            let dir = entry.path();
            let done = dir.join(MANIFEST).exists() || dir.join("state.bin").exists();
            done.then_some((step, dir))
        })
        .collect();
    found.sort();
    found
}

/// The directory of the newest complete checkpoint of a run, if any (not verified:
/// see [`newest_valid`]).
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>> {
    Ok(complete(run_dir).pop().map(|(_, dir)| dir))
}

/// How a checkpoint passed [`verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// Every file matches its manifest.
    Checksums,
    /// Written before checkpoints had manifests: nothing to check.
    NoManifest,
}

/// Checks every file of the checkpoint in `dir` against its manifest: the error names
/// the first file that differs.
pub fn verify(dir: &Path) -> Result<Verified> {
    let Some(manifest) = read_json::<Manifest>(&dir.join(MANIFEST), "a checkpoint manifest")?
    else {
        return Ok(Verified::NoManifest);
    };
    let own = dir.join(MANIFEST);
    if Manifest::check_of(&manifest.files)? != manifest.check {
        bail!(
            "{} is damaged: its list of files fails its checksum",
            own.display()
        );
    }
    for file in FILES {
        let Some(expected) = manifest.files.get(file) else {
            bail!("{} does not list {file}", own.display());
        };
        let path = dir.join(file);
        let reader = std::fs::File::open(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let found = Digest::of_reader(std::io::BufReader::new(reader))
            .with_context(|| format!("cannot read {}", path.display()))?;
        if FileEntry::of(found) != *expected {
            bail!(
                "{} is damaged: {} bytes with checksum {:016x}, where the checkpoint wrote {} bytes with checksum {}",
                path.display(),
                found.bytes,
                found.xxh3,
                expected.bytes,
                expected.xxh3
            );
        }
    }
    Ok(Verified::Checksums)
}

/// The newest checkpoint of the run that verifies, if it has any: each newer one that
/// does not is named on stderr with what the run falls back to. An error when the run
/// has checkpoints and none verifies.
pub fn newest_valid(run_dir: &Path) -> Result<Option<PathBuf>> {
    let all = complete(run_dir);
    let mut damaged = vec![];
    for (step, dir) in all.iter().rev() {
        match verify(dir) {
            Ok(how) => {
                note_unverified(dir, how);
                return Ok(Some(dir.clone()));
            }
            Err(e) => {
                warn_damaged(
                    *step,
                    &e,
                    all.iter().rev().map(|(s, _)| *s).find(|s| s < step),
                );
                damaged.push(format!("{e:#}"));
            }
        }
    }
    if damaged.is_empty() {
        return Ok(None);
    }
    bail!(
        "{} has no valid checkpoint to resume from: {}",
        run_dir.display(),
        damaged.join("; ")
    )
}

/// The one-line note for a checkpoint without checksums.
pub fn note_unverified(dir: &Path, how: Verified) {
    if how == Verified::NoManifest {
        eprintln!(
            "note: {} has no checksums (written by an older normrl): loaded unverified",
            dir.display()
        );
    }
}

/// Says that the checkpoint at `step` is damaged, and which one is tried instead.
pub fn warn_damaged(step: u64, error: &anyhow::Error, instead: Option<u64>) {
    let instead = instead.map_or("no earlier checkpoint to fall back to".to_string(), |s| {
        format!("falling back to the checkpoint at step {s}")
    });
    eprintln!("warning: the checkpoint at step {step} fails its check: {error:#}; {instead}");
}

/// Loads `name.safetensors` from a checkpoint directory onto `device`.
pub fn load_tensors(dir: &Path, name: &str, device: &Device) -> Result<HashMap<String, Tensor>> {
    let path = dir.join(format!("{name}.safetensors"));
    candle_core::safetensors::load(&path, device)
        .with_context(|| format!("cannot read {}", path.display()))
}

/// An agent of `config` on `device` with the online network of the checkpoint in
/// `ckpt` (a `checkpoints/step-*` directory): for evaluations.
pub fn agent_from_checkpoint(
    config: &crate::config::TrainConfig,
    ckpt: &Path,
    device: &candle_core::Device,
) -> Result<normrl_agents::dqn::Dqn> {
    let env = normrl_envs::make(&config.env.id)?;
    let agent = normrl_agents::dqn::Dqn::new(
        config.agent(),
        &env.observation_space().shape,
        env.action_space().n,
        0,
        device,
    )?;
    let online = load_tensors(ckpt, "online", device)?;
    // candle's error carries a backtrace when RUST_BACKTRACE is set: its first line is
    // the message.
    agent.online().store().load_map(&online).map_err(|e| {
        let cause = e.to_string();
        anyhow::anyhow!(
            "{} does not hold a network of this run's config (network.architecture, norm.weight, norm.activation): {}",
            ckpt.display(),
            cause.lines().next().unwrap_or_default()
        )
    })?;
    Ok(agent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("normrl-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Three small networks and a `state.bin` of 600 kB: larger than the write
    /// buffer, so that it reaches the OS in several writes.
    fn files(value: f32) -> CheckpointFiles<'static> {
        let net = |v: f32| {
            let t = Tensor::full(v, (4, 3), &Device::Cpu).unwrap();
            HashMap::from([("fc0.weight".to_string(), t)])
        };
        CheckpointFiles {
            tensors: vec![
                ("online", net(value)),
                ("target", net(value + 1.0)),
                ("optimizer", net(value + 2.0)),
            ],
            state: Box::new(move |out: &mut dyn std::io::Write| {
                out.write_all(&vec![value as u8; 600_000])?;
                Ok(())
            }),
        }
    }

    fn latest_name(run: &Path) -> String {
        std::fs::read_to_string(run.join("checkpoints").join(LATEST)).unwrap()
    }

    /// The disk fills at each write of a checkpoint in turn: every time the error
    /// names the file and the OS's reason and the checkpoint's size, the partial
    /// checkpoint is gone, and the published one still verifies and stays `latest`.
    #[test]
    fn a_full_disk_at_any_write_keeps_the_last_checkpoint() {
        let run = temp("full");
        save(&run, 100, &files(1.0), Some(2)).unwrap();
        let mut failed = 0;
        for n in 1.. {
            crate::storage::fail_write_at(n, 28);
            let Err(e) = save(&run, 200, &files(2.0), Some(2)) else {
                break;
            };
            failed += 1;
            let text = format!("{e:#}");
            if text.contains("checkpoints/latest") {
                // The last write: the checkpoint is complete, only its pointer is
                // not, and the directory says which is newest.
                assert!(text.contains("No space left on device"), "{text}");
                let (step, dir) = complete(&run).pop().unwrap();
                assert_eq!((step, verify(&dir).unwrap()), (200, Verified::Checksums));
                continue;
            }
            assert!(text.contains("No space left on device"), "{text}");
            assert!(text.contains("step-000000000200.tmp/"), "{text}");
            assert!(
                text.contains("the checkpoint at step 200 was not written (it needs 6"),
                "{text}"
            );
            assert!(text.contains("last checkpoint is at step 100"), "{text}");
            assert_eq!(complete(&run).len(), 1);
            assert!(!run.join("checkpoints/step-000000000200.tmp").exists());
            assert_eq!(latest_name(&run), "step-000000000100");
            assert_eq!(verify(&complete(&run)[0].1).unwrap(), Verified::Checksums);
        }
        crate::storage::fail_write_at(0, 0);
        // Four files and the manifest, state.bin in at least two writes.
        assert!(failed >= 6, "{failed} writes");
        assert_eq!(latest_name(&run), "step-000000000200");
        std::fs::remove_dir_all(&run).unwrap();
    }

    /// One flipped byte in any file of the newest checkpoint: the check names it and
    /// the run falls back to the one before; with both damaged there is none to use.
    #[test]
    fn a_flipped_byte_in_any_file_is_caught() {
        let run = temp("flip");
        let older = save(&run, 100, &files(1.0), Some(2)).unwrap();
        let newer = save(&run, 200, &files(2.0), Some(2)).unwrap();
        let flip = |path: &Path| {
            let mut bytes = std::fs::read(path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x10;
            std::fs::write(path, bytes).unwrap();
        };
        for file in FILES.into_iter().chain([MANIFEST]) {
            let path = newer.join(file);
            let good = std::fs::read(&path).unwrap();
            flip(&path);
            let text = format!("{:#}", verify(&newer).unwrap_err());
            assert!(text.contains(file), "{file}: {text}");
            assert_eq!(newest_valid(&run).unwrap(), Some(older.clone()), "{file}");
            std::fs::write(&path, good).unwrap();
            assert_eq!(newest_valid(&run).unwrap(), Some(newer.clone()));
        }
        flip(&newer.join("state.bin"));
        flip(&older.join("online.safetensors"));
        let text = format!("{:#}", newest_valid(&run).unwrap_err());
        assert!(text.contains("has no valid checkpoint"), "{text}");
        assert!(
            text.contains("online.safetensors") && text.contains("state.bin"),
            "{text}"
        );
        std::fs::remove_dir_all(&run).unwrap();
    }

    /// `keep` bounds the checkpoints on disk; one without a manifest (an older
    /// normrl's) is complete and loads unverified.
    #[test]
    fn the_newest_are_kept_and_older_checkpoints_still_load() {
        let run = temp("keep");
        for step in 1..=4 {
            save(&run, step * 100, &files(step as f32), Some(2)).unwrap();
        }
        let steps: Vec<u64> = complete(&run).into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, [300, 400]);
        save(&run, 500, &files(5.0), Some(1)).unwrap();
        assert_eq!(complete(&run).len(), 1);
        let dir = complete(&run)[0].1.clone();
        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        assert_eq!(complete(&run).len(), 1);
        assert_eq!(verify(&dir).unwrap(), Verified::NoManifest);
        std::fs::remove_dir_all(&run).unwrap();
    }
}
