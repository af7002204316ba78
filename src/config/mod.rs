//! The training configuration: a TOML file with documented defaults, `--set key=value`
//! overrides, and validation that names the key and what is allowed.
//!
//! ```
//! let config = normrl::config::TrainConfig::from_toml_str(
//!     "[env]\nid = \"classic/cartpole\"\n[replay]\nbatch_size = 32\n",
//!     &["norm.kind=weight_norm".to_string()],
//! ).unwrap();
//! assert_eq!(config.replay.batch_size, 32);
//! assert_eq!(config.norm.name(), "weight_norm");
//! ```

mod device;
pub mod device_memory;
mod load;
pub mod presets;
mod table;
pub mod validate;

pub use device::{parse_device_spec, select_device, DeviceSpec};
pub use table::{apply_override, parse_assignment};

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
    /// starts, a rising epsilon, ...).
    pub allow_odd: bool,
    /// Agents trained together as one batched network (seeds `seed`, `seed + 1`, ...),
    /// each in its own run directory `<run dir>/seed-<seed>` (whose config says 1: it
    /// is one agent's).
    pub population: usize,
    /// On a CUDA device, a population's update and acting forward are captured once as
    /// CUDA graphs and replayed (one launch a step), where the capture's replay equals
    /// the eager step; `false` keeps every step eager.
    pub cuda_graphs: bool,
    /// On a CUDA device, let cuBLAS's f32 products run on TF32 tensor cores (10-bit
    /// mantissas in the products, f32 sums): faster, and no longer the CPU's values to
    /// rounding. Off unless set.
    pub tf32: bool,
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
    /// Each evaluation's first episode as an animated GIF in TensorBoard's images tab
    /// (tag `eval/episode`).
    pub video: bool,
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
    /// What stays on disk: every checkpoint, the last two (a damaged newest one falls
    /// back to the one before), the last, or none once the run has finished (its
    /// `summary.json` and `result.json` hold its results).
    pub keep: Keep,
}

/// Which checkpoints a run keeps (`checkpoint.keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Every checkpoint written.
    All,
    /// The two newest (older ones are removed as each new one is complete): a resume
    /// whose newest checkpoint fails its checksums falls back to the other.
    LastTwo,
    /// The newest only: nothing to fall back to.
    Last,
    /// The two newest while training; none once the run has finished.
    None,
}

impl Keep {
    /// How many checkpoints stay while the run trains (`None`: all).
    pub fn while_training(self) -> Option<usize> {
        match self {
            Keep::All => None,
            Keep::LastTwo | Keep::None => Some(2),
            Keep::Last => Some(1),
        }
    }
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
            cuda_graphs: true,
            tf32: false,
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
            video: false,
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
            keep: Keep::LastTwo,
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

impl TrainConfig {
    /// The agent this run trains: its network, normalization, optimizer and DQN.
    pub fn agent(&self) -> normrl_agents::dqn::AgentConfig<'_> {
        normrl_agents::dqn::AgentConfig {
            network: &self.network,
            norm: &self.norm,
            optimizer: &self.optimizer,
            dqn: &self.dqn,
        }
    }

    /// The config as TOML, every field resolved.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(&self.to_table()).expect("configs serialize")
    }

    /// The config as a TOML table, with `norm.kind` naming the method's preset where its
    /// two parts are one (a reader sees the method by its name; the parts decide).
    pub(crate) fn to_table(&self) -> toml::Table {
        let mut table = toml::Table::try_from(self).expect("configs serialize");
        if let (Some(kind), Some(toml::Value::Table(parts))) = (self.norm.kind(), table.get("norm"))
        {
            let mut norm = toml::Table::new();
            norm.insert("kind".into(), toml::Value::String(kind.name().into()));
            norm.extend(parts.clone());
            table.insert("norm".into(), toml::Value::Table(norm));
        }
        table
    }

    /// A resolved config's text as this normrl writes it (`None` if it is no config).
    /// Older versions left out keys at their defaults: resume and the report compare
    /// configs in this form, so that one run reads the same whichever version wrote it.
    pub fn canonical_toml(text: &str) -> Option<String> {
        Self::from_toml_str(text, &[]).ok().map(|c| c.to_toml())
    }
}
