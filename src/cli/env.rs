//! `normrl env ...`: rollouts and stepping benchmarks.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use normrl_envs::{known_ids, make, Env, Step};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

#[derive(Debug, clap::Args)]
pub struct RolloutArgs {
    /// Environment id, e.g. `minatar/breakout?sticky=0` (see `normrl env list`).
    #[arg(long)]
    pub env: String,
    /// `random`, `noop`, `fixed:A` (always action A) or `actions:FILE` (whitespace- or
    /// comma-separated action indices, played in order across episodes).
    #[arg(long, default_value = "random")]
    pub policy: String,
    #[arg(long, default_value_t = 1)]
    pub episodes: u64,
    /// Seeds the environment (at the first reset) and the random policy.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also print one record per step.
    #[arg(long)]
    pub trace: bool,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Environment id, or `all` for CartPole and every MinAtar game.
    #[arg(long, default_value = "all")]
    pub env: String,
    /// At least 1 (0 steps would print a rate of inf).
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    #[arg(long)]
    pub json: bool,
}

enum Policy {
    Random(Xoshiro256PlusPlus),
    Fixed(usize),
    Actions(Vec<usize>, usize),
}

impl Policy {
    fn parse(spec: &str, seed: u64, n: usize) -> Result<Self> {
        let policy = if spec == "random" {
            Policy::Random(Xoshiro256PlusPlus::seed_from_u64(
                seed ^ 0x9E37_79B9_7F4A_7C15,
            ))
        } else if spec == "noop" {
            Policy::Fixed(0)
        } else if let Some(a) = spec.strip_prefix("fixed:") {
            let a: usize = a
                .parse()
                .with_context(|| format!("policy '{spec}': '{a}' is not an action index"))?;
            Policy::Fixed(a)
        } else if let Some(path) = spec.strip_prefix("actions:") {
            let path = PathBuf::from(path);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read action file {}", path.display()))?;
            let actions = text
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<usize>().with_context(|| {
                        format!("{}: '{s}' is not an action index", path.display())
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            if actions.is_empty() {
                bail!("{} holds no actions", path.display());
            }
            Policy::Actions(actions, 0)
        } else {
            bail!("unknown policy '{spec}': expected random, noop, fixed:A or actions:FILE");
        };
        match &policy {
            Policy::Fixed(a) if *a >= n => {
                bail!(
                    "policy '{spec}': action {a} is out of range: this environment accepts 0..{n}"
                )
            }
            Policy::Actions(actions, _) => {
                if let Some(a) = actions.iter().find(|&&a| a >= n) {
                    bail!("policy '{spec}': action {a} is out of range: this environment accepts 0..{n}");
                }
            }
            _ => {}
        }
        Ok(policy)
    }

    /// The next action, or None when an action file has run out.
    fn act(&mut self, n: usize) -> Option<usize> {
        match self {
            Policy::Random(rng) => Some(rng.random_range(0..n)),
            Policy::Fixed(a) => Some(*a),
            Policy::Actions(list, i) => {
                let a = list.get(*i).copied();
                *i += 1;
                a
            }
        }
    }
}

/// Observation for a trace: indices of the set cells for binary grids, values otherwise.
fn obs_json(obs: &[f32], binary: bool) -> serde_json::Value {
    if binary {
        let on: Vec<usize> = (0..obs.len()).filter(|&i| obs[i] != 0.0).collect();
        serde_json::json!({ "on": on })
    } else {
        serde_json::json!(obs)
    }
}

pub fn rollout(args: &RolloutArgs) -> Result<()> {
    let mut env = make(&args.env)?;
    let space = env.observation_space();
    let n = env.action_space().n;
    let mut policy = Policy::parse(&args.policy, args.seed, n)?;
    let mut obs = vec![0.0f32; space.len()];
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut returns = vec![];
    'episodes: for episode in 0..args.episodes {
        let seed = (episode == 0).then_some(args.seed);
        env.reset(seed, &mut obs)?;
        if args.trace && args.json {
            let record = serde_json::json!({"episode": episode, "step": 0, "obs": obs_json(&obs, space.binary)});
            writeln!(out, "{record}")?;
        }
        let (mut ret, mut len) = (0.0f64, 0u64);
        loop {
            let Some(action) = policy.act(n) else {
                eprintln!("the action file ran out in episode {episode} after {len} steps");
                break 'episodes;
            };
            let (step, game_over) = env.step_game(action, &mut obs)?;
            ret += f64::from(step.reward);
            len += 1;
            if args.trace {
                let obs = obs_json(&obs, space.binary);
                write_step(&mut out, args.json, (episode, len), action, &step, obs)?;
            }
            if step.done() && !game_over {
                // Only a life was lost (Atari preset): the game goes on.
                env.reset(None, &mut obs)?;
                continue;
            }
            if game_over {
                // The monitor's score is the game's own (unclipped, all lives).
                let stats = env.episode_stats();
                if let Some(r) = stats.and_then(|s| s.last_return) {
                    ret = r;
                }
                if let Some(l) = stats.and_then(|s| s.last_length) {
                    len = l;
                }
                write_game(&mut out, args.json, (episode, len), ret, &step)?;
                returns.push(ret);
                break;
            }
        }
    }
    if !args.json && !returns.is_empty() {
        let mean = returns.iter().sum::<f64>() / returns.len() as f64;
        writeln!(
            out,
            "{} episodes on {}: mean return {mean:.2}",
            returns.len(),
            args.env
        )?;
    }
    Ok(())
}

/// One traced step of `rollout`, at `(episode, step)`.
fn write_step(
    out: &mut impl Write,
    json: bool,
    (episode, len): (u64, u64),
    action: usize,
    step: &Step,
    obs: serde_json::Value,
) -> Result<()> {
    if json {
        let record = serde_json::json!({
            "episode": episode, "step": len, "action": action, "reward": step.reward,
            "terminated": step.terminated, "truncated": step.truncated, "obs": obs,
        });
        writeln!(out, "{record}")?;
    } else {
        writeln!(
            out,
            "  step {len:>6}  action {action}  reward {:>4}  terminated {}  truncated {}",
            step.reward, step.terminated, step.truncated
        )?;
    }
    Ok(())
}

/// A finished game of `rollout`: its return and length.
fn write_game(
    out: &mut impl Write,
    json: bool,
    (episode, len): (u64, u64),
    ret: f64,
    step: &Step,
) -> Result<()> {
    if json {
        let record = serde_json::json!({
            "episode": episode, "return": ret, "length": len,
            "terminated": step.terminated, "truncated": step.truncated,
        });
        writeln!(out, "{record}")?;
    } else {
        let end = if step.terminated {
            "terminated"
        } else {
            "truncated"
        };
        writeln!(
            out,
            "episode {episode:>4}  return {ret:>8.1}  length {len:>6}  ({end})"
        )?;
    }
    Ok(())
}

/// Steps `env` with uniform random actions for `steps` steps, writing the observation
/// every step and resetting at episode ends. Returns steps per second.
pub fn bench_env(env: &mut dyn Env, steps: u64) -> Result<f64> {
    let n = env.action_space().n;
    let mut obs = vec![0.0f32; env.observation_space().len()];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
    env.reset(Some(1), &mut obs)?;
    let start = Instant::now();
    for _ in 0..steps {
        let action = rng.random_range(0..n);
        if env.step(action, &mut obs)?.done() {
            env.reset(None, &mut obs)?;
        }
    }
    std::hint::black_box(&obs);
    Ok(steps as f64 / start.elapsed().as_secs_f64())
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    let ids = if args.env == "all" {
        known_ids()
    } else {
        vec![args.env.clone()]
    };
    if !args.json {
        println!("{:<28} {:>14} {:>12}", "environment", "steps/s", "ns/step");
    }
    for id in ids {
        let mut env = make(&id)?;
        let sps = bench_env(env.as_mut(), args.steps)?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"env": id, "steps": args.steps, "steps_per_sec": sps})
            );
        } else {
            println!("{:<28} {:>14.0} {:>12.1}", id, sps, 1e9 / sps);
        }
    }
    Ok(())
}

pub fn list() {
    println!("environments (options after '?', joined by '&'):");
    for id in known_ids() {
        let options = if id.starts_with("minatar/") {
            "sticky=0.1 ramping=true minimal_actions=false max_steps=10000"
        } else {
            "max_steps=500"
        };
        println!("  {id:<26} {options}");
    }
    println!(
        "  {:<26} any Gymnasium id through a Python worker, e.g. gym:CartPole-v1",
        "gym:<id>"
    );
    println!(
        "  {:<26} python=python3 (or NORMRL_PYTHON) preset=atari noop_max=30 frame_skip=4",
        ""
    );
    println!(
        "  {:<26} frame_stack=4 screen_size=84 terminal_on_life_loss=true clip_rewards=true fire_reset=true",
        ""
    );
    println!(
        "  {:<26} other key=value pairs go to gym.make as keyword arguments",
        ""
    );
}
