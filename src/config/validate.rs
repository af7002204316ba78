//! What a training config must satisfy beyond its types: ranges, choices that cannot
//! work together, choices that are legal but almost surely a mistake (refused unless
//! `run.allow_odd = true`), and keys inside tagged tables that serde lets through.
//! Every message names the key and what is allowed.

use normrl_agents::nn::Architecture;
use normrl_agents::replay::Sampler;

use crate::config::{parse_device_spec, TrainConfig};

/// The most members `run.population` may ask for: far beyond what one device holds
/// (the GPU check goes to 1,024), a bound before any per-member list is made.
const MAX_POPULATION: usize = 65_536;

/// Every problem of `config`, each a line naming its key; empty when it is valid.
pub fn problems(config: &TrainConfig) -> Vec<String> {
    let mut problems: Vec<String> = vec![];
    let mut add = |section: &str, list: Vec<(&str, &str)>| {
        for (field, allowed) in list {
            problems.push(format!("{section}.{field} must be {allowed}"));
        }
    };
    add("norm", config.norm.problems());
    add("optimizer", config.optimizer.problems());
    add("dqn", config.dqn.problems());
    add("replay", replay_problems(config));
    add("run", run_problems(config));
    add("network", network_problems(config));
    let e = &config.exploration;
    if !((0.0..=1.0).contains(&e.start) && (0.0..=1.0).contains(&e.end)) {
        add("exploration", vec![("start/end", "in [0, 1]")]);
    }
    if !(0.0..=1.0).contains(&config.eval.epsilon) {
        add("eval", vec![("epsilon", "in [0, 1]")]);
    }
    if let Some(problem) = video_problem(config) {
        problems.push(problem);
    }
    problems.extend(group_problems(config));
    if let Err(e) = parse_device_spec(&config.run.device) {
        problems.push(e.to_string());
    }
    if let Err(e) = normrl_envs::registry::check(&config.env.id) {
        problems.push(format!("env.id: {e}"));
    }
    if !config.run.allow_odd {
        problems.extend(odd_choices(config));
    }
    problems
}

/// `eval.video` on a Gymnasium environment that would be made without frames to give:
/// Gymnasium renders only with `render_mode=rgb_array` (the bridge sets it for ALE's
/// Atari games, whose emulator draws at no cost; other environments may need packages
/// such as pygame to draw).
fn video_problem(config: &TrainConfig) -> Option<String> {
    let id = config.env.id.strip_prefix("gym:")?;
    let renders = id.starts_with("ALE/") || id.contains("render_mode=rgb_array");
    (config.eval.video && !renders).then(|| {
        format!(
            "eval.video = true needs frames from env.id = \"{}\": add render_mode=rgb_array to its options (gym:<id>?render_mode=rgb_array), or set eval.video = false",
            config.env.id
        )
    })
}

fn replay_problems(config: &TrainConfig) -> Vec<(&'static str, &'static str)> {
    let r = &config.replay;
    let mut p = vec![];
    if r.batch_size == 0 {
        p.push(("batch_size", "a positive integer"));
    }
    if r.capacity < r.batch_size.max(2) + 1 {
        p.push(("capacity", "larger than batch_size (and at least 3)"));
    }
    if r.train_frequency == 0 {
        p.push(("train_frequency", "a positive integer"));
    }
    if r.gradient_steps == 0 {
        p.push(("gradient_steps", "a positive integer"));
    }
    p.extend(r.sampler.problems());
    // The first update comes after `learning_starts` steps.
    if r.sampler.needs_whole_batch() && (r.learning_starts as u128) < r.batch_size as u128 {
        p.push((
            "learning_starts",
            "at least replay.batch_size with the sequential and online samplers (they need a whole batch of transitions for the first update)",
        ));
    }
    p
}

fn run_problems(config: &TrainConfig) -> Vec<(&'static str, &'static str)> {
    let run = &config.run;
    let mut p = vec![];
    if run.threads == 0 {
        p.push(("threads", "a positive integer"));
    }
    if run.total_steps == 0 {
        p.push(("total_steps", "a positive integer"));
    }
    // Bounded before the members are listed (a member each, before the memory check
    // that would refuse them): 2^64 members overflowed that list.
    if !(1..=MAX_POPULATION).contains(&run.population) {
        p.push((
            "population",
            "a positive integer up to 65536 (1: a single agent)",
        ));
    }
    let name = run.name.as_str();
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control);
    if !plain {
        p.push((
            "name",
            "a plain name (not empty, no '/', '\\', '.' or '..'): it names a directory under runs/",
        ));
    }
    p
}

fn network_problems(config: &TrainConfig) -> Vec<(&'static str, &'static str)> {
    match &config.network.architecture {
        Architecture::Mlp { hidden } if hidden.contains(&0) => {
            vec![("architecture.hidden", "a list of positive layer widths")]
        }
        _ => vec![],
    }
}

/// Group norm's groups must divide every hidden layer's units or channels.
fn group_problems(config: &TrainConfig) -> Option<String> {
    if config.norm.activation != normrl_agents::nn::Activation::GroupNorm {
        return None;
    }
    let arch = &config.network.architecture;
    let channels = arch.convolutions().iter().map(|&(c, _, _)| c);
    let widths: Vec<usize> = channels.chain(arch.dense_widths()).collect();
    let groups = config.norm.groups.max(1);
    let bad: Vec<String> = widths
        .iter()
        .filter(|w| !w.is_multiple_of(groups))
        .map(|w| w.to_string())
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "norm.groups = {groups} must divide every hidden layer's units or channels ({} do not)",
            bad.join(", ")
        )
    })
}

/// Legal values that almost surely are a mistake, each with the reason; accepted with
/// `run.allow_odd = true` (or `--allow-odd`).
pub fn odd_choices(config: &TrainConfig) -> Vec<String> {
    let mut odd = vec![];
    let mut say = |what: String| {
        odd.push(format!(
            "{what} (set run.allow_odd = true, or pass --allow-odd, if you mean it)"
        ));
    };
    let (r, run) = (&config.replay, &config.run);
    if r.learning_starts >= run.total_steps {
        say(format!(
            "replay.learning_starts = {} is not below run.total_steps = {}: the agent would never train",
            r.learning_starts, run.total_steps
        ));
    } else if r.train_frequency > run.total_steps - r.learning_starts {
        // An update every F steps fits at most once into fewer than F steps.
        say(format!(
            "replay.train_frequency = {} is above the {} steps after replay.learning_starts: the agent would train at most once",
            r.train_frequency,
            run.total_steps - r.learning_starts
        ));
    }
    if let Sampler::Recent { window } = r.sampler {
        if window > r.capacity {
            say(format!(
                "replay.sampler.window = {window} is larger than replay.capacity = {}: the replay never holds that many",
                r.capacity
            ));
        }
    }
    let e = &config.exploration;
    if e.end > e.start {
        say(format!(
            "exploration.end = {} is above exploration.start = {}: epsilon would rise",
            e.end, e.start
        ));
    }
    if config.eval.episodes == 0 {
        say("eval.episodes = 0: no evaluation return to report".to_string());
    }
    odd
}

/// Keys inside `type`-tagged tables (samplers, architectures, target updates) that the
/// chosen type does not have: serde ignores them on unit variants. `user` is the table
/// as written, `resolved` the parsed config serialized back.
pub fn unknown_tagged_keys(
    user: &toml::Table,
    resolved: &toml::Table,
    prefix: &str,
) -> Vec<String> {
    let mut unknown = vec![];
    for (key, value) in user {
        let path = match prefix {
            "" => key.clone(),
            _ => format!("{prefix}.{key}"),
        };
        let (Some(sub), Some(resolved_sub)) = (
            value.as_table(),
            resolved.get(key).and_then(toml::Value::as_table),
        ) else {
            continue;
        };
        if sub.contains_key("type") {
            let mut allowed: Vec<&str> = resolved_sub.keys().map(String::as_str).collect();
            allowed.sort_unstable();
            for k in sub.keys().filter(|k| !resolved_sub.contains_key(*k)) {
                unknown.push(format!(
                    "unknown key '{path}.{k}' for type '{}'; its keys: {}",
                    sub["type"].as_str().unwrap_or("?"),
                    allowed.join(", ")
                ));
            }
        } else {
            unknown.extend(unknown_tagged_keys(sub, resolved_sub, &path));
        }
    }
    unknown
}

/// The memory a run needs, estimated before anything is allocated or written: the
/// replay ring and the networks with their gradients and optimizer state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimate {
    pub replay_bytes: u128,
    pub network_bytes: u128,
}

impl MemoryEstimate {
    pub fn of(
        config: &TrainConfig,
        space: &normrl_envs::ObservationSpace,
        n_actions: usize,
    ) -> Self {
        let obs_len: u128 = space.shape.iter().map(|&d| d as u128).product();
        let frame = match normrl_agents::replay::FrameEncoding::of(space) {
            normrl_agents::replay::FrameEncoding::Bits => obs_len.div_ceil(64) * 8,
            normrl_agents::replay::FrameEncoding::Bytes => obs_len,
            normrl_agents::replay::FrameEncoding::Float => obs_len * 4,
        };
        // Per slot besides the frame: action (4 bytes), reward (4) and two flags.
        let replay_bytes = config.replay.capacity as u128 * (frame + 10);
        let outputs = head_outputs(config, n_actions);
        let params = parameter_count(&config.network.architecture, &space.shape, outputs);
        // Online and target values, the gradient, two optimizer moments, and weight
        // norm's cached `w` or the graph's temporaries: about six copies of 4 bytes.
        let network_bytes = params * 4 * 6;
        Self {
            replay_bytes,
            network_bytes,
        }
    }

    pub fn total(&self) -> u128 {
        self.replay_bytes + self.network_bytes
    }

    /// An error with the numbers when the run cannot fit in `available` bytes.
    pub fn check(&self, config: &TrainConfig, available: u64) -> anyhow::Result<()> {
        if self.total() <= u128::from(available) {
            return Ok(());
        }
        anyhow::bail!(
            "this run needs about {:.1} GiB of memory and this machine has {:.1} GiB: the replay takes {:.1} GiB (replay.capacity = {} frames), the networks with their gradients and optimizer state {:.1} GiB (network.architecture); lower replay.capacity or the layer widths",
            gib(self.total()),
            gib(u128::from(available)),
            gib(self.replay_bytes),
            config.replay.capacity,
            gib(self.network_bytes),
        )
    }
}

/// Bytes in GiB, for messages.
pub(crate) fn gib(bytes: u128) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Trainable values of the Q-network (weights and biases; normalization parameters are
/// a few per unit and left out), computed without overflow for any widths. A
/// convolution on observations that are not `[C, H, W]` counts nothing: building the
/// network refuses it with its own message.
fn parameter_count(arch: &Architecture, obs_shape: &[usize], outputs: usize) -> u128 {
    let mut shape: Vec<u128> = obs_shape.iter().map(|&d| d as u128).collect();
    let mut total = 0u128;
    for &(c_out, k, stride) in arch.convolutions() {
        let [c_in, h, w] = shape[..] else {
            return 0;
        };
        let (c_out, k, stride) = (c_out as u128, k as u128, stride as u128);
        total += c_out * (c_in * k * k + 1);
        let out = |d: u128| d.saturating_sub(k) / stride + 1;
        shape = vec![c_out, out(h), out(w)];
    }
    let mut width: u128 = shape.iter().product();
    for h in arch.dense_widths().into_iter().chain([outputs]) {
        total += (width + 1) * h as u128;
        width = h as u128;
    }
    total
}

/// The Q-head's width: an action's value, or with a distributional loss its atoms.
pub(crate) fn head_outputs(config: &TrainConfig, n_actions: usize) -> usize {
    if config.dqn.loss.is_distributional() {
        n_actions.saturating_mul(config.dqn.support.atoms)
    } else {
        n_actions
    }
}

/// The machine's memory (MemTotal), where the system says.
pub fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
