//! `normrl bench population`: P agents' updates as one population update against P
//! separate agents' updates, and the population update's graph size (its operations,
//! which do not grow with P), for MLP Q-networks with the methods populations support.

use anyhow::Result;
use candle_core::Device;
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig};
use normrl_agents::nn::{NormConfig, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::population::count::{device_reads, tensors_created};
use normrl_agents::population::{PopulationDqn, PopulationNet, ShardedPopulation};
use normrl_agents::replay::Batch;
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::timing::{bench_train_config, random_batch, time_interleaved, Row, Timing};

/// Population sizes: up to 64 on the CPU, to 256 on a GPU (the study size).
const POPULATIONS_CPU: [usize; 4] = [1, 4, 16, 64];
const POPULATIONS_GPU: [usize; 4] = [1, 16, 64, 256];

/// A network of the benchmark: CartPole's MLP 4-64-64-2, or MinAtar's CNN on 4x10x10
/// binary frames with 6 actions.
pub(super) struct Net {
    pub(super) name: &'static str,
    pub(super) config: QNetworkConfig,
    pub(super) obs: Vec<usize>,
    pub(super) actions: usize,
    pub(super) binary: bool,
}

pub(super) fn nets() -> [Net; 2] {
    [
        Net {
            name: "mlp 4-64-64-2",
            config: QNetworkConfig::mlp(vec![64, 64]),
            obs: vec![4],
            actions: 2,
            binary: false,
        },
        Net {
            name: "minatar cnn",
            config: QNetworkConfig::minatar_cnn(),
            obs: vec![4, 10, 10],
            actions: 6,
            binary: true,
        },
    ]
}

/// `P` single agents (seeds 0..P) of `norm` on `net`, with the default optimizer.
fn agents(net: &Net, norm: &NormConfig, p: usize, device: &Device) -> Result<Vec<Dqn>> {
    agents_with(
        net,
        (norm, &DqnConfig::default()),
        &OptimizerConfig::default(),
        p,
        device,
    )
}

/// `P` single agents (seeds 0..P) of `norm` on `net` with `optimizer`, on `device`.
pub(super) fn agents_with(
    net: &Net,
    (norm, dqn): (&NormConfig, &DqnConfig),
    optimizer: &OptimizerConfig,
    p: usize,
    device: &Device,
) -> Result<Vec<Dqn>> {
    let (network, obs, actions) = (&net.config, &net.obs, net.actions);
    let config = AgentConfig {
        network,
        norm,
        optimizer,
        dqn,
    };
    (0..p as u64)
        .map(|seed| Dqn::new(config, obs, actions, seed, device).map_err(Into::into))
        .collect()
}

/// On a device, the same population through the tensor forms (the device kernels'
/// gain) and with its step captured as a CUDA graph, as the trainer runs it there (the
/// graphs' gain), each measured on the same machine in the same sitting; none on the
/// CPU.
fn device_variants(
    separate: &[Dqn],
    batch: usize,
    device: &Device,
) -> Result<(Option<PopulationDqn>, Option<ShardedPopulation>)> {
    if device.is_cpu() {
        return Ok((None, None));
    }
    let nets: Vec<_> = separate.iter().map(Dqn::online).collect();
    let config = (DqnConfig::default(), OptimizerConfig::default());
    let stacked = PopulationDqn::new(PopulationNet::stack(&nets)?, config.0, config.1)?;
    let singles: Vec<&Dqn> = separate.iter().collect();
    let graphs = ShardedPopulation::from_agents(&singles, batch)?.with_cuda_graphs(true);
    Ok((Some(stacked.with_tensor_forms()?), Some(graphs)))
}

/// Every row for one network, method, batch size and population size.
fn case_rows(
    net: &Net,
    (kind, batch, p): (&NormConfig, usize, usize),
    iters: usize,
    device: &Device,
) -> Result<Vec<Row>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let obs_len = net.obs.iter().product();
    let batches: Vec<Batch> = (0..p)
        .map(|_| random_batch(batch, obs_len, net.actions, net.binary, &mut rng))
        .collect();
    let mut separate = agents(net, kind, p, device)?;
    let nets: Vec<_> = separate.iter().map(Dqn::online).collect();
    // Counted on one shard of all P agents: the step a device runs.
    let stacked = PopulationNet::stack(&nets)?;
    let mut one = PopulationDqn::new(stacked, DqnConfig::default(), OptimizerConfig::default())?;
    let nodes = one.loss_graph_nodes(&batches)?;
    let (ops, reads) = step_counts(&mut one, &batches)?;
    // Timed as the trainer runs it: in shards sized for the device.
    let mut population =
        ShardedPopulation::from_agents(&separate.iter().collect::<Vec<_>>(), batch)?;
    let shard = population.shard_size();
    let (mut forms, mut graphs) = device_variants(&separate, batch, device)?;
    let timings = {
        let batches = &batches;
        let mut fs: Vec<Box<dyn FnMut() -> Result<()> + '_>> = vec![
            Box::new(|| population.update(batches).map(|_| ()).map_err(Into::into)),
            Box::new(|| {
                for (agent, b) in separate.iter_mut().zip(batches) {
                    agent.update(b)?;
                }
                Ok(())
            }),
        ];
        if let (Some(forms), Some(graphs)) = (forms.as_mut(), graphs.as_mut()) {
            fs.push(Box::new(|| {
                forms.update(batches).map(|_| ()).map_err(Into::into)
            }));
            fs.push(Box::new(|| {
                graphs.update(batches).map(|_| ()).map_err(Into::into)
            }));
        }
        time_interleaved(iters, device, &mut fs)?
    };
    let case = format!("{} b{batch} P={p}", net.name);
    let counted = [
        ("shard size", shard as f64, "agents"),
        ("graph", nodes as f64, "nodes"),
        ("ops/step", ops as f64, "tensors"),
        ("reads/step", reads as f64, "reads"),
    ];
    Ok(rows_of(&case, kind, p, &timings, &counted))
}

/// A case's rows: each variant's update time and agent-updates per second, then the
/// counts.
fn rows_of(
    case: &str,
    kind: &NormConfig,
    p: usize,
    timings: &[Timing],
    counted: &[(&str, f64, &'static str)],
) -> Vec<Row> {
    let case = case.to_string();
    let mut rows = vec![];
    for (name, t) in ["population", "separate", "tensor-forms", "graphs"]
        .iter()
        .zip(timings)
    {
        rows.push(Row {
            bench: format!("{name} update {}", kind.name()),
            case: case.clone(),
            value: t.median,
            min: Some(t.min),
            unit: "us",
        });
        rows.push(Row {
            bench: format!("{name} agent-updates/s"),
            case: case.clone(),
            value: p as f64 / t.min * 1e6,
            min: None,
            unit: "1/s",
        });
    }
    for &(what, value, unit) in counted {
        rows.push(Row {
            bench: format!("population {what} {}", kind.name()),
            case: case.clone(),
            value,
            min: None,
            unit,
        });
    }
    rows
}

/// The tensors created and device reads of one population step: every agent's greedy
/// action on its first observation, and one update (after a first step that did the
/// one-time initialization). Counted in this single-threaded benchmark, where nothing
/// else creates tensors.
fn step_counts(population: &mut PopulationDqn, batches: &[Batch]) -> Result<(u64, u64)> {
    let obs_len = batches[0].obs.len() / batches[0].size.max(1);
    let obs: Vec<f32> = batches
        .iter()
        .flat_map(|b| b.obs[..obs_len].to_vec())
        .collect();
    let mut step = || -> Result<()> {
        population.greedy_actions(&obs)?;
        population.update(batches)?;
        Ok(())
    };
    step()?;
    let (t0, r0) = (tensors_created(), device_reads());
    step()?;
    Ok((tensors_created() - t0, device_reads() - r0))
}

/// The population rows: the MLP and MinAtar's CNN with every method of the registry (or
/// `filter`'s method); batch 4 and 32; P = 1 to 64 on the CPU, 1 to
/// 256 on a GPU; the cases `filter` lets through.
pub fn rows(iters: usize, device: &Device, filter: Filter) -> Result<Vec<Row>> {
    let populations = match device.is_cpu() {
        true => POPULATIONS_CPU,
        false => POPULATIONS_GPU,
    };
    let kinds = &filter.methods;
    let mut rows = vec![];
    for net in nets() {
        for (kind, batch, p) in kinds
            .iter()
            .flat_map(|k| [4, 32].into_iter().map(move |b| (k, b)))
            .flat_map(|(k, b)| populations.into_iter().map(move |p| (k, b, p)))
        {
            let case = format!("{} b{batch} P={p}", net.name);
            if filter.case.is_some_and(|c| !case.contains(c)) {
                continue;
            }
            // Fewer rounds for the large populations: a round is P updates.
            let rounds = (iters / p.max(1)).max(10);
            rows.extend(case_rows(&net, (kind, batch, p), rounds, device)?);
        }
    }
    Ok(rows)
}

/// Which rows of [`rows`] to measure: those of `methods`, cases whose name holds `case`
/// (`"cnn b32 P=64"`).
#[derive(Clone)]
pub struct Filter<'a> {
    pub methods: Vec<NormConfig>,
    pub case: Option<&'a str>,
}

/// End to end: P agents trained by the trainer as one population against the same P
/// trained one after the other as single runs (one core each way), after 1,000 steps
/// of warm-up without updates; then `steps` steps with an update every step, the
/// final evaluation (one episode) and checkpoint included on both sides. Aggregate
/// agent-steps/s, on CartPole's MLP and MinAtar Breakout's CNN at batch 4 and 32.
pub fn train_rows(steps: u64, device: &Device, device_spec: &str) -> Result<Vec<Row>> {
    let populations = match device.is_cpu() {
        true => POPULATIONS_CPU,
        false => POPULATIONS_GPU,
    };
    let cases = [
        (
            "cartpole mlp 64-64",
            "classic/cartpole",
            "{type=\"mlp\",hidden=[64,64]}",
        ),
        (
            "minatar/breakout cnn",
            "minatar/breakout",
            "{type=\"minatar_cnn\"}",
        ),
    ];
    let mut rows = vec![];
    for (name, env, arch) in cases {
        for batch in [4, 32] {
            for p in populations {
                let config = bench_train_config((env, arch), batch, steps, device_spec)?;
                let case = format!("{name} b{batch} P={p}");
                let [together, alone] = train_both(&config, p, steps)?;
                for (what, seconds) in [("population", together), ("separate", alone)] {
                    rows.push(Row {
                        bench: format!("{what} train agent-steps/s"),
                        case: case.clone(),
                        value: (p as u64 * steps) as f64 / seconds,
                        min: None,
                        unit: "1/s",
                    });
                }
            }
        }
    }
    Ok(rows)
}

/// Seconds of the timed part for P agents as one population, then one after another.
fn train_both(config: &crate::config::TrainConfig, p: usize, steps: u64) -> Result<[f64; 2]> {
    use crate::run::population::Population;
    let root = std::env::temp_dir().join(format!("normrl-bench-population-{}", std::process::id()));
    let trainers = |side: &str| trainers(config, p, &root.join(side));
    let mut population = Population::new(trainers("population")?)?;
    population.run(Some(1000))?;
    let t = std::time::Instant::now();
    population.run(Some(1000 + steps))?;
    let together = t.elapsed().as_secs_f64();
    let mut alone = 0.0;
    for mut trainer in trainers("separate")? {
        trainer.run(Some(1000))?;
        let t = std::time::Instant::now();
        trainer.run(Some(1000 + steps))?;
        alone += t.elapsed().as_secs_f64();
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok([together, alone])
}

/// A population's host work, MinAtar Breakout's CNN at batch 32 with its frames
/// mirrored (forced on the CPU; automatic on an accelerator): the start-up (P members
/// made, then stacked and mirrored), microseconds per member per step over `steps`
/// steps acting only and then with an update every step, each split into its parts
/// (`HostTimes`), and the end (every member exported, as before a checkpoint).
pub fn host_rows(p: usize, steps: u64, device_spec: &str) -> Result<Vec<Row>> {
    use crate::run::population::Population;
    let arch = "{type=\"minatar_cnn\"}";
    let config = bench_train_config(("minatar/breakout", arch), 32, steps + 1000, device_spec)?;
    let root = std::env::temp_dir().join(format!("normrl-bench-host-{}", std::process::id()));
    let row = |bench: &str, value: f64, unit: &'static str| Row {
        bench: bench.into(),
        case: format!("breakout cnn b32 P={p}"),
        value,
        min: None,
        unit,
    };
    let t = std::time::Instant::now();
    let trainers = trainers(&config, p, &root)?;
    let made = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let population = Population::new(trainers)?;
    let stacked = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let mut population = population.with_device_frames(true)?;
    let mirrored = t.elapsed().as_secs_f64();
    let mut rows = vec![
        row("population start: members", made, "s"),
        row("population start: stack", stacked, "s"),
        row("population start: mirror", mirrored, "s"),
    ];
    // Acting only: the first steps of the 1,000 before learning starts.
    population.run(Some(steps.min(999)))?;
    rows.extend(step_rows(&population, p, "acting only"));
    population.run(Some(1000))?;
    population.reset_times();
    population.run(Some(1000 + steps))?;
    rows.extend(step_rows(&population, p, "with updates"));
    let t = std::time::Instant::now();
    population.export_members()?;
    rows.push(row(
        "population end: export",
        t.elapsed().as_secs_f64(),
        "s",
    ));
    let _ = std::fs::remove_dir_all(&root);
    Ok(rows)
}

/// P runs of `config` with seeds 1..=P, in `root/seed-<s>`.
fn trainers(
    config: &crate::config::TrainConfig,
    p: usize,
    root: &std::path::Path,
) -> Result<Vec<crate::run::train::Trainer>> {
    (1..=p as u64)
        .map(|seed| {
            let mut c = config.clone();
            c.run.seed = seed;
            crate::run::train::Trainer::new(c, &root.join(format!("seed-{seed}")))
        })
        .collect()
}

/// Microseconds per member per step since the population's times were reset: in all
/// and by part.
fn step_rows(population: &crate::run::population::Population, p: usize, what: &str) -> Vec<Row> {
    let t = population.times();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / (t.steps.max(1) as f64 * p as f64);
    let parts = [
        (
            "all",
            t.forward + t.members + t.mirror + t.sample + t.update,
        ),
        ("forward", t.forward),
        ("members", t.members),
        ("mirror", t.mirror),
        ("sample", t.sample),
        ("update", t.update),
    ];
    parts
        .into_iter()
        .map(|(part, d)| Row {
            bench: format!("host us/member/step {what}"),
            case: format!("{part} P={p}"),
            value: per(d),
            min: None,
            unit: "us",
        })
        .collect()
}
