//! What a study's runs cost on this machine's CPU, measured: each cost class of the
//! grid (environment, network, method, batch size and update frequency) trained for a
//! few hundred updates in a scratch folder, its rates kept in a table under the user's
//! cache so that the next estimate of the same classes by the same binary reads them.
//! A run's time is then its steps at those rates: acting only until learning starts,
//! acting and updating after, and its evaluation episodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::run::train::Trainer;

/// Updates timed per class: enough to average the update's noise, few enough that a
/// study of a hundred classes is measured in seconds.
pub const MEASURED_UPDATES: u64 = 200;
/// Updates before the timed ones.
const WARM_UPDATES: u64 = 20;
/// Steps of acting only timed per class (also its episodes' mean length).
const ACTING_STEPS: u64 = 1_000;

/// One class's measured costs, seconds per environment step.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct StepCosts {
    /// Acting, the environment's step and storing it (before learning starts, and the
    /// evaluation's steps).
    pub acting: f64,
    /// The same with the class's updates every `train_frequency` steps.
    pub training: f64,
    /// Mean length of the episodes seen while acting (at least the steps taken, where
    /// none ended): the evaluation's episodes are counted at this length.
    pub episode_steps: f64,
}

impl StepCosts {
    /// Seconds `config`'s whole run takes at these costs.
    pub fn run_seconds(&self, config: &TrainConfig) -> f64 {
        let total = config.run.total_steps;
        let acting = config.replay.learning_starts.min(total);
        let evaluations = match config.eval.interval {
            0 => 1,
            interval => total / interval + 1,
        };
        let eval_steps = (evaluations * config.eval.episodes) as f64 * self.episode_steps;
        acting as f64 * self.acting
            + (total - acting) as f64 * self.training
            + eval_steps * self.acting
    }
}

/// The class of `config`: what changes the cost of its steps (not its seed, its
/// exploration, its sampler or its length).
pub fn class_of(config: &TrainConfig) -> String {
    let r = &config.replay;
    format!(
        "{} {} {} b{} every {} x{} threads {}",
        config.env.id,
        toml::Value::try_from(&config.network.architecture)
            .map_or(String::new(), |v| v.to_string()),
        config.norm.name(),
        r.batch_size,
        r.train_frequency,
        r.gradient_steps,
        config.run.threads,
    )
}

/// The measured table: for each machine (its CPU) and binary, each class's costs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Table {
    machine: String,
    binary: String,
    classes: BTreeMap<String, StepCosts>,
}

/// This machine's CPU and this binary (its size and modification time): a table
/// measured by another of either is measured again.
fn identity() -> (String, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("model name"))?;
            Some(line.split(':').nth(1)?.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let binary = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            format!(
                "{} bytes, modified {}",
                m.len(),
                modified.map_or(0, |d| d.as_secs())
            )
        })
        .unwrap_or_default();
    (format!("{cpu}, {cores} cores"), binary)
}

/// Where the table lives: `$NORMRL_CACHE`, else `$XDG_CACHE_HOME/normrl`, else
/// `~/.cache/normrl`.
fn table_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("NORMRL_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("XDG_CACHE_HOME") {
            Some(cache) => PathBuf::from(cache).join("normrl"),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/normrl"),
        },
    };
    Some(dir.join("step-costs.json"))
}

/// The costs of every class among `configs`: read from the table where this machine
/// and binary measured them, measured now (and added to the table) otherwise. Also
/// how many classes were measured now.
pub fn step_costs(configs: &[TrainConfig]) -> Result<(BTreeMap<String, StepCosts>, usize)> {
    let (machine, binary) = identity();
    let path = table_path();
    let mut table = path
        .as_deref()
        .and_then(|p| {
            crate::storage::read_json::<Table>(p, "a table of step costs")
                .ok()
                .flatten()
        })
        .filter(|t| t.machine == machine && t.binary == binary)
        .unwrap_or(Table {
            machine,
            binary,
            classes: BTreeMap::new(),
        });
    let mut found = BTreeMap::new();
    let mut measured = 0;
    for config in configs {
        let class = class_of(config);
        if found.contains_key(&class) {
            continue;
        }
        let costs = match table.classes.get(&class) {
            Some(costs) => *costs,
            None => {
                measured += 1;
                let costs = measure(config)?;
                table.classes.insert(class.clone(), costs);
                costs
            }
        };
        found.insert(class, costs);
    }
    if let (Some(path), true) = (path, measured > 0) {
        // A table that cannot be kept costs the next estimate its time, nothing more.
        let _ = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")));
        if let Ok(json) = serde_json::to_vec_pretty(&table) {
            let _ = crate::storage::write_atomic(&path, &json);
        }
    }
    Ok((found, measured))
}

/// One class's costs: `config` trained in a scratch folder, first acting only, then
/// with its updates.
fn measure(config: &TrainConfig) -> Result<StepCosts> {
    let scratch = std::env::temp_dir().join(format!(
        "normrl-step-costs-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = measure_in(config, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`measure`] with its run in `scratch`.
fn measure_in(config: &TrainConfig, scratch: &Path) -> Result<StepCosts> {
    let mut c = config.clone();
    let per_update = c.replay.train_frequency as f64 / c.replay.gradient_steps.max(1) as f64;
    let training_steps = (MEASURED_UPDATES as f64 * per_update).ceil() as u64;
    // Warm-up, acting, then training; nothing periodic but the logging.
    let warmup = 50;
    c.replay.learning_starts = warmup + ACTING_STEPS;
    // Past the timed steps: the run never concludes (no final evaluation or summary).
    c.run.total_steps = c.replay.learning_starts
        + c.replay.batch_size as u64
        + ((WARM_UPDATES + MEASURED_UPDATES) as f64 * per_update).ceil() as u64
        + 1_000;
    c.eval.interval = 0;
    c.checkpoint.interval = 0;
    c.logging.layer_stats_interval = 0;
    c.logging.progress = false;
    let mut trainer = Trainer::new(c, scratch)?;
    trainer.run(Some(warmup))?;
    let episodes = trainer.episodes();
    let t = Instant::now();
    trainer.run(Some(warmup + ACTING_STEPS))?;
    let acting = t.elapsed().as_secs_f64() / ACTING_STEPS as f64;
    let ended = trainer.episodes() - episodes;
    let episode_steps = ACTING_STEPS as f64 / ended.max(1) as f64;
    // The first batch fills the replay's sampling window, and the first updates find
    // their buffers (and weight norm its init); then the updates are timed.
    let warm_updates = (WARM_UPDATES as f64 * per_update).ceil() as u64;
    let start = trainer.step() + trainer.config().replay.batch_size as u64 + warm_updates;
    trainer.run(Some(start))?;
    let t = Instant::now();
    trainer.run(Some(start + training_steps))?;
    let training = t.elapsed().as_secs_f64() / training_steps as f64;
    Ok(StepCosts {
        acting,
        training,
        episode_steps,
    })
}
