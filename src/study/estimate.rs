//! A comparison's plan before it runs: the checks that refuse it early, its cost
//! estimated on the CPU or measured on its device, and the plan as printed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};

use crate::config::TrainConfig;
use crate::study::compare::{population_units, CompareConfig, PlannedRun};

/// The most parallel jobs: each is a thread started up front.
const MAX_JOBS: usize = 4096;

/// Checks the whole plan before anything runs or is created: at least one job, one
/// directory per run (two variants or seeds with the same label would share one, and
/// the second would be skipped as finished), and a baseline that is planned.
pub fn check_plan(config: &CompareConfig, runs: &[PlannedRun], jobs: usize) -> Result<()> {
    if !(1..=MAX_JOBS).contains(&jobs) {
        bail!("--jobs must be a positive integer up to {MAX_JOBS}");
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

/// A study's rate as measured on its device ([`measure_rates`]): one population's, of
/// the runs with its batch size.
pub struct MeasuredRate {
    pub agent_steps_per_second: f64,
    pub device: String,
    pub members: usize,
    pub steps: u64,
    pub batch_size: usize,
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

/// The study's rates on its own device, one per batch size (what most sets a step's
/// cost there: a study of batch 1 to 32 priced by its first population's would be off
/// by the ratio of their rates): the first population (or run) of each batch size
/// trained in a scratch folder, learning from its first batch, then `steps` steps with
/// updates timed. Aggregate agent-steps per second.
pub fn measure_rates(
    config: &CompareConfig,
    runs: &[PlannedRun],
    steps: u64,
) -> Result<Vec<MeasuredRate>> {
    let mut firsts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for unit in population_units(config, runs)? {
        let batch = config.config_for(&runs[unit[0]])?.replay.batch_size;
        firsts.entry(batch).or_insert(unit);
    }
    if firsts.is_empty() {
        bail!("the plan has no runs to measure");
    }
    let scratch = std::env::temp_dir().join(format!("normrl-measure-{}", std::process::id()));
    let result = firsts
        .values()
        .map(|unit| time_unit(config, runs, unit, &scratch, steps))
        .collect();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// [`measure_rates`] of `unit`, its runs in `scratch`.
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
    let batch_size = members[0].config().replay.batch_size;
    let mut population = Population::new(members)?.quietly();
    population.run(Some(warmup))?;
    let t = std::time::Instant::now();
    population.run(Some(warmup + steps))?;
    let seconds = t.elapsed().as_secs_f64();
    Ok(MeasuredRate {
        agent_steps_per_second: (unit.len() as u64 * steps) as f64 / seconds.max(1e-9),
        device,
        members: unit.len(),
        steps,
        batch_size,
    })
}

/// How a plan's time is known: not at all (a run prints its plan without it), by
/// the CPU's measured cost classes ([`crate::study::rates`]), or by its first
/// population's rate on its device.
pub enum Timing<'a> {
    Unmeasured,
    Classes(&'a ClassCosts),
    Device(&'a [MeasuredRate]),
}

/// Every run's time by its cost class, measured on this CPU.
pub struct ClassCosts {
    /// Seconds of each run of the plan, in its order.
    pub run_seconds: Vec<f64>,
    pub classes: usize,
    pub measured_now: usize,
    /// Environment steps per second with updates, per batch size (the mean over its
    /// classes, weighted by their steps).
    pub rates: Vec<(usize, f64)>,
    /// The same per environment and batch size: a study's throughput per setting.
    pub by_env: Vec<(String, Vec<(usize, f64)>)>,
}

/// `runs`' costs on this CPU by their classes: measured now where this binary has not
/// measured them on this machine before.
pub fn class_costs(config: &CompareConfig, runs: &[PlannedRun]) -> Result<ClassCosts> {
    let configs: Vec<TrainConfig> = runs
        .iter()
        .map(|r| config.config_for(r))
        .collect::<Result<_>>()?;
    let (costs, measured_now) = crate::study::rates::step_costs(&configs)?;
    let cost = |c: &TrainConfig| costs[&crate::study::rates::class_of(c)];
    let run_seconds = configs.iter().map(|c| cost(c).run_seconds(c)).collect();
    // Steps and seconds by environment and batch size, and over all environments
    // (`None`).
    type Sums = BTreeMap<(Option<String>, usize), (f64, f64)>;
    let mut sums: Sums = BTreeMap::new();
    for c in &configs {
        for env in [Some(c.env.id.clone()), None] {
            let (steps, seconds) = sums.entry((env, c.replay.batch_size)).or_default();
            *steps += c.run.total_steps as f64;
            *seconds += c.run.total_steps as f64 * cost(c).training;
        }
    }
    let mut by_env: BTreeMap<Option<String>, Vec<(usize, f64)>> = BTreeMap::new();
    for ((env, batch), (steps, seconds)) in sums {
        let rate = steps / seconds.max(1e-12);
        by_env.entry(env).or_default().push((batch, rate));
    }
    Ok(ClassCosts {
        run_seconds,
        classes: costs.len(),
        measured_now,
        rates: by_env.remove(&None).unwrap_or_default(),
        by_env: by_env
            .into_iter()
            .filter_map(|(env, rates)| Some((env?, rates)))
            .collect(),
    })
}

/// [`ClassCosts::by_env`] as lines: `minatar/breakout: batch 1 22600, batch 4 17000`.
pub fn rates_by_env(costs: &ClassCosts) -> String {
    let line = |(env, rates): &(String, Vec<(usize, f64)>)| {
        let rates: Vec<String> = rates
            .iter()
            .map(|(b, r)| format!("batch {b} {r:.0}"))
            .collect();
        format!("  {env}: {}", rates.join(", "))
    };
    let lines: Vec<String> = costs.by_env.iter().map(line).collect();
    format!(
        "steps/s with updates, by environment and batch size:\n{}",
        lines.join("\n")
    )
}

/// The wall time of runs taking `seconds` each, `jobs` at a time in plan order (each
/// job takes the next run when it is free, as `compare` does), on `cores` cores.
pub fn wall_seconds(seconds: &[f64], jobs: usize, cores: usize) -> f64 {
    let workers = jobs.clamp(1, cores.max(1));
    let mut free_at = vec![0.0f64; workers];
    for s in seconds {
        let next = free_at
            .iter_mut()
            .min_by(|a, b| a.total_cmp(b))
            .expect("one worker at least");
        *next += s;
    }
    free_at.into_iter().fold(0.0, f64::max)
}

/// `x` to three significant digits (0.132, 16.9, 1800).
fn three_digits(x: f64) -> String {
    let decimals = (2 - x.abs().max(1e-9).log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

fn duration(s: f64) -> String {
    if s < 7200.0 {
        format!("{:.0} minutes", s / 60.0)
    } else {
        format!("{:.1} hours", s / 3600.0)
    }
}

/// The plan in words: how many runs and steps, and, where `timing` gives it, how long.
pub fn describe_plan(
    config: &CompareConfig,
    runs: &[PlannedRun],
    jobs: usize,
    timing: Timing,
) -> Result<String> {
    // Each run's config once: its steps here, its batch size for a device's rates.
    let configs = runs
        .iter()
        .map(|run| config.config_for(run))
        .collect::<Result<Vec<TrainConfig>>>()?;
    let steps: u64 = configs.iter().map(|c| c.run.total_steps).sum();
    let variants: std::collections::BTreeSet<_> = runs.iter().map(|r| r.variant.as_str()).collect();
    let envs: std::collections::BTreeSet<_> = runs.iter().map(|r| r.env.as_str()).collect();
    let seeds: std::collections::BTreeSet<_> = runs.iter().map(|r| r.seed).collect();
    let (e, v, s) = (envs.len(), variants.len(), seeds.len());
    let shape = match e * v * s == runs.len() {
        true => format!("{e} environments x {v} variants x {s} seeds"),
        false => format!("of {e} environments, {v} variants and {s} seeds"),
    };
    let mut text = format!(
        "comparison '{}': {} runs ({shape}), {steps} environment steps",
        config.name,
        runs.len(),
    );
    if config.population.is_some() {
        let units = population_units(config, runs)?;
        let largest = units.iter().map(Vec::len).max().unwrap_or(0);
        text.push_str(&format!(
            "; as {} populations of up to {largest} runs",
            units.len()
        ));
    }
    match timing {
        Timing::Unmeasured => text.push_str("; `--dry-run` measures its time on this machine"),
        Timing::Classes(costs) => text.push_str(&class_text(costs, jobs)),
        Timing::Device(rates) => text.push_str(&device_text(&configs, rates, steps)?),
    }
    Ok(text)
}

/// The device estimate's words: each run's steps over the rate measured at its batch
/// size, summed (`configs`: the runs' own).
fn device_text(configs: &[TrainConfig], rates: &[MeasuredRate], steps: u64) -> Result<String> {
    let mut seconds = 0.0;
    for c in configs {
        let Some(m) = rates.iter().find(|m| m.batch_size == c.replay.batch_size) else {
            bail!("no rate was measured at batch size {}", c.replay.batch_size);
        };
        seconds += c.run.total_steps as f64 / m.agent_steps_per_second.max(1e-9);
    }
    let Some(first) = rates.first() else {
        bail!("no rate was measured");
    };
    let measured = match rates {
        [m] => format!(
            "{:.0} agent-steps/s (a population of {}, {} steps with updates)",
            m.agent_steps_per_second, m.members, m.steps
        ),
        _ => {
            let each: Vec<String> = rates
                .iter()
                .map(|m| format!("batch {} {:.0}", m.batch_size, m.agent_steps_per_second))
                .collect();
            format!(
                "{} agent-steps/s (the first population of each batch size, of {}, {} steps with updates)",
                each.join(", "),
                first.members,
                first.steps
            )
        }
    };
    Ok(format!(
        "; measured on {}: {measured}, so the study's {steps} agent-steps take about {} there",
        first.device,
        duration(seconds)
    ))
}

/// The CPU estimate's words: core-hours, the wall time for `jobs`, and the rates.
fn class_text(costs: &ClassCosts, jobs: usize) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total: f64 = costs.run_seconds.iter().sum();
    let wall = wall_seconds(&costs.run_seconds, jobs, cores);
    let shared = match jobs > cores {
        true => format!(" (more jobs than this machine's {cores} cores: they share them)"),
        false => String::new(),
    };
    let rates: Vec<String> = costs
        .rates
        .iter()
        .map(|(b, r)| format!("batch {b} {r:.0}"))
        .collect();
    format!(
        "; about {} core-hours on this CPU, {} with {jobs} jobs{shared}; by {} cost classes measured here ({} now, {} updates each; steps/s with updates: {})",
        three_digits(total / 3600.0),
        duration(wall),
        costs.classes,
        costs.measured_now,
        crate::study::rates::MEASURED_UPDATES,
        rates.join(", ")
    )
}
