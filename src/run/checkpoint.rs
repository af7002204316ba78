//! Checkpoints: network weights and optimizer state as safetensors (readable by other
//! tools), the rest of the run's state (counters, random streams, environment, replay)
//! as one binary file. Each checkpoint is written to a temporary directory, renamed into
//! place, and then published by atomically replacing the `latest` pointer, so an
//! interrupted write never leaves a half checkpoint behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};

pub const LATEST: &str = "latest";

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}tmp",
        path.extension()
            .map(|e| format!("{}.", e.to_string_lossy()))
            .unwrap_or_default()
    ));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} into place", path.display()))?;
    Ok(())
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

/// The files of one checkpoint, by name.
/// Writes a checkpoint's `state.bin` into the stream it is given.
pub type StateWriter<'a> = Box<dyn Fn(&mut dyn std::io::Write) -> Result<()> + 'a>;

pub struct CheckpointFiles<'a> {
    pub tensors: Vec<(&'static str, HashMap<String, Tensor>)>,
    /// Writes `state.bin` (streamed: a replay buffer can be gigabytes, so it is not
    /// first copied into memory).
    pub state: StateWriter<'a>,
}

/// Saves a checkpoint for `step` under `run_dir/checkpoints/` and points `latest` at
/// it; older checkpoints are removed afterwards unless `keep_older`.
pub fn save(
    run_dir: &Path,
    step: u64,
    files: &CheckpointFiles<'_>,
    keep_older: bool,
) -> Result<PathBuf> {
    let root = run_dir.join("checkpoints");
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = format!("step-{step:012}");
    let tmp = root.join(format!("{name}.tmp"));
    let dir = root.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    for (file, tensors) in &files.tensors {
        let on_cpu: HashMap<String, Tensor> = tensors
            .iter()
            .map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?)))
            .collect::<Result<_>>()?;
        candle_core::safetensors::save(&on_cpu, tmp.join(format!("{file}.safetensors")))
            .with_context(|| format!("cannot write {file}.safetensors"))?;
    }
    let state = tmp.join("state.bin");
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&state)
            .with_context(|| format!("cannot write {}", state.display()))?,
    );
    (files.state)(&mut out)?;
    std::io::Write::flush(&mut out)?;
    out.get_ref().sync_all()?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&tmp, &dir)?;
    write_atomic(&root.join(LATEST), name.as_bytes())?;
    if !keep_older {
        remove_others(&root, &name);
    }
    Ok(dir)
}

/// Removes every checkpoint of the run but the newest (none if it has none).
pub fn prune(run_dir: &Path) -> Result<()> {
    if let Some(dir) = latest(run_dir)? {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        remove_others(&run_dir.join("checkpoints"), &name.unwrap_or_default());
    }
    Ok(())
}

fn remove_others(root: &Path, keep: &str) {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let other = entry.file_name().to_string_lossy().into_owned();
        if other.starts_with("step-") && other != keep {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Every complete checkpoint of the run (one with its `state.bin`), by step.
pub fn complete(run_dir: &Path) -> Vec<(u64, PathBuf)> {
    let root = run_dir.join("checkpoints");
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            entry
                .path()
                .join("state.bin")
                .exists()
                .then(|| (step, entry.path()))
        })
        .collect();
    found.sort();
    found
}

/// The directory of the newest complete checkpoint of a run, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>> {
    let root = run_dir.join("checkpoints");
    let pointer = root.join(LATEST);
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer)?;
    let dir = root.join(name.trim());
    if !dir.join("state.bin").exists() {
        bail!(
            "checkpoint {} named by {} is incomplete",
            dir.display(),
            pointer.display()
        );
    }
    Ok(Some(dir))
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
        &config.network,
        &config.norm,
        &config.optimizer,
        &config.dqn,
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
            "{} does not hold a network of this run's config (network.architecture, norm.kind): {}",
            ckpt.display(),
            cause.lines().next().unwrap_or_default()
        )
    })?;
    Ok(agent)
}
