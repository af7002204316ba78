//! Evaluations: greedy (or `eval.epsilon`) games of the agent, each game's score and
//! its first observation's `max_a Q` against the discounted return.

use anyhow::Result;
use normrl_agents::dqn::Dqn;
use normrl_envs::{make, Env};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::config::TrainConfig;
use crate::run::diagnostics::Evaluation;

/// An evaluation (see [`Trainer::evaluate`]).
pub fn evaluate(agent: &Dqn, config: &TrainConfig, index: u64) -> Result<Evaluation> {
    evaluate_in(make(&config.env.id)?.as_mut(), agent, config, index)
}

/// [`evaluate`] on an environment made from the run's id. Scores are those of whole
/// games as the environment's monitor counts them (all lives, unclipped rewards). Each
/// game's first observation's `max_a Q` is set against the discounted sum of the
/// rewards the learner sees (clipped where the environment clips them: what Q learns).
pub fn evaluate_in(
    env: &mut dyn Env,
    agent: &Dqn,
    config: &TrainConfig,
    index: u64,
) -> Result<Evaluation> {
    let mut obs = vec![0.0; env.observation_space().len()];
    let base = config
        .run
        .seed
        .wrapping_mul(1_000_003)
        .wrapping_add(1_000_000 + index * 1_000);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(base);
    let gamma = config.dqn.gamma;
    let (mut total, mut q_start, mut discounted) = (0.0, 0.0, 0.0);
    let episodes = config.eval.episodes.max(1);
    for e in 0..episodes {
        env.reset(Some(base + e), &mut obs)?;
        let q = agent.q_values(&obs)?;
        q_start += q
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let (mut summed, mut weight) = (0.0, 1.0);
        loop {
            let action = agent.act(&obs, config.eval.epsilon, &mut rng)?;
            let (step, game_over) = env.step_game(action, &mut obs)?;
            summed += f64::from(step.reward);
            discounted += weight * f64::from(step.reward);
            weight *= gamma;
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
