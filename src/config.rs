//! The training configuration: a TOML file with documented defaults, `--set key=value`
//! overrides, and validation that names the key and what is allowed.
//!
//! ```
//! let config = normrl::config::TrainConfig::from_toml_str(
//!     "[env]\nid = \"classic/cartpole\"\n[replay]\nbatch_size = 32\n",
//!     &["norm.kind=weight_norm".to_string()],
//! ).unwrap();
//! assert_eq!(config.replay.batch_size, 32);
//! assert_eq!(config.norm.kind.name(), "weight_norm");
//! ```

use std::path::Path;

use anyhow::{bail, Context, Result};
use normrl_agents::dqn::{DqnConfig, LinearSchedule};
use normrl_agents::nn::{NormConfig, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::replay::Sampler;
use serde::{Deserialize, Serialize};

/// Everything about one training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub run: RunConfig,
    pub env: EnvConfig,
    pub network: QNetworkConfig,
    pub norm: NormConfig,
    pub optimizer: OptimizerConfig,
    pub dqn: DqnConfig,
    pub replay: ReplayConfig,
    pub exploration: LinearSchedule,
    pub eval: EvalConfig,
    pub logging: LoggingConfig,
    pub checkpoint: CheckpointConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Names the run (and its default directory `runs/<name>`).
    pub name: String,
    /// Seeds the networks, the environment and every random draw of the run.
    pub seed: u64,
    /// Environment steps to train for.
    pub total_steps: u64,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// CPU threads for tensor work (1 is fastest for small networks).
    pub threads: usize,
    /// Accept values that are legal but almost surely a mistake (training that never
    /// starts, a rising epsilon, ...). Written to the resolved config only when set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_odd: bool,
    /// Agents trained together as one batched network (seeds `seed`, `seed + 1`, ...),
    /// each in its own run directory `<run dir>/seed-<seed>`. Written to the resolved
    /// config only when above 1.
    #[serde(skip_serializing_if = "is_one")]
    pub population: usize,
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvConfig {
    /// Environment id with options, e.g. `minatar/breakout?sticky=0.1`.
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    /// Frames the replay ring holds.
    pub capacity: usize,
    pub batch_size: usize,
    pub sampler: Sampler,
    /// Environment steps before the first update.
    pub learning_starts: u64,
    /// Environment steps between updates.
    pub train_frequency: u64,
    /// Gradient steps per update.
    pub gradient_steps: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Environment steps between evaluations; 0 disables periodic evaluation.
    pub interval: u64,
    pub episodes: u64,
    /// Epsilon of the evaluation policy.
    pub epsilon: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// Environment steps between loss/SPS scalars.
    pub interval: u64,
    /// Environment steps between per-layer statistics (weight norms, g, singular
    /// values, BN statistics); 0 disables them.
    pub layer_stats_interval: u64,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Environment steps between checkpoints; 0 keeps only the final one.
    pub interval: u64,
    /// Save the replay buffer too (needed for an exact resume).
    pub replay: bool,
    /// What stays on disk: every checkpoint, the last, or none once the run has
    /// finished (its `summary.json` and `result.json` hold its results).
    pub keep: Keep,
}

/// Which checkpoints a run keeps (`checkpoint.keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Every checkpoint written.
    All,
    /// The newest only (older ones are removed as each new one is complete).
    Last,
    /// The newest while training; none once the run has finished.
    None,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "run".into(),
            seed: 1,
            total_steps: 100_000,
            device: "cpu".into(),
            threads: 1,
            allow_odd: false,
            population: 1,
        }
    }
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            id: "classic/cartpole".into(),
        }
    }
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            batch_size: 32,
            sampler: Sampler::Uniform,
            learning_starts: 1_000,
            train_frequency: 1,
            gradient_steps: 1,
        }
    }
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            interval: 10_000,
            episodes: 10,
            epsilon: 0.0,
        }
    }
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            interval: 1_000,
            layer_stats_interval: 10_000,
            progress: true,
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            interval: 50_000,
            replay: true,
            keep: Keep::Last,
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            run: RunConfig::default(),
            env: EnvConfig::default(),
            network: QNetworkConfig::mlp(vec![64, 64]),
            norm: NormConfig::default(),
            optimizer: OptimizerConfig::default(),
            dqn: DqnConfig::default(),
            replay: ReplayConfig::default(),
            exploration: LinearSchedule::default(),
            eval: EvalConfig::default(),
            logging: LoggingConfig::default(),
            checkpoint: CheckpointConfig::default(),
        }
    }
}

/// `key.path=value` as the key and the value, parsed as a TOML value where it parses
/// (numbers, booleans, arrays, inline tables) and as a string otherwise.
pub fn parse_assignment(assignment: &str) -> Result<(String, toml::Value)> {
    let (path, raw) = assignment.split_once('=').with_context(|| {
        format!("--set '{assignment}': expected key=value, e.g. replay.batch_size=32")
    })?;
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    Ok((path.trim().to_string(), value))
}

/// Sets `path` (dotted) in `table` to the assignment's value.
pub fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let (path, value) = parse_assignment(assignment)?;
    let keys: Vec<&str> = path.trim().split('.').collect();
    let mut node = table;
    for key in &keys[..keys.len() - 1] {
        node = node
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .with_context(|| format!("--set '{assignment}': '{key}' is not a table"))?;
    }
    node.insert(keys[keys.len() - 1].to_string(), value);
    Ok(())
}

/// Rejects keys that the defaults do not have, naming the key and the allowed ones.
/// Tables tagged with `type` (variants) are left to serde, which lists their fields.
fn check_keys(user: &toml::Table, known: &toml::Table, prefix: &str) -> Result<()> {
    for (key, value) in user {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let Some(reference) = known.get(key) else {
            let mut allowed: Vec<&str> = known.keys().map(String::as_str).collect();
            allowed.sort_unstable();
            let place = if prefix.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in [{prefix}]")
            };
            bail!(
                "unknown config key '{path}'; keys allowed {place}: {}",
                allowed.join(", ")
            );
        };
        if let (Some(sub), Some(ref_sub)) = (value.as_table(), reference.as_table()) {
            if !ref_sub.contains_key("type") {
                check_keys(sub, ref_sub, &path)?;
            }
        }
    }
    Ok(())
}

impl TrainConfig {
    /// Parses TOML text with overrides applied, then validates.
    pub fn from_toml_str(text: &str, overrides: &[String]) -> Result<Self> {
        let mut table: toml::Table =
            toml::from_str(text).context("the config is not valid TOML")?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        // Every key, those written only when set included.
        let mut every_key = TrainConfig::default();
        every_key.run.allow_odd = true;
        every_key.run.population = 2;
        let known = toml::Table::try_from(every_key).expect("defaults serialize");
        check_keys(&table, &known, "")?;
        let config: TrainConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let message = inner
                    .message()
                    .trim()
                    .replace("expected usize", "expected a non-negative integer")
                    .replace("expected u64", "expected a non-negative integer")
                    .replace("expected f64", "expected a number");
                anyhow::anyhow!("invalid value for '{path}': {message}")
            })?;
        let resolved = toml::Table::try_from(&config).expect("configs serialize");
        let unknown = crate::validate::unknown_tagged_keys(&table, &resolved, "");
        if !unknown.is_empty() {
            bail!("{}", unknown.join("\n"));
        }
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::from_toml_str(&text, overrides)
            .with_context(|| format!("in config {}", path.display()))
    }

    /// The config as TOML, every field resolved.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("configs serialize")
    }

    /// Range checks across sections, conflicting choices and odd ones (see
    /// [`crate::validate`]); the error lists every problem.
    pub fn validate(&self) -> Result<()> {
        let problems = crate::validate::problems(self);
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", problems.join("\n"))
        }
    }
}

/// What the user asked for as a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Auto,
    Cpu,
    Cuda(usize),
}

pub fn parse_device_spec(spec: &str) -> Result<DeviceSpec> {
    match spec {
        "auto" => Ok(DeviceSpec::Auto),
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        _ => match spec.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => Ok(DeviceSpec::Cuda(n)),
            None => bail!("run.device = '{spec}' is invalid: expected auto, cpu, cuda or cuda:N"),
        },
    }
}

/// The device for a spec: `auto` takes the GPU when this build has CUDA and one is
/// present, else the CPU.
pub fn select_device(spec: DeviceSpec) -> Result<candle_core::Device> {
    match spec {
        DeviceSpec::Cpu => Ok(candle_core::Device::Cpu),
        DeviceSpec::Cuda(n) => {
            if !candle_core::utils::cuda_is_available() {
                bail!("run.device asks for cuda:{n}, but this normrl binary was built without CUDA (build with --features cuda, see README)");
            }
            // candle's error carries a backtrace when RUST_BACKTRACE is set: the first
            // line says it all.
            candle_core::Device::new_cuda(n).map_err(|e| {
                let cause = e.to_string();
                anyhow::anyhow!(
                    "no usable CUDA device {n}: {}",
                    cause.lines().next().unwrap_or_default()
                )
            })
        }
        DeviceSpec::Auto => {
            if candle_core::utils::cuda_is_available() {
                if let Ok(d) = candle_core::Device::new_cuda(0) {
                    return Ok(d);
                }
            }
            Ok(candle_core::Device::Cpu)
        }
    }
}
