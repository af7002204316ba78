//! Comparison configs: a base training config plus axes to sweep (normalizations x
//! batch sizes x samplers x environments x seeds, and named variants), expanded into
//! runs that execute in parallel, resume after interruption, and split into shards.
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::run::interrupt::Interrupted;
use crate::run::population::{population_key, train_members, Member};
use crate::run::train::{set_threads, Trainer};
use crate::storage::lock::Locked;
pub use crate::study::plan::PlannedRun;

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

/// Random and reference scores of one environment, for normalized scores.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScoreRange {
    pub random: f64,
    pub reference: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReportConfig {
    /// The variant the others are compared with (probability of improvement).
    pub baseline: Option<String>,
    /// Return that counts as solved, for steps-to-threshold (per environment id).
    pub thresholds: BTreeMap<String, f64>,
    /// Score ranges per environment id; missing ones use built-in random scores and
    /// the best variant's mean as the reference.
    pub scores: BTreeMap<String, ScoreRange>,
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
    /// Values to sweep. Short names: `norm`, `batch_size`, `sampler`, `env`; any
    /// dotted config key works too.
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
        "batch_size" => "replay.batch_size",
        "sampler" => "replay.sampler",
        "env" => "env.id",
        other => other,
    }
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

fn assignment(key: &str, value: &toml::Value) -> String {
    format!("{}={}", full_key(key), value)
}

impl CompareConfig {
    pub fn from_toml_str(text: &str, dir: &Path) -> Result<Self> {
        let table: toml::Table =
            toml::from_str(text).context("the comparison is not valid TOML")?;
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
        if config.name.is_empty() || sanitize(&config.name) != config.name {
            bail!(
                "name = '{}' must be non-empty and use only letters, digits, '.', '-', '_'",
                config.name
            );
        }
        if let Seeds::Count(0) = config.seeds {
            bail!("seeds must be a positive count or a list of seeds");
        }
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

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read comparison {}", path.display()))?;
        Self::from_toml_str(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("in comparison {}", path.display()))
    }

    fn seeds(&self) -> Vec<u64> {
        match &self.seeds {
            Seeds::Count(n) => (1..=*n).collect(),
            Seeds::List(v) => v.clone(),
        }
    }

    /// Every run of the grid, each validated as a training config.
    pub fn expand(&self) -> Result<Vec<PlannedRun>> {
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
                    let variant = if labels.is_empty() {
                        "base".to_string()
                    } else {
                        labels.join("-")
                    };
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

/// `i/n`: this machine runs every n-th run, starting at run i (0-based).
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let parsed = s
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some((i, n)) if n > 0 && i < n => Ok((i, n)),
        _ => bail!("--shard '{s}': expected i/n with 0 <= i < n, e.g. 0/4"),
    }
}

/// Rough single-thread environment steps per second, measured on a 2-core x86 VM
/// (`normrl bench train`), for the plan's cost estimate.
fn estimated_sps(config: &TrainConfig) -> f64 {
    use normrl_agents::nn::Architecture;
    let per_update = match config.network.architecture {
        Architecture::Mlp { .. } => 5_000.0,
        Architecture::MinatarCnn => 450.0,
        Architecture::NatureCnn => 15.0,
    };
    let updates_per_step =
        config.replay.gradient_steps as f64 / config.replay.train_frequency as f64;
    per_update / updates_per_step.max(0.05)
        * (32.0 / config.replay.batch_size.max(1) as f64).clamp(0.5, 4.0)
}

/// Checks the whole plan before anything runs or is created: at least one job, one
/// directory per run (two variants or seeds with the same label would share one, and
/// the second would be skipped as finished), and a baseline that is planned.
pub fn check_plan(config: &CompareConfig, runs: &[PlannedRun], jobs: usize) -> Result<()> {
    if jobs == 0 {
        bail!("--jobs must be a positive integer");
    }
    let mut seen = std::collections::BTreeMap::new();
    let mut clashes = vec![];
    for (i, run) in runs.iter().enumerate() {
        if let Some(first) = seen.insert(&run.rel_dir, i) {
            clashes.push(format!(
                "runs {first} and {i} both go to {} (variant '{}', seed {}): give the axes' values or [[variants]] distinct names, and the seeds distinct values",
                run.rel_dir.display(),
                run.variant,
                run.seed
            ));
        }
    }
    if !clashes.is_empty() {
        bail!("{}", clashes.join("\n"));
    }
    if let Some(baseline) = &config.report.baseline {
        if !runs.iter().any(|r| &r.variant == baseline) {
            let variants: std::collections::BTreeSet<&str> =
                runs.iter().map(|r| r.variant.as_str()).collect();
            let list: Vec<&str> = variants.into_iter().collect();
            bail!(
                "report.baseline = '{baseline}' is not a planned variant; the variants are: {}",
                list.join(", ")
            );
        }
    }
    Ok(())
}

/// Steps with updates that `compare --dry-run` times on the study's device.
pub const MEASURED_STEPS: u64 = 300;

/// A study's rate as measured on its device ([`measure_rate`]).
pub struct MeasuredRate {
    pub agent_steps_per_second: f64,
    pub device: String,
    pub members: usize,
    pub steps: u64,
}

/// Whether the study's runs ask for a GPU (`run.device` of its first run: `cuda`,
/// `cuda:N`, or `auto` where this binary finds one).
pub fn study_on_gpu(config: &CompareConfig, runs: &[PlannedRun]) -> Result<bool> {
    let Some(first) = runs.first() else {
        return Ok(false);
    };
    let spec = crate::config::parse_device_spec(&config.config_for(first)?.run.device)?;
    Ok(match spec {
        crate::config::DeviceSpec::Cpu => false,
        crate::config::DeviceSpec::Cuda(_) => true,
        crate::config::DeviceSpec::Auto => !crate::config::select_device(spec)?.is_cpu(),
    })
}

/// The study's rate on its own device: its first population (or first run) trained in
/// a scratch folder, learning from its first batch, then `steps` steps with updates
/// timed. Aggregate agent-steps per second.
pub fn measure_rate(
    config: &CompareConfig,
    runs: &[PlannedRun],
    steps: u64,
) -> Result<MeasuredRate> {
    let units = population_units(config, runs)?;
    let Some(unit) = units.first() else {
        bail!("the plan has no runs to measure");
    };
    let scratch = std::env::temp_dir().join(format!("normrl-measure-{}", std::process::id()));
    let result = time_unit(config, runs, unit, &scratch, steps);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// [`measure_rate`] of `unit`, its runs in `scratch`.
fn time_unit(
    config: &CompareConfig,
    runs: &[PlannedRun],
    unit: &[usize],
    scratch: &Path,
    steps: u64,
) -> Result<MeasuredRate> {
    use crate::run::population::Population;
    use crate::run::train::Trainer;
    let mut members = vec![];
    for &i in unit {
        let mut c = config.config_for(&runs[i])?;
        // Updates from the first batch: the timed steps are the study's steady state.
        c.replay.learning_starts = c.replay.batch_size.max(1) as u64;
        members.push(Trainer::new(c, &scratch.join(format!("run-{i}")))?);
    }
    let warmup = members[0].config().replay.learning_starts + 1;
    let device = members[0].config().run.device.clone();
    let mut population = Population::new(members)?;
    population.run(Some(warmup))?;
    let t = std::time::Instant::now();
    population.run(Some(warmup + steps))?;
    let seconds = t.elapsed().as_secs_f64();
    Ok(MeasuredRate {
        agent_steps_per_second: (unit.len() as u64 * steps) as f64 / seconds.max(1e-9),
        device,
        members: unit.len(),
        steps,
    })
}

/// Prints the plan: how many runs, how many steps, about how long (by the rate
/// `measured` on the study's device where given).
pub fn describe_plan(
    config: &CompareConfig,
    runs: &[PlannedRun],
    jobs: usize,
    measured: Option<&MeasuredRate>,
) -> Result<String> {
    let mut steps = 0u64;
    let mut seconds = 0.0;
    for run in runs {
        let c = config.config_for(run)?;
        steps += c.run.total_steps;
        seconds += c.run.total_steps as f64 / estimated_sps(&c);
    }
    let variants: std::collections::BTreeSet<_> = runs.iter().map(|r| r.variant.as_str()).collect();
    let envs: std::collections::BTreeSet<_> = runs.iter().map(|r| r.env.as_str()).collect();
    let duration = |s: f64| {
        if s < 7200.0 {
            format!("{:.0} minutes", s / 60.0)
        } else {
            format!("{:.1} hours", s / 3600.0)
        }
    };
    let mut text = format!(
        "comparison '{}': {} runs ({} environments x {} variants x {} seeds), {} environment steps; estimated {} of CPU time, {} with {jobs} jobs",
        config.name,
        runs.len(),
        envs.len(),
        variants.len(),
        config.seeds().len(),
        steps,
        duration(seconds),
        duration(seconds / jobs.max(1) as f64)
    );
    if config.population.is_some() {
        let units = population_units(config, runs)?;
        let largest = units.iter().map(Vec::len).max().unwrap_or(0);
        text.push_str(&format!(
            "; as {} populations of up to {largest} runs (on a CPU a population's agents train about as fast as separate runs, on run.threads cores; the estimate is for the CPU: a GPU's rate is measured with `normrl bench population-train --device cuda`)",
            units.len()
        ));
    }
    if let Some(m) = measured {
        text.push_str(&format!(
            "; measured on {}: {:.0} agent-steps/s (a population of {}, {} steps with updates), so the study's {steps} agent-steps take about {} there",
            m.device,
            m.agent_steps_per_second,
            m.members,
            m.steps,
            duration(steps as f64 / m.agent_steps_per_second.max(1e-9))
        ));
    }
    Ok(text)
}

/// The HParams dashboard's experiment (axes, values, metrics) at the root of the runs,
/// in an event file of its own, written once per invocation.
fn write_experiment(config: &CompareConfig, runs: &[PlannedRun], root: &Path) -> Result<()> {
    let configs = runs
        .iter()
        .map(|r| config.config_for(r))
        .collect::<Result<Vec<_>>>()?;
    let content = crate::logging::hparams::experiment(
        &config.name,
        &configs,
        crate::run::files::unix_seconds(),
    );
    let mut tb = crate::logging::tensorboard::TensorBoard::new(root)?;
    tb.plugin_summary(
        crate::logging::hparams::EXPERIMENT_TAG,
        "hparams",
        content,
        0,
    );
    tb.flush()
}

/// A failed run's last error (removed when the run starts again), for `normrl status`.
pub const ERROR_FILE: &str = "error.txt";

/// What [`execute`] left to others: runs finished before it started, and runs another
/// process was training (their lock held), both skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    pub finished_before: usize,
    pub held_elsewhere: usize,
}

/// Runs `runs` with `jobs` workers, each single-threaded: finished runs (with a
/// `summary.json`) are skipped, and so are runs another process holds (two
/// invocations over one study share its work); interrupted ones resume from their
/// checkpoint. On a
/// stop request (SIGTERM, SIGUSR1) every worker checkpoints its run and starts no
/// other, and the result is that [`Interrupted`].
pub fn execute(
    config: &CompareConfig,
    runs: &[PlannedRun],
    root: &Path,
    jobs: usize,
) -> Result<Executed> {
    set_threads(1);
    write_experiment(config, runs, root)?;
    let units = population_units(config, runs)?;
    let next = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::new());
    let interrupted = Mutex::new(None);
    let done = AtomicUsize::new(0);
    let skipped = AtomicUsize::new(0);
    let held = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(unit) = units.get(i) else { break };
                if crate::run::interrupt::requested().is_some() {
                    break;
                }
                let finished = |r: &&PlannedRun| {
                    let summary = root.join(&r.rel_dir).join(crate::run::files::SUMMARY_FILE);
                    summary.exists()
                };
                let (ended, pending): (Vec<&PlannedRun>, Vec<&PlannedRun>) =
                    unit.iter().map(|&k| &runs[k]).partition(finished);
                skipped.fetch_add(ended.len(), Ordering::SeqCst);
                if pending.is_empty() {
                    continue;
                }
                let start = Instant::now();
                for (run, result) in run_unit(config, &pending, root) {
                    let dir = root.join(&run.rel_dir);
                    let k = done.fetch_add(1, Ordering::SeqCst) + 1;
                    let head = format!(
                        "[{k}/{}] {} {} seed {}",
                        runs.len(),
                        run.env,
                        run.variant,
                        run.seed
                    );
                    let line = |message: String| {
                        eprintln!("{head}{message}");
                    };
                    match outcome(result, start, &dir, line) {
                        Outcome::Done => {}
                        Outcome::Skipped => {
                            held.fetch_add(1, Ordering::SeqCst);
                        }
                        Outcome::Interrupted(stop) => {
                            *interrupted.lock().expect("interruption") = Some(stop);
                        }
                        Outcome::Failed(e) => errors
                            .lock()
                            .expect("error list")
                            .push(format!("{}: {e}", run.rel_dir.display())),
                    }
                }
            });
        }
    });
    let errors = errors.into_inner().expect("error list");
    if !errors.is_empty() {
        bail!("{} runs failed:\n{}", errors.len(), errors.join("\n"));
    }
    if let Some(stop) = interrupted.into_inner().expect("interruption") {
        return Err(stop.into());
    }
    Ok(Executed {
        finished_before: skipped.into_inner(),
        held_elsewhere: held.into_inner(),
    })
}

/// How one run of a comparison ended.
enum Outcome {
    Done,
    /// Held by another process (a second `compare` over the same study).
    Skipped,
    Interrupted(Interrupted),
    Failed(String),
}

/// Says how a run ended (through `line`) and, for a failure, writes its `error.txt`.
fn outcome(
    result: Result<crate::run::train::RunSummary>,
    start: Instant,
    dir: &Path,
    line: impl Fn(String),
) -> Outcome {
    match result {
        Ok(summary) => {
            let end = match &summary.diverged {
                Some(d) => format!("diverged at step {}: {}", d.step, d.what),
                None => format!("final eval return {:.2}", summary.final_eval_return),
            };
            line(format!(": {end} ({:.0} s)", start.elapsed().as_secs_f64()));
            Outcome::Done
        }
        Err(e) => match e.downcast::<Interrupted>() {
            Ok(stop) => {
                line(format!(": {stop}"));
                Outcome::Interrupted(stop)
            }
            // Another process trains it: its files are not this one's to write.
            Err(e) if e.downcast_ref::<Locked>().is_some() => {
                line(format!(" skipped: {e}"));
                Outcome::Skipped
            }
            Err(e) => {
                line(format!(" failed: {e:#}"));
                let text = format!("{e:#}\n");
                let _ = crate::storage::write_atomic(&dir.join(ERROR_FILE), text.as_bytes());
                Outcome::Failed(format!("{e:#}"))
            }
        },
    }
}

/// The runs of a unit of work (one run, or a population's), each with its outcome.
fn run_unit<'r>(
    config: &CompareConfig,
    runs: &[&'r PlannedRun],
    root: &Path,
) -> Vec<(&'r PlannedRun, Result<crate::run::train::RunSummary>)> {
    if let [run] = runs {
        return vec![(*run, run_one(config, run, &root.join(&run.rel_dir)))];
    }
    let members = runs
        .iter()
        .map(|r| {
            let dir = root.join(&r.rel_dir);
            let _ = std::fs::remove_file(dir.join(ERROR_FILE));
            Ok(Member {
                dir,
                config: config.config_for(r)?,
                variant: Some(r.variant.clone()),
            })
        })
        .collect::<Result<Vec<_>>>();
    match members.and_then(|m| train_members(&m, None)) {
        Ok(summaries) => runs
            .iter()
            .zip(summaries)
            .map(|(r, s)| (*r, s.context("the run stopped early")))
            .collect(),
        // Every member shares the population's fate.
        Err(e) => {
            let stop = e.downcast_ref::<Interrupted>().copied();
            let held = e.downcast_ref::<Locked>();
            runs.iter()
                .map(|r| match (stop, held) {
                    (Some(stop), _) => (*r, Err(stop.into())),
                    (None, Some(held)) => (*r, Err(held.clone().into())),
                    (None, None) => (*r, Err(anyhow::anyhow!("the population failed: {e:#}"))),
                })
                .collect()
        }
    }
}

/// The units of work: each run alone, or with `population` set, groups of runs that
/// train as one population.
fn population_units(config: &CompareConfig, runs: &[PlannedRun]) -> Result<Vec<Vec<usize>>> {
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

/// One run: resumed from its checkpoint if it has one, else started; labelled with its
/// variant for `result.json`.
fn run_one(
    config: &CompareConfig,
    run: &PlannedRun,
    dir: &Path,
) -> Result<crate::run::train::RunSummary> {
    let _ = std::fs::remove_file(dir.join(ERROR_FILE));
    let mut trainer = if crate::run::checkpoint::latest(dir)?.is_some() {
        Trainer::resume(dir)?
    } else {
        Trainer::new(config.config_for(run)?, dir)?
    };
    trainer.set_variant(&run.variant);
    let mut run = crate::run::population::SingleRun::new(trainer)?;
    run.run(None)?.context("the run stopped early")
}
