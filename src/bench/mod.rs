//! `normrl bench`: update and acting times per normalization method, replay sampling
//! time, and end-to-end training speed, single thread by default.

mod launches;
pub mod parity;
mod population;
mod timing;

use std::time::Instant;

use anyhow::Result;
use candle_core::Device;
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig};
use normrl_agents::nn::{NormConfig, NormKind, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::replay::{Batch, ReplayBuffer, Sampler};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::bench::parity::TOLERANCE;
use crate::config::{parse_device_spec, select_device};
use crate::run::population::SingleRun;
use crate::run::train::{set_threads, Trainer};
use timing::{bench_train_config, random_batch, time_interleaved, time_us, Row, Timing};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to measure: `nn` (updates and acting per method), `replay`, `train`
    /// (end to end), `all` of these, `population` (P agents' updates as one against P
    /// separate ones, P = 1, 4, 16, 64 (to 256 on a GPU), with tensors and device reads
    /// per step; on a GPU also through the tensor forms, the population kernels' gain),
    /// `population-train` (P agents trained end to end as one population against P
    /// single runs: agent-steps/s; use a small `--steps`, e.g. 300), `population-host`
    /// (a population's host work: start-up, microseconds per member per step acting
    /// only and with updates, its parts, and the end; `--population P`), or `parity`
    /// (every method's values and gradients on `--device` against the CPU's, and every
    /// method's population over five updates; exits with
    /// an error beyond tolerance).
    #[arg(value_enum, default_value_t = Bench::All)]
    pub what: Bench,
    /// Timed iterations per measurement.
    #[arg(long, default_value_t = 300)]
    pub iters: usize,
    /// Environment steps of each end-to-end measurement.
    #[arg(long, default_value_t = 20_000)]
    pub steps: u64,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// `cpu`, `cuda`, `cuda:N` or `auto`. With `parity`, the device compared with the CPU.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long)]
    pub json: bool,
    /// With `nn` and `population`: only this normalization method, a preset (e.g.
    /// `none`, `batch_norm`) or a pair of parts (e.g. `unit_rows+batch_norm`).
    #[arg(long)]
    pub method: Option<String>,
    /// With `nn` and `population`: only cases whose name contains this text (e.g.
    /// `cnn b32`, `cnn b32 P=64`).
    #[arg(long)]
    pub case: Option<String>,
    /// With `population-host`: the population's size.
    #[arg(long, default_value_t = 256)]
    pub population: usize,
    /// Run the benchmark in this many fresh processes, one after another, and report
    /// each row's minimum, median and maximum over them: where memory lands differs
    /// between launches, and so may the speed.
    #[arg(long, default_value_t = 1)]
    pub launches: usize,
}

/// The benchmarks `normrl bench` runs (`all`: nn, replay and train).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Bench {
    All,
    Nn,
    Replay,
    Train,
    Population,
    PopulationTrain,
    PopulationHost,
    Parity,
}

/// One network and batch size of `bench nn`.
struct NnCase {
    name: &'static str,
    network: QNetworkConfig,
    obs_shape: Vec<usize>,
    n_actions: usize,
    batch_size: usize,
    /// MinAtar's binary frames (else uniform values).
    binary: bool,
}

fn nn_cases() -> [NnCase; 6] {
    let mlp = |name, batch_size| NnCase {
        name,
        network: QNetworkConfig::mlp(vec![64, 64]),
        obs_shape: vec![4],
        n_actions: 2,
        batch_size,
        binary: false,
    };
    let cnn = |name, batch_size| NnCase {
        name,
        network: QNetworkConfig::minatar_cnn(),
        obs_shape: vec![4, 10, 10],
        n_actions: 6,
        batch_size,
        binary: true,
    };
    [
        mlp("mlp 4-64-64-2 b32", 32),
        mlp("mlp 4-64-64-2 b256", 256),
        // The study's small batches: at 1 the optimizer's pass dominates, at 4 the
        // dense layer's few-rows forward.
        cnn("minatar cnn b1", 1),
        cnn("minatar cnn b4", 4),
        cnn("minatar cnn b32", 32),
        cnn("minatar cnn b256", 256),
    ]
}

/// The methods a benchmark measures: the one `--method` names (a preset, or a pair of
/// parts `weight+activation`), checked; else every preset.
fn methods(args: &BenchArgs) -> Result<Vec<NormConfig>> {
    Ok(match &args.method {
        Some(m) => vec![NormConfig::from_name(m).map_err(anyhow::Error::msg)?],
        None => NormKind::ALL.map(NormConfig::from).into(),
    })
}

fn nn_rows(args: &BenchArgs, device: &Device) -> Result<Vec<Row>> {
    let kinds = methods(args)?;
    let all = nn_cases();
    let cases: Vec<&NnCase> = all
        .iter()
        .filter(|c| args.case.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    if cases.is_empty() {
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        anyhow::bail!("no case matches --case; cases are {}", names.join(", "));
    }
    // One list of rows per method, filled case by case: every case times all methods
    // interleaved, so that their ratios survive a noisy machine.
    let mut by_kind: Vec<Vec<Row>> = kinds.iter().map(|_| vec![]).collect();
    for case in cases {
        for (rows, more) in by_kind
            .iter_mut()
            .zip(nn_case_rows(case, &kinds, args.iters, device)?)
        {
            rows.extend(more);
        }
    }
    Ok(by_kind.into_iter().flatten().collect())
}

/// Each method's update (and, at batch 32, acting) times on one case, interleaved.
fn nn_case_rows(
    case: &NnCase,
    kinds: &[NormConfig],
    iters: usize,
    device: &Device,
) -> Result<Vec<Vec<Row>>> {
    let obs_len: usize = case.obs_shape.iter().product();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let batch = random_batch(
        case.batch_size,
        obs_len,
        case.n_actions,
        case.binary,
        &mut rng,
    );
    let mut dqns = kinds
        .iter()
        .map(|kind| case_agent(case, kind, device))
        .collect::<candle_core::Result<Vec<Dqn>>>()?;
    let row = |bench: String, case: String, us: &Timing| Row {
        bench,
        case,
        value: us.median,
        min: Some(us.min),
        unit: "us",
    };
    let mut updates: Vec<Box<dyn FnMut() -> Result<()> + '_>> = dqns
        .iter_mut()
        .map(|dqn| {
            let batch = &batch;
            Box::new(move || dqn.update(batch).map(|_| ()).map_err(Into::into)) as Box<_>
        })
        .collect();
    let timings = time_interleaved(iters, device, &mut updates)?;
    drop(updates);
    let mut rows: Vec<Vec<Row>> = kinds
        .iter()
        .zip(&timings)
        .map(|(kind, us)| {
            vec![row(
                format!("update {}", kind.name()),
                case.name.to_string(),
                us,
            )]
        })
        .collect();
    if case.batch_size == 32 {
        let obs = &batch.obs[..obs_len];
        let mut acts: Vec<Box<dyn FnMut() -> Result<()> + '_>> = dqns
            .iter()
            .map(|dqn| {
                Box::new(move || dqn.greedy_action(obs).map(|_| ()).map_err(Into::into)) as Box<_>
            })
            .collect();
        let timings = time_interleaved(iters * 10, device, &mut acts)?;
        for ((rows, kind), us) in rows.iter_mut().zip(kinds).zip(&timings) {
            let case = case.name.replace(" b32", " b1");
            rows.push(row(format!("act {}", kind.name()), case, us));
        }
    }
    Ok(rows)
}

/// An agent of method `kind` on `case`'s network, with the trainer's defaults.
fn case_agent(case: &NnCase, kind: &NormConfig, device: &Device) -> candle_core::Result<Dqn> {
    let norm = NormConfig {
        // Batch renormalization's steady state: its clip open from the start (during
        // the warm-up it is batch norm).
        brn_warmup: 0,
        ..kind.clone()
    };
    let (optimizer, dqn) = (OptimizerConfig::default(), DqnConfig::default());
    let config = AgentConfig {
        network: &case.network,
        norm: &norm,
        optimizer: &optimizer,
        dqn: &dqn,
    };
    Dqn::new(config, &case.obs_shape, case.n_actions, 0, device)
}

fn replay_rows(iters: usize) -> Result<Vec<Row>> {
    let mut rows = vec![];
    let obs_len = 400;
    let mut replay = ReplayBuffer::new(100_000, obs_len, true);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let mut obs = vec![0.0f32; obs_len];
    replay.start_episode(&obs);
    for t in 0..100_000u32 {
        for v in obs.iter_mut() {
            *v = (rng.random::<f32>() < 0.1) as u8 as f32;
        }
        replay.push((t % 6) as usize, 0.0, t % 500 == 499, false, &obs);
        if t % 500 == 499 {
            replay.start_episode(&obs);
        }
    }
    for sampler in Sampler::ALL {
        let mut batch = Batch::new(32, obs_len);
        let us = time_us(iters * 10, &Device::Cpu, || {
            replay
                .sample(sampler, &mut batch, &mut rng)
                .map_err(Into::into)
        })?;
        rows.push(Row {
            bench: "replay sample".into(),
            case: format!("{} b32 minatar 100k", sampler.name()),
            value: us.median,
            min: Some(us.min),
            unit: "us",
        });
    }
    Ok(rows)
}

fn train_rows(steps: u64, device: &str) -> Result<Vec<Row>> {
    let mut rows = vec![];
    let cases = [
        (
            "cartpole mlp 64-64 b32",
            "classic/cartpole",
            "{type=\"mlp\",hidden=[64,64]}",
        ),
        (
            "minatar/breakout cnn b32",
            "minatar/breakout",
            "{type=\"minatar_cnn\"}",
        ),
    ];
    for (name, env, arch) in cases {
        let config = bench_train_config((env, arch), 32, steps, device)?;
        let dir = std::env::temp_dir().join(format!(
            "normrl-bench-{}-{}",
            std::process::id(),
            rows.len()
        ));
        // A device's one engine: a population of one there.
        let mut trainer = SingleRun::new(Trainer::new(config, &dir)?)?;
        trainer.run(Some(1000))?;
        let t = Instant::now();
        trainer.run(Some(1000 + steps))?;
        let sps = steps as f64 / t.elapsed().as_secs_f64();
        let _ = std::fs::remove_dir_all(&dir);
        rows.push(Row {
            bench: "train end-to-end".into(),
            case: name.into(),
            value: sps,
            min: None,
            unit: "steps/s",
        });
    }
    Ok(rows)
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    if args.launches > 1 {
        return launches::run(args.launches, args.json);
    }
    if args.launches == 0 {
        anyhow::bail!("--launches must be a positive integer");
    }
    set_threads(args.threads);
    let (what, all) = (args.what, args.what == Bench::All);
    let device = select_device(parse_device_spec(&args.device)?)?;
    if what == Bench::Parity {
        return parity(&device, args.json);
    }
    let mut rows = vec![];
    if all || what == Bench::Nn {
        rows.extend(nn_rows(args, &device)?);
    }
    if all || what == Bench::Replay {
        rows.extend(replay_rows(args.iters)?);
    }
    if all || what == Bench::Train {
        rows.extend(train_rows(args.steps, &args.device)?);
    }
    if what == Bench::Population {
        let filter = population::Filter {
            methods: methods(args)?,
            case: args.case.as_deref(),
        };
        rows.extend(population::rows(args.iters, &device, filter)?);
    }
    if what == Bench::PopulationTrain {
        let rows_of = population::train_rows;
        rows.extend(rows_of(args.steps, &device, &args.device)?);
    }
    if what == Bench::PopulationHost {
        let host_rows = population::host_rows;
        rows.extend(host_rows(args.population, args.steps, &args.device)?);
    }
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
    } else {
        println!(
            "threads: {}, device: {:?}, product kernels: {}",
            args.threads,
            device,
            normrl_agents::product_kernels()
        );
        println!(
            "{:<26} {:<30} {:>12} {:>12}",
            "benchmark", "case", "median", "min"
        );
        for row in &rows {
            let min = row.min.map(|m| format!("{m:>9.1} {}", row.unit));
            println!(
                "{:<26} {:<30} {:>9.1} {:<7} {}",
                row.bench,
                row.case,
                row.value,
                row.unit,
                min.unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// The population rows of `bench parity`: a population's updates on `device` against
/// the CPU's, with the path the device took; failures are added to `failed`.
fn population_parity(device: &Device, json: bool, failed: &mut Vec<String>) -> Result<()> {
    let rows = crate::bench::parity::population_check(device)?;
    if !json {
        println!();
        println!("populations of 3, 5 updates: metrics and weights against the CPU's fused step");
    }
    for r in &rows {
        let ok = r.metric_error <= TOLERANCE && r.weight_error <= TOLERANCE;
        let network = format!("population {}", r.network).replace(' ', "-");
        if !ok {
            failed.push(format!("{} {network}", r.method));
        }
        if json {
            println!(
                "{}",
                serde_json::json!({"method": r.method, "network": network,
                    "metric_error": r.metric_error, "weight_error": r.weight_error,
                    "path": r.path, "ok": ok})
            );
        } else {
            let flag = if ok { "" } else { "  FAILED" };
            println!(
                "{:<16} {:<26} {:>10.2e} {:>10.2e}  {}{flag}",
                r.method, network, r.metric_error, r.weight_error, r.path
            );
        }
    }
    Ok(())
}

fn parity(device: &Device, json: bool) -> Result<()> {
    let results = crate::bench::parity::check(device)?;
    if !json {
        println!("{device:?} against the CPU (max relative difference; tolerance {TOLERANCE:e})");
        println!(
            "{:<16} {:<20} {:>10} {:>10}  worst variable",
            "method", "network", "q-values", "gradients"
        );
    }
    let mut failed = vec![];
    for r in &results {
        let ok = r.q_error <= TOLERANCE && r.grad_error <= TOLERANCE;
        if !ok {
            failed.push(format!("{} {}", r.method, r.network));
        }
        if json {
            println!(
                "{}",
                serde_json::json!({"method": r.method, "network": r.network,
                    "q_error": r.q_error, "grad_error": r.grad_error,
                    "worst_variable": r.worst_variable, "ok": ok})
            );
        } else {
            println!(
                "{:<16} {:<20} {:>10.2e} {:>10.2e}  {}{}",
                r.method,
                r.network,
                r.q_error,
                r.grad_error,
                r.worst_variable,
                if ok { "" } else { "  FAILED" }
            );
        }
    }
    population_parity(device, json, &mut failed)?;
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} differ from the CPU beyond {TOLERANCE:e}: {}",
            failed.len(),
            failed.join(", ")
        )
    }
}
