//! A comparison's plan before it runs: the checks that refuse it early, its cost
//! estimated on the CPU or measured on its device, and the plan as printed.

use std::path::Path;

use anyhow::{bail, Result};

use crate::config::TrainConfig;
use crate::study::compare::{population_units, CompareConfig, PlannedRun};

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
