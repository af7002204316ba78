//! Evaluations: greedy (or `eval.epsilon`) games of the agent, each game's score and
//! its first observation's `max_a Q` against the discounted return; with a [`Video`],
//! the pictures of the games it records.

use anyhow::Result;
use normrl_agents::dqn::Dqn;
use normrl_envs::{make, Env};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::config::TrainConfig;
use crate::logging::video::{FrameInfo, Video};
use crate::run::diagnostics::Evaluation;

/// A run's evaluation environment, kept between evaluations (outside environments are
/// costly to start), with the state it was made in where it can say so.
pub struct EvalEnv {
    env: Box<dyn Env>,
    made: Option<serde_json::Value>,
}

impl EvalEnv {
    pub fn make(id: &str) -> Result<Self> {
        let env = make(id)?;
        let made = env.save_state().ok();
        Ok(Self { env, made })
    }

    /// The environment as it was made, for an evaluation. A game's state outlives its
    /// reset (MinAtar's sticky action repeats the action before it), so an evaluation
    /// on the environment the last one left would depend on that one: on whether the
    /// run was resumed since (a resumed run makes a new environment), and unlike
    /// `normrl eval`'s. An environment that cannot save its state (a Python worker)
    /// relies on its seeded reset alone.
    pub fn fresh(&mut self) -> Result<&mut dyn Env> {
        if let Some(made) = &self.made {
            self.env.load_state(made)?;
        }
        Ok(self.env.as_mut())
    }
}

/// An evaluation (see [`Trainer::evaluate`]).
///
/// [`Trainer::evaluate`]: crate::train::Trainer::evaluate
pub fn evaluate(
    agent: &Dqn,
    config: &TrainConfig,
    index: u64,
    video: Option<&mut Video>,
) -> Result<Evaluation> {
    evaluate_in(make(&config.env.id)?.as_mut(), agent, config, index, video)
}

/// The seed of evaluation `index`'s first game in a run seeded `seed`; game `e` has
/// this plus `e`.
pub fn first_game_seed(seed: u64, index: u64) -> u64 {
    seed.wrapping_mul(1_000_003)
        .wrapping_add(1_000_000 + index * 1_000)
}

/// [`evaluate`] on an environment made from the run's id. Scores are those of whole
/// games as the environment's monitor counts them (all lives, unclipped rewards). Each
/// game's first observation's `max_a Q` is set against the discounted sum of the
/// rewards the learner sees (clipped where the environment clips them: what Q learns).
/// A video records the first observation and every step of the games it wants.
pub fn evaluate_in(
    env: &mut dyn Env,
    agent: &Dqn,
    config: &TrainConfig,
    index: u64,
    mut video: Option<&mut Video>,
) -> Result<Evaluation> {
    let mut obs = vec![0.0; env.observation_space().len()];
    let base = first_game_seed(config.run.seed, index);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(base);
    let gamma = config.dqn.gamma;
    let (mut total, mut q_start, mut discounted) = (0.0, 0.0, 0.0);
    let episodes = config.eval.episodes.max(1);
    for e in 0..episodes {
        // Wrapping, as a release build adds: a seed near 2^64 overflowed in debug.
        env.reset(Some(base.wrapping_add(e)), &mut obs)?;
        let mut film = |env: &mut dyn Env, step: u64, return_so_far: f64| match video.as_deref_mut()
        {
            Some(v) if v.records(e) => v.frame(
                env,
                FrameInfo {
                    episode: e,
                    step,
                    return_so_far,
                },
            ),
            _ => Ok(()),
        };
        film(env, 0, 0.0)?;
        let q = agent.q_values(&obs)?;
        q_start += q
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let (mut summed, mut weight, mut steps) = (0.0, 1.0, 0);
        loop {
            let action = agent.act(&obs, config.eval.epsilon, &mut rng)?;
            let (step, game_over) = env.step_game(action, &mut obs)?;
            steps += 1;
            summed += f64::from(step.reward);
            discounted += weight * f64::from(step.reward);
            weight *= gamma;
            // The monitor's count where there is one: whole games, unclipped.
            let so_far = env.episode_stats().map_or(summed, |s| s.current_return);
            film(env, steps, so_far)?;
            if game_over {
                let stats = env.episode_stats();
                total += stats.and_then(|s| s.last_return).unwrap_or(summed);
                break;
            }
            if step.done() {
                // A life lost: the game continues.
                env.reset(None, &mut obs)?;
            }
        }
    }
    let n = episodes as f64;
    Ok(Evaluation {
        mean_return: total / n,
        q_start: q_start / n,
        discounted_return: discounted / n,
    })
}
