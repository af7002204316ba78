//! What every benchmark shares: its result row, timing with warm-up and interleaving,
//! a random batch, and the end-to-end runs' config.

use std::time::Instant;

use anyhow::Result;
use candle_core::Device;
use normrl_agents::replay::Batch;
use rand::Rng;
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::Serialize;

use crate::config::TrainConfig;

#[derive(Debug, Serialize)]
pub(crate) struct Row {
    pub bench: String,
    pub case: String,
    /// The median (timings) or the single measurement (throughput).
    pub value: f64,
    /// The fastest timing: on a shared machine the least disturbed, the better number
    /// for comparing two rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    pub unit: &'static str,
}

/// Median and minimum of a set of timings.
pub(crate) struct Timing {
    pub median: f64,
    pub min: f64,
}

/// Median and minimum of `iters` timings of `f`, in microseconds, after a warm-up; each
/// timing waits for `device` to finish the work queued.
pub(crate) fn time_us(
    iters: usize,
    device: &Device,
    f: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let mut fs: Vec<Box<dyn FnMut() -> Result<()> + '_>> = vec![Box::new(f)];
    Ok(time_interleaved(iters, device, &mut fs)?.remove(0))
}

/// [`time_us`] for several functions at once, in interleaved rounds: a slow spell of a
/// shared machine then falls on all of them alike, and their ratios hold.
pub(crate) fn time_interleaved(
    iters: usize,
    device: &Device,
    fs: &mut [Box<dyn FnMut() -> Result<()> + '_>],
) -> Result<Vec<Timing>> {
    const ROUNDS: usize = 10;
    for f in fs.iter_mut() {
        for _ in 0..iters.div_ceil(10).max(3) {
            f()?;
        }
    }
    device.synchronize()?;
    let per_round = iters.div_ceil(ROUNDS).max(1);
    let mut times = vec![Vec::with_capacity(per_round * ROUNDS); fs.len()];
    for _ in 0..ROUNDS {
        for (f, times) in fs.iter_mut().zip(&mut times) {
            for _ in 0..per_round {
                let t = Instant::now();
                f()?;
                device.synchronize()?;
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    Ok(times
        .into_iter()
        .map(|mut times| {
            times.sort_by(f64::total_cmp);
            Timing {
                median: times[times.len() / 2],
                min: times[0],
            }
        })
        .collect())
}

pub(crate) fn random_batch(
    size: usize,
    obs_len: usize,
    n_actions: usize,
    binary: bool,
    rng: &mut Xoshiro256PlusPlus,
) -> Batch {
    let mut batch = Batch::new(size, obs_len);
    let draw = |rng: &mut Xoshiro256PlusPlus| {
        if binary {
            (rng.random::<f32>() < 0.1) as u8 as f32
        } else {
            rng.random::<f32>() - 0.5
        }
    };
    for v in batch.obs.iter_mut().chain(batch.next_obs.iter_mut()) {
        *v = draw(rng);
    }
    for i in 0..size {
        batch.actions[i] = rng.random_range(0..n_actions) as u32;
        batch.rewards[i] = rng.random();
        batch.terminated[i] = (rng.random::<f32>() < 0.05) as u8 as f32;
    }
    batch
}

/// An end-to-end benchmark's run: `env` with network `arch` at `batch`, 1,000 steps of
/// warm-up without updates then `steps` with an update every step; one evaluation
/// episode at the end, no checkpoints but the last (without the replay), no logs.
pub(crate) fn bench_train_config(
    (env, arch): (&str, &str),
    batch: usize,
    steps: u64,
    device: &str,
) -> Result<TrainConfig> {
    let overrides: Vec<String> = vec![
        format!("env.id={env}"),
        format!("network.architecture={arch}"),
        format!("run.total_steps={}", steps + 1000),
        format!("replay.batch_size={batch}"),
        "replay.learning_starts=1000".into(),
        "replay.train_frequency=1".into(),
        "eval.interval=0".into(),
        "eval.episodes=1".into(),
        "checkpoint.interval=0".into(),
        "checkpoint.replay=false".into(),
        "logging.progress=false".into(),
        "logging.layer_stats_interval=0".into(),
        format!("run.device=\"{device}\""),
    ];
    TrainConfig::from_toml_str("", &overrides)
}
