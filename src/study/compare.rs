//! Comparison configs: a base training config plus axes to sweep (normalizations x
//! batch sizes x samplers x environments x seeds, and named variants), expanded into
//! runs and grouped into units of work (one run, or a population). Their checks and
//! cost are `estimate.rs`, their execution `execute.rs`.
//!
//! ```
//! use normrl::compare::CompareConfig;
//!
//! let text = r#"
//! name = "demo"
//! seeds = 2
//! [axes]
//! norm = ["none", "weight_norm"]
//! batch_size = [4, 32]
//! "#;
//! let config = CompareConfig::from_toml_str(text, std::path::Path::new(".")).unwrap();
//! let runs = config.expand().unwrap();
//! assert_eq!(runs.len(), 2 * 2 * 2);
//! assert_eq!(runs[0].variant, "none-b4");
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::presets;
use crate::config::TrainConfig;
pub use crate::report::settings::{ReportConfig, ScoreRange};
use crate::run::population::population_key;
use crate::storage::sanitize;
pub use crate::study::plan::PlannedRun;

/// The most seeds a comparison may ask for: far beyond any study's, and a bound before
/// a count is expanded into a list.
const MAX_SEEDS: u64 = 100_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Seeds {
    Count(u64),
    List(Vec<u64>),
}

/// A named set of overrides, one more axis of the grid.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    #[serde(default)]
    pub set: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareConfig {
    /// Names the experiment: runs go to `runs/<name>/`.
    pub name: String,
    /// The training config every run starts from, relative to this file.
    #[serde(default)]
    pub base: Option<PathBuf>,
    #[serde(default = "default_seeds")]
    pub seeds: Seeds,
    /// Overrides applied to every run (`"key.path" = value`).
    #[serde(default)]
    pub set: BTreeMap<String, toml::Value>,
    /// Values to sweep. Short names: `norm`, `weight`, `activation`, `batch_size`,
    /// `sampler`, `env`; any dotted config key works too.
    #[serde(default)]
    pub axes: toml::Table,
    #[serde(default)]
    pub variants: Vec<Variant>,
    #[serde(default)]
    pub report: ReportConfig,
    /// How `--slurm` writes the job array.
    #[serde(default)]
    pub slurm: crate::study::slurm::SlurmConfig,
    /// Train runs together as populations (one batched network, `run.population`):
    /// `"seeds"` groups the seeds of each environment and variant; a number groups
    /// up to that many runs that differ only in seed, exploration schedule, gamma or
    /// learning rate.
    #[serde(default)]
    pub population: Option<PopulationGrouping>,
    #[serde(skip)]
    base_text: String,
}

/// How a comparison groups its runs into populations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PopulationGrouping {
    /// `"seeds"`: every seed of one environment and variant.
    Named(String),
    /// At most this many runs alike but for per-agent values.
    Size(usize),
}

fn default_seeds() -> Seeds {
    Seeds::Count(3)
}

fn full_key(axis: &str) -> &str {
    match axis {
        "norm" => "norm.kind",
        "weight" => "norm.weight",
        "activation" => "norm.activation",
        "batch_size" => "replay.batch_size",
        "sampler" => "replay.sampler",
        "loss" => "dqn.loss",
        "env" => "env.id",
        other => other,
    }
}

/// Whether keys `a` and `b` set the same thing: the same key, the normalization's
/// preset (`norm.kind`) and one of the two parts it sets, or a method preset
/// (`preset`) and a key some preset sets (`norm.kind` included).
fn sets_same(a: &str, b: &str) -> bool {
    let part = |k: &str| matches!(k, "norm.weight" | "norm.activation");
    let by_preset = |k: &str| k == "norm.kind" || presets::sets_key(k);
    a == b
        || (a == "norm.kind" && part(b))
        || (b == "norm.kind" && part(a))
        || (a == "preset" && by_preset(b))
        || (b == "preset" && by_preset(a))
}

/// A short, directory-safe label for one axis value.
fn label(axis: &str, value: &toml::Value) -> String {
    let raw = match (axis, value) {
        (_, toml::Value::String(s)) => s.clone(),
        ("batch_size", v) => format!("b{v}"),
        (_, toml::Value::Table(t)) => t
            .get("type")
            .map(|t| t.to_string().trim_matches('"').to_string())
            .unwrap_or_else(|| value.to_string()),
        (axis, v) => format!("{}{v}", axis.rsplit('.').next().unwrap_or(axis)),
    };
    sanitize(&raw)
}

/// Whether `name`, as a path component, is no directory of its own: empty, or only
/// dots ('.' and '..' are the directory itself and the one above; longer runs of dots
/// are refused alike).
fn names_no_directory(name: &str) -> bool {
    name.chars().all(|c| c == '.')
}

/// A run's variant directory from its labels: never empty, '.' or '..', which would
/// put its seeds beside other variants' or outside the comparison.
fn variant_label(labels: &[String]) -> Result<String> {
    if labels.is_empty() {
        return Ok("base".to_string());
    }
    let variant = labels.join("-");
    if names_no_directory(&variant) {
        bail!(
            "a variant's label '{variant}' names no directory of its own: give the variant (or the axis value) a name with a letter or digit"
        );
    }
    Ok(variant)
}

/// A comparison trains each run alone (or groups them with its own `population` key):
/// `run.population` in a run's settings would train one agent yet write a population's
/// config, which a resume would take for a population's root.
fn single_runs_only(config: &TrainConfig, variant: &str) -> Result<()> {
    if config.run.population != 1 {
        bail!(
            "variant {variant}: run.population = {} is for `normrl train`; a comparison trains its runs alone, or as populations with its top-level `population` key (\"seeds\" or a number of runs)",
            config.run.population
        );
    }
    Ok(())
}

fn assignment(key: &str, value: &toml::Value) -> String {
    format!("{}={}", full_key(key), value)
}

impl CompareConfig {
    pub fn from_toml_str(text: &str, dir: &Path) -> Result<Self> {
        let table: toml::Table =
            toml::from_str(text).context("the comparison is not valid TOML")?;
        if table.contains_key("extends") {
            bail!("extends = ... needs the comparison's file: load it with CompareConfig::load");
        }
        Self::from_table(table, dir)
    }

    /// A comparison from its table (what it extends merged in), `base` relative to `dir`.
    fn from_table(table: toml::Table, dir: &Path) -> Result<Self> {
        let mut config: CompareConfig = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                anyhow::anyhow!(
                    "invalid value for '{}': {}",
                    e.path(),
                    e.inner().message().trim()
                )
            })?;
        if let Some(base) = &config.base {
            let path = dir.join(base);
            config.base_text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read the base config {}", path.display()))?;
        }
        // The name is a directory under the runs directory: '.' or '..' would be that
        // directory itself or the one above it.
        if config.name.is_empty()
            || sanitize(&config.name) != config.name
            || names_no_directory(&config.name)
        {
            bail!(
                "name = '{}' must use only letters, digits, '.', '-', '_', and not be empty, '.' or '..'",
                config.name
            );
        }
        match &config.seeds {
            Seeds::Count(n) if (1..=MAX_SEEDS).contains(n) => {}
            Seeds::List(v) if !v.is_empty() && v.len() as u64 <= MAX_SEEDS => {}
            _ => bail!(
                "seeds must be a count from 1 to {MAX_SEEDS} or a list of 1 to {MAX_SEEDS} seeds"
            ),
        }
        config.report.check()?;
        match &config.population {
            Some(PopulationGrouping::Named(name)) if name != "seeds" => {
                bail!("population = '{name}' must be \"seeds\" or a positive number of runs")
            }
            Some(PopulationGrouping::Size(0)) => {
                bail!("population = 0 must be \"seeds\" or a positive number of runs")
            }
            _ => {}
        }
        Ok(config)
    }

    /// The comparison at `path`, with the one it `extends` (`extends.rs`) merged in.
    pub fn load(path: &Path) -> Result<Self> {
        let table = crate::study::extends::load_table(path)?;
        Self::from_table(table, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("in comparison {}", path.display()))
    }

    pub(crate) fn seeds(&self) -> Vec<u64> {
        match &self.seeds {
            Seeds::Count(n) => (1..=*n).collect(),
            Seeds::List(v) => v.clone(),
        }
    }

    /// A variant that sets a key an axis also sets would override the axis in every
    /// run while the run's label still names the axis' value: refused, naming both.
    fn check_variants_against_axes(&self) -> Result<()> {
        for variant in &self.variants {
            for key in variant.set.keys() {
                let Some(axis) = self
                    .axes
                    .keys()
                    .find(|a| sets_same(full_key(a), full_key(key)))
                else {
                    continue;
                };
                bail!(
                    "variant '{}' sets '{}', which the axis '{axis}' also sets: every run of that variant would train the variant's value under a label naming the axis' value. Either drop the axis '{axis}' (and give each value a variant of its own), or make the variant set only keys that no axis sets",
                    variant.name,
                    full_key(key),
                );
            }
        }
        Ok(())
    }

    /// Every run of the grid, each validated as a training config.
    pub fn expand(&self) -> Result<Vec<PlannedRun>> {
        self.check_variants_against_axes()?;
        let common: Vec<String> = self.set.iter().map(|(k, v)| assignment(k, v)).collect();
        let axis_values = |axis: &str, value: &toml::Value| -> Result<Vec<toml::Value>> {
            match value.as_array() {
                Some(values) if !values.is_empty() => Ok(values.clone()),
                _ => bail!("axes.{axis} must be a non-empty list of values"),
            }
        };
        let envs: Vec<Option<toml::Value>> = match self.axes.get("env") {
            Some(values) => axis_values("env", values)?.into_iter().map(Some).collect(),
            None => vec![None],
        };
        // The grid of the other axes, in the order the file gives them.
        let mut combos: Vec<(Vec<String>, Vec<String>)> = vec![(vec![], vec![])];
        for (axis, values) in self.axes.iter().filter(|(a, _)| a.as_str() != "env") {
            let values = axis_values(axis, values)?;
            combos = combos
                .into_iter()
                .flat_map(|(labels, sets)| {
                    values.clone().into_iter().map(move |v| {
                        let v = &v;
                        let mut l = labels.clone();
                        l.push(label(axis, v));
                        let mut s = sets.clone();
                        s.push(assignment(axis, v));
                        (l, s)
                    })
                })
                .collect();
        }
        if !self.variants.is_empty() {
            combos = combos
                .into_iter()
                .flat_map(|(labels, sets)| {
                    self.variants.iter().map(move |variant| {
                        let mut l = labels.clone();
                        l.push(sanitize(&variant.name));
                        let mut s = sets.clone();
                        s.extend(variant.set.iter().map(|(k, v)| assignment(k, v)));
                        (l, s)
                    })
                })
                .collect();
        }
        let mut runs = vec![];
        for env in &envs {
            for (labels, sets) in &combos {
                for seed in self.seeds() {
                    let mut overrides = common.clone();
                    if let Some(e) = env {
                        overrides.push(assignment("env", e));
                    }
                    overrides.extend(sets.iter().cloned());
                    overrides.push(format!("run.seed={seed}"));
                    overrides.push("logging.progress=false".into());
                    let config = TrainConfig::from_toml_str(&self.base_text, &overrides)
                        .with_context(|| format!("variant {}", labels.join("-")))?;
                    let variant = variant_label(labels)?;
                    single_runs_only(&config, &variant)?;
                    let env_id = config.env.id.clone();
                    runs.push(PlannedRun {
                        rel_dir: PathBuf::from(sanitize(&env_id))
                            .join(&variant)
                            .join(format!("seed-{seed}")),
                        env: env_id,
                        variant,
                        seed,
                        overrides,
                    });
                }
            }
        }
        Ok(runs)
    }

    pub fn config_for(&self, run: &PlannedRun) -> Result<TrainConfig> {
        TrainConfig::from_toml_str(&self.base_text, &run.overrides)
    }
}

/// The units of work: each run alone, or with `population` set, groups of runs that
/// train as one population.
pub(crate) fn population_units(
    config: &CompareConfig,
    runs: &[PlannedRun],
) -> Result<Vec<Vec<usize>>> {
    let Some(grouping) = &config.population else {
        return Ok((0..runs.len()).map(|i| vec![i]).collect());
    };
    let limit = match grouping {
        PopulationGrouping::Named(_) => usize::MAX,
        PopulationGrouping::Size(n) => *n,
    };
    let mut groups = Vec::<(String, Vec<usize>)>::new();
    for (i, run) in runs.iter().enumerate() {
        let mut key = population_key(&config.config_for(run)?);
        if limit == usize::MAX {
            key = format!("{}\n{}\n{key}", run.env, run.variant);
        }
        match groups
            .iter_mut()
            .find(|(k, g)| *k == key && g.len() < limit)
        {
            Some((_, g)) => g.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    Ok(groups.into_iter().map(|(_, g)| g).collect())
}
