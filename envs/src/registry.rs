//! Builds an environment from a string id with options, e.g. `classic/cartpole`,
//! `minatar/breakout`, `minatar/breakout?sticky=0&ramping=false&minimal_actions=true`.
//!
//! Every native environment comes wrapped in [`TimeLimit`] and, outermost, [`Monitor`].
//! `gym:<Gymnasium id>` starts a Python worker ([`crate::gym`]); its options are
//! `preset=atari` (DQN's Atari preprocessing, with `noop_max`, `frame_skip`,
//! `frame_stack`, `screen_size`, `terminal_on_life_loss`, `clip_rewards`, `fire_reset`),
//! `python=` (the interpreter), and any other `key=value` goes to `gym.make` as a keyword
//! argument (values are read as JSON where they parse, as strings otherwise).
//!
//! ```
//! let env = normrl_envs::make("minatar/seaquest?minimal_actions=true").unwrap();
//! assert_eq!(env.action_space().n, 6);
//! let err = normrl_envs::make("minatar/pong").err().unwrap().to_string();
//! assert!(err.contains("minatar/breakout"));
//! ```

use crate::cartpole::CartPole;
use crate::gym::{AtariConfig, AtariPreprocessing, GymProcess, WorkerSpec};
use crate::minatar::{
    Asterix, Breakout, Freeway, Game, MinAtar, MinAtarConfig, Seaquest, SpaceInvaders,
};
use crate::wrappers::{Monitor, TimeLimit};
use crate::{Env, EnvError};

/// Gymnasium's CartPole-v1 limit.
const CARTPOLE_MAX_STEPS: u64 = 500;
/// MinAtar games have no time limit of their own (only Freeway ends by time); this cap
/// keeps an agent that never dives in Seaquest from running for ever. `max_steps=0`
/// removes it.
const MINATAR_MAX_STEPS: u64 = 10_000;
/// The most frames an Atari action may repeat for, and no-ops a reset may take: far
/// beyond any preprocessing's (4 and 30), within the worker's 32-bit counts.
const MAX_FRAME_SKIP: u64 = 10_000;

/// A native environment: its id, the mean return of a uniformly random policy on it
/// (the lower end of the normalized scores in reports: CartPole's is Gymnasium's,
/// MinAtar's those of the MinAtar paper's random agent), and its constructor, which
/// reads its options.
type Native = (
    &'static str,
    f64,
    fn(&mut Options) -> Result<Box<dyn Env>, EnvError>,
);

/// Every native environment, one row each: adding one is its row here.
#[rustfmt::skip]
const NATIVE: [Native; 6] = [
    ("classic/cartpole", 22.0, cartpole),
    ("minatar/breakout", 0.54, minatar::<Breakout>),
    ("minatar/asterix", 0.50, minatar::<Asterix>),
    ("minatar/freeway", 0.0, minatar::<Freeway>),
    ("minatar/seaquest", 0.11, minatar::<Seaquest>),
    ("minatar/space_invaders", 2.9, minatar::<SpaceInvaders>),
];

/// Every id [`make`] accepts (without options).
pub fn known_ids() -> Vec<String> {
    NATIVE.iter().map(|n| n.0.to_string()).collect()
}

/// The mean return of a uniformly random policy on `spec`'s environment (options are
/// ignored), where it is known.
///
/// ```
/// assert_eq!(normrl_envs::registry::random_score("minatar/breakout?sticky=0"), Some(0.54));
/// assert_eq!(normrl_envs::registry::random_score("gym:ALE/Pong-v5"), None);
/// ```
pub fn random_score(spec: &str) -> Option<f64> {
    let id = spec.split('?').next().unwrap_or(spec);
    NATIVE.iter().find(|n| n.0 == id).map(|n| n.1)
}

/// Builds the environment named by `spec` (`id` or `id?key=value&...`).
pub fn make(spec: &str) -> Result<Box<dyn Env>, EnvError> {
    let (id, query) = spec.split_once('?').unwrap_or((spec, ""));
    let mut options = Options::parse(id, query)?;
    if let Some(gym_id) = id.strip_prefix("gym:") {
        return make_gym(id, gym_id, options);
    }
    let Some((_, _, make)) = NATIVE.iter().find(|n| n.0 == id) else {
        return Err(EnvError::UnknownId {
            id: id.to_string(),
            known: known_ids(),
        });
    };
    let env = make(&mut options)?;
    options.finish()?;
    Ok(env)
}

/// Checks an id and its options without building anything costly: a `gym:` id is
/// parsed but no Python worker starts (the Gymnasium id itself is checked when the
/// environment is made).
pub fn check(spec: &str) -> Result<(), EnvError> {
    let (id, query) = spec.split_once('?').unwrap_or((spec, ""));
    match id.strip_prefix("gym:") {
        Some(gym_id) => gym_settings(gym_id, Options::parse(id, query)?).map(|_| ()),
        None => make(spec).map(|_| ()),
    }
}

fn make_gym(id: &str, gym_id: &str, options: Options) -> Result<Box<dyn Env>, EnvError> {
    let (spec, atari) = gym_settings(gym_id, options)?;
    let process = Monitor::new(GymProcess::start(id, spec)?);
    match atari {
        Some(config) => Ok(Box::new(AtariPreprocessing::new(process, config)?)),
        None => Ok(Box::new(process)),
    }
}

/// The worker's settings and, with `preset=atari`, the preprocessing's.
fn gym_settings(
    gym_id: &str,
    mut options: Options,
) -> Result<(WorkerSpec, Option<AtariConfig>), EnvError> {
    if gym_id.is_empty() {
        return Err(options.bad(
            "id",
            "",
            "a Gymnasium id after 'gym:', e.g. gym:CartPole-v1",
        ));
    }
    let python = options
        .take("python")
        .or_else(|| std::env::var("NORMRL_PYTHON").ok())
        .unwrap_or_else(|| "python3".to_string());
    let preset = options.take("preset");
    let atari = match preset.as_deref() {
        None => false,
        Some("atari") => true,
        Some(other) => return Err(options.bad("preset", other, "atari")),
    };
    const ATARI_OPTIONS: [&str; 7] = [
        "noop_max",
        "frame_skip",
        "frame_stack",
        "screen_size",
        "terminal_on_life_loss",
        "clip_rewards",
        "fire_reset",
    ];
    if !atari {
        if let Some((key, value)) = options
            .pairs
            .iter()
            .find(|(k, _)| ATARI_OPTIONS.contains(&k.as_str()))
        {
            return Err(options.bad(
                key,
                value,
                "preset=atari alongside it (an Atari preprocessing option)",
            ));
        }
    }
    let defaults = AtariConfig::default();
    // Bounded where they are read, not after a cast: a frame is `frame_stack x
    // screen_size^2` bytes, allocated as the environment is made (before any memory
    // check), and a u64 cast to u32 would turn 2^32 into 0.
    let frame_skip = options.integer("frame_skip", 4, 1..=MAX_FRAME_SKIP)?;
    let config = AtariConfig {
        noop_max: options.integer("noop_max", defaults.noop_max.into(), 0..=MAX_FRAME_SKIP)? as u32,
        screen_size: options.integer("screen_size", defaults.screen_size as u64, 1..=1024)?
            as usize,
        frame_stack: options.integer("frame_stack", defaults.frame_stack as u64, 1..=64)? as usize,
        terminal_on_life_loss: options
            .bool("terminal_on_life_loss", defaults.terminal_on_life_loss)?,
        clip_rewards: options.bool("clip_rewards", defaults.clip_rewards)?,
        fire_reset: options.bool("fire_reset", defaults.fire_reset)?,
    };
    let kwargs = options
        .pairs
        .drain(..)
        .map(|(k, v)| {
            let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
            (k, value)
        })
        .collect();
    let spec = WorkerSpec {
        gym_id: gym_id.to_string(),
        kwargs,
        preset,
        frame_skip: frame_skip as u32,
        python,
    };
    Ok((spec, atari.then_some(config)))
}

fn cartpole(options: &mut Options) -> Result<Box<dyn Env>, EnvError> {
    let max_steps = options.u64("max_steps", CARTPOLE_MAX_STEPS)?;
    Ok(limit(CartPole::new(), max_steps))
}

fn minatar<G: Game + 'static>(options: &mut Options) -> Result<Box<dyn Env>, EnvError> {
    let config = MinAtarConfig {
        sticky: options.probability("sticky", 0.1)?,
        ramping: options.bool("ramping", true)?,
        minimal_actions: options.bool("minimal_actions", false)?,
    };
    let max_steps = options.u64("max_steps", MINATAR_MAX_STEPS)?;
    Ok(limit(MinAtar::<G>::new(config), max_steps))
}

/// Wraps in a time limit (none when `max_steps` is 0) and the episode monitor.
fn limit<E: Env + 'static>(env: E, max_steps: u64) -> Box<dyn Env> {
    if max_steps == 0 {
        Box::new(Monitor::new(env))
    } else {
        Box::new(Monitor::new(TimeLimit::new(env, max_steps)))
    }
}

/// The `key=value` pairs of an id, consumed one by one so that leftovers are reported.
struct Options {
    id: String,
    pairs: Vec<(String, String)>,
    allowed: Vec<String>,
}

impl Options {
    fn parse(id: &str, query: &str) -> Result<Self, EnvError> {
        let mut pairs = vec![];
        for part in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| EnvError::BadOptionValue {
                    id: id.to_string(),
                    option: part.to_string(),
                    value: String::new(),
                    expected: "key=value".into(),
                })?;
            pairs.push((k.to_string(), v.to_string()));
        }
        Ok(Self {
            id: id.to_string(),
            pairs,
            allowed: vec![],
        })
    }

    fn take(&mut self, key: &str) -> Option<String> {
        self.allowed.push(key.to_string());
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        Some(self.pairs.remove(i).1)
    }

    fn bad(&self, option: &str, value: &str, expected: &str) -> EnvError {
        EnvError::BadOptionValue {
            id: self.id.clone(),
            option: option.into(),
            value: value.into(),
            expected: expected.into(),
        }
    }

    fn bool(&mut self, key: &str, default: bool) -> Result<bool, EnvError> {
        match self.take(key).as_deref() {
            None => Ok(default),
            Some("true" | "1") => Ok(true),
            Some("false" | "0") => Ok(false),
            Some(v) => Err(self.bad(key, v, "true, false, 1 or 0")),
        }
    }

    fn u64(&mut self, key: &str, default: u64) -> Result<u64, EnvError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| self.bad(key, &v, "a non-negative integer (0 = no limit)")),
        }
    }

    /// An integer option within `range` (inclusive), named in the error.
    fn integer(
        &mut self,
        key: &str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, EnvError> {
        let Some(v) = self.take(key) else {
            return Ok(default);
        };
        match v.parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => {
                let allowed = format!("an integer from {} to {}", range.start(), range.end());
                Err(self.bad(key, &v, &allowed))
            }
        }
    }

    fn probability(&mut self, key: &str, default: f64) -> Result<f64, EnvError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => match v.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(self.bad(key, &v, "a probability in [0, 1]")),
            },
        }
    }

    /// Fails on the first option no one asked for.
    fn finish(self) -> Result<(), EnvError> {
        match self.pairs.into_iter().next() {
            None => Ok(()),
            Some((option, _)) => Err(EnvError::UnknownOption {
                id: self.id,
                option,
                allowed: self.allowed,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_every_known_id_with_right_spaces() {
        for id in known_ids() {
            let mut env = make(&id).unwrap();
            assert_eq!(env.id(), id);
            let mut obs = vec![0.0; env.observation_space().len()];
            env.reset(Some(0), &mut obs).unwrap();
            env.step(0, &mut obs).unwrap();
        }
        let shape = |id: &str| make(id).unwrap().observation_space().shape;
        assert_eq!(shape("classic/cartpole"), [4]);
        assert_eq!(shape("minatar/breakout"), [4, 10, 10]);
        assert_eq!(shape("minatar/freeway"), [7, 10, 10]);
        assert_eq!(shape("minatar/seaquest"), [10, 10, 10]);
        assert_eq!(shape("minatar/space_invaders"), [6, 10, 10]);
    }

    #[test]
    fn options_are_applied() {
        let n = |id: &str| make(id).unwrap().action_space().n;
        assert_eq!(n("minatar/breakout"), 6);
        assert_eq!(n("minatar/breakout?minimal_actions=true"), 3);
        assert_eq!(n("minatar/freeway?minimal_actions=1"), 3);
        assert_eq!(n("minatar/asterix?minimal_actions=true"), 5);
        assert_eq!(n("minatar/space_invaders?minimal_actions=true&sticky=0"), 4);
        let mut env = make("classic/cartpole?max_steps=5").unwrap();
        let mut obs = [0.0; 4];
        env.reset(Some(0), &mut obs).unwrap();
        let mut steps = 0;
        loop {
            steps += 1;
            let s = env.step(steps % 2, &mut obs).unwrap();
            if s.done() {
                assert!(s.truncated && !s.terminated);
                break;
            }
        }
        assert_eq!(steps, 5);
        assert_eq!(env.episode_stats().unwrap().last_return, Some(5.0));
    }

    #[test]
    fn bad_ids_and_options_say_what_is_allowed() {
        let err = |id: &str| make(id).err().unwrap();
        match err("atari/pong") {
            EnvError::UnknownId { known, .. } => assert_eq!(known, known_ids()),
            e => panic!("{e}"),
        }
        let e = err("minatar/breakout?stiky=0").to_string();
        assert!(
            e.contains("'stiky'") && e.contains("sticky") && e.contains("ramping"),
            "{e}"
        );
        let e = err("minatar/breakout?sticky=1.5").to_string();
        assert!(e.contains("[0, 1]"), "{e}");
        let e = err("minatar/breakout?ramping=maybe").to_string();
        assert!(e.contains("true, false"), "{e}");
        let e = err("classic/cartpole?max_steps=-3").to_string();
        assert!(e.contains("non-negative integer"), "{e}");
        let e = err("classic/cartpole?sticky=0").to_string();
        assert!(e.contains("max_steps"), "{e}");
        assert!(matches!(
            err("minatar/breakout?oops"),
            EnvError::BadOptionValue { .. }
        ));
    }

    #[test]
    fn atari_sizes_are_bounded_before_anything_is_made() {
        // Checked without starting Python: `check` parses a gym id's options only.
        let atari = |o: &str| check(&format!("gym:ALE/Pong-v5?preset=atari&{o}"));
        for (option, allowed) in [
            ("screen_size=100000", "from 1 to 1024"),
            ("screen_size=0", "from 1 to 1024"),
            ("frame_stack=65", "from 1 to 64"),
            // 2^32: a cast to the worker's u32 would have made it 0, silently.
            ("frame_skip=4294967296", "from 1 to 10000"),
            ("noop_max=4294967296", "from 0 to 10000"),
        ] {
            let e = atari(option).err().unwrap().to_string();
            let key = option.split('=').next().unwrap();
            assert!(
                e.contains(&format!("'{key}'")) && e.contains(allowed),
                "{option}: {e}"
            );
        }
        for option in [
            "screen_size=84",
            "frame_stack=4",
            "frame_skip=1",
            "noop_max=0",
        ] {
            assert!(atari(option).is_ok(), "{option}");
        }
    }
}
