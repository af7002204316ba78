//! Method presets: the 2025 methods that set keys across sections (the normalization's
//! parts, the loss, the target network, the joint forward, the reward scale), named by
//! the top-level key `preset`. `docs/methods.md` ("Method presets") gives each one's
//! paper and what normrl adapts for discrete actions.

use anyhow::{bail, Result};

use super::table::{apply_override, parse_assignment, replace_method};

/// Each preset and its keys, as `--set` assignments.
pub const PRESETS: &[(&str, &[&str])] = &[
    (
        // Palenicek et al. 2025 (arXiv 2502.07523): CrossQ with its hidden layers'
        // rows held at unit norm, a Polyak target and the joint forward kept.
        "crossq_wn",
        &[
            "norm.weight=\"unit_rows\"",
            "norm.activation=\"batch_norm\"",
            "norm.sphere_head=\"linear\"",
            "norm.bn_momentum=0.01",
            "dqn.target_update={type=\"polyak\",tau=0.005}",
            "dqn.joint_forward=true",
            "dqn.online_bn_mode=\"train\"",
            "dqn.target_bn_mode=\"train\"",
            "dqn.loss=\"huber\"",
        ],
    ),
    (
        // Palenicek et al. 2025 (arXiv 2509.25174): the same layers with the output's
        // rows projected too, a C51 critic and rewards divided by the return's spread.
        "xqc",
        &[
            "norm.weight=\"unit_rows\"",
            "norm.activation=\"batch_norm\"",
            "norm.sphere_head=\"unit_rows\"",
            "norm.bn_momentum=0.01",
            "norm.bn_eps=0.001",
            "dqn.target_update={type=\"polyak\",tau=0.005}",
            "dqn.joint_forward=true",
            "dqn.online_bn_mode=\"train\"",
            "dqn.target_bn_mode=\"train\"",
            "dqn.loss=\"c51\"",
            "dqn.support={atoms=101,v_min=-5.0,v_max=5.0}",
            "dqn.reward_scale=\"return_std\"",
        ],
    ),
    (
        // Lee et al. 2025 (SimbaV2, ICML): hyperspherical layers, the scaled head
        // feeding C51's logits, rewards scaled by the running return.
        "simbav2",
        &[
            "norm.weight=\"unit_rows\"",
            "norm.activation=\"unit_features\"",
            "norm.sphere_head=\"scaled\"",
            "dqn.target_update={type=\"polyak\",tau=0.005}",
            "dqn.loss=\"c51\"",
            "dqn.support={atoms=101,v_min=-5.0,v_max=5.0}",
            "dqn.reward_scale=\"running_return\"",
        ],
    ),
];

/// Whether some preset sets the dotted `key` (or a table above it, or one below).
pub fn sets_key(key: &str) -> bool {
    let paths = PRESETS.iter().flat_map(|(_, keys)| keys.iter());
    paths.filter_map(|k| k.split_once('=')).any(|(path, _)| {
        path == key || path.starts_with(&format!("{key}.")) || key.starts_with(&format!("{path}."))
    })
}

/// The keys of preset `name`, or an error naming the presets there are.
fn keys(name: &toml::Value) -> Result<&'static [&'static str]> {
    let found = PRESETS.iter().find(|(n, _)| name.as_str() == Some(n));
    match found {
        Some((_, keys)) => Ok(keys),
        None => {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            bail!(
                "invalid value for 'preset': {name}; presets: {}",
                names.join(", ")
            )
        }
    }
}

/// A file's `preset`: its keys filled in where the file leaves them out (the file's
/// own keys win; a file's `norm.kind` stands for the whole normalization, so the
/// preset's `norm` keys give way to it).
pub fn resolve_in_file(table: &mut toml::Table) -> Result<()> {
    let Some(name) = table.remove("preset") else {
        return Ok(());
    };
    for assignment in keys(&name)? {
        let (path, _) = parse_assignment(assignment)?;
        if !given(table, &path) {
            apply_override(table, assignment)?;
        }
    }
    Ok(())
}

/// A `--set preset=NAME` (or a comparison's): its keys set over what the table says,
/// as later settings are.
pub fn apply_set(table: &mut toml::Table, value: &toml::Value) -> Result<()> {
    for assignment in keys(value)? {
        replace_method(table, &parse_assignment(assignment)?.0)?;
        apply_override(table, assignment)?;
    }
    Ok(())
}

/// Whether `table` gives the dotted `path` (every `norm` key counts as given where the
/// table names a `norm.kind`).
fn given(table: &toml::Table, path: &str) -> bool {
    let mut node = table;
    let keys: Vec<&str> = path.split('.').collect();
    let (last, parents) = keys.split_last().expect("a path has a key");
    for key in parents {
        match node.get(*key).and_then(toml::Value::as_table) {
            Some(next) => node = next,
            None => return false,
        }
    }
    let normalization = path.starts_with("norm.");
    node.contains_key(*last) || (normalization && node.contains_key("kind"))
}
