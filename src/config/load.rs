//! A config from TOML text or a file: `--set` overrides applied, every key checked
//! against the schema (unknown keys named with the allowed ones), values parsed with
//! the key's path in the error, then validated (`validate.rs`).

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::table::{apply_override, parse_assignment, replace_method, resolve_preset};
use super::TrainConfig;

/// Rejects keys that the defaults do not have, naming the key and the allowed ones.
/// Tables tagged with `type` (variants) are left to serde, which lists their fields.
fn check_keys(user: &toml::Table, known: &toml::Table, prefix: &str) -> Result<()> {
    for (key, value) in user {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let Some(reference) = known.get(key) else {
            let mut allowed: Vec<&str> = known.keys().map(String::as_str).collect();
            allowed.sort_unstable();
            let place = if prefix.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in [{prefix}]")
            };
            bail!(
                "unknown config key '{path}'; keys allowed {place}: {}",
                allowed.join(", ")
            );
        };
        if let (Some(sub), Some(ref_sub)) = (value.as_table(), reference.as_table()) {
            if !ref_sub.contains_key("type") {
                check_keys(sub, ref_sub, &path)?;
            }
        }
    }
    Ok(())
}

/// A kind given as a plain value where the schema has a table tagged with `type`
/// (`sampler = "sequential"` for `sampler = { type = "sequential" }`) becomes that
/// table: the short form the docs show for kinds without settings. Any other plain
/// value is tagged the same way, so that serde's refusal lists the allowed kinds.
fn tag_plain_values(user: &mut toml::Table, known: &toml::Table) {
    for (key, value) in user.iter_mut() {
        let Some(reference) = known.get(key).and_then(toml::Value::as_table) else {
            continue;
        };
        match value {
            toml::Value::Table(sub) if !reference.contains_key("type") => {
                tag_plain_values(sub, reference)
            }
            toml::Value::Table(_) => {}
            plain => {
                if reference.contains_key("type") {
                    let kind = match &*plain {
                        toml::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let mut tagged = toml::Table::new();
                    tagged.insert("type".into(), toml::Value::String(kind));
                    *plain = toml::Value::Table(tagged);
                }
            }
        }
    }
}

/// The config in `table`; where values have the wrong type, every such value is named
/// (each one found is set aside and the rest read again), not only the first.
fn deserialize_all(table: &toml::Table) -> Result<TrainConfig> {
    let mut table = table.clone();
    let mut problems: Vec<String> = vec![];
    loop {
        match serde_path_to_error::deserialize(toml::Value::Table(table.clone())) {
            Ok(config) if problems.is_empty() => return Ok(config),
            Ok(_) => bail!("{}", problems.join("\n")),
            Err(e) => {
                let path = e.path().to_string();
                let message = e
                    .into_inner()
                    .message()
                    .trim()
                    .replace("expected usize", "expected a non-negative integer")
                    .replace("expected u64", "expected a non-negative integer")
                    .replace("expected f64", "expected a number");
                // A value set aside may leave a required field missing: that is not
                // the user's problem.
                if message.starts_with("missing field") && !problems.is_empty() {
                    bail!("{}", problems.join("\n"));
                }
                problems.push(format!("invalid value for '{path}': {message}"));
                // Reading on needs the value gone; where it cannot be found (a problem
                // inside a list, say), the first problems are all there is to say.
                if problems.len() >= 32 || !remove_path(&mut table, &path) {
                    bail!("{}", problems.join("\n"));
                }
            }
        }
    }
}

/// Removes the value at the dotted `path` from `table`; whether there was one.
fn remove_path(table: &mut toml::Table, path: &str) -> bool {
    let keys: Vec<&str> = path.split('.').collect();
    let (last, parents) = keys.split_last().expect("split gives one part at least");
    let mut node = table;
    for key in parents {
        match node.get_mut(*key).and_then(toml::Value::as_table_mut) {
            Some(next) => node = next,
            None => return false,
        }
    }
    node.remove(*last).is_some()
}

impl TrainConfig {
    /// Parses TOML text with overrides applied, then validates.
    pub fn from_toml_str(text: &str, overrides: &[String]) -> Result<Self> {
        let mut table: toml::Table =
            toml::from_str(text).context("the config is not valid TOML")?;
        super::presets::resolve_in_file(&mut table)?;
        for o in overrides {
            let (path, value) = parse_assignment(o)?;
            if path == "preset" {
                super::presets::apply_set(&mut table, &value)?;
                continue;
            }
            replace_method(&mut table, &path)?;
            apply_override(&mut table, o)?;
        }
        // Every key, those written only when set included.
        let mut every_key = TrainConfig::default();
        every_key.run.allow_odd = true;
        every_key.run.population = 2;
        every_key.run.cuda_graphs = false;
        every_key.run.tf32 = true;
        every_key.optimizer.lr_schedule = normrl_agents::optim::LrSchedule::Linear {
            to: 0.1,
            updates: 1,
        };
        let known = every_key.to_table();
        check_keys(&table, &known, "")?;
        resolve_preset(&mut table)?;
        tag_plain_values(&mut table, &known);
        let config = deserialize_all(&table)?;
        let resolved = toml::Table::try_from(&config).expect("configs serialize");
        let unknown = super::validate::unknown_tagged_keys(&table, &resolved, "");
        if !unknown.is_empty() {
            bail!("{}", unknown.join("\n"));
        }
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::from_toml_str(&text, overrides)
            .with_context(|| format!("in config {}", path.display()))
    }

    /// Range checks across sections, conflicting choices and odd ones (see
    /// `validate.rs`); the error lists every problem.
    pub fn validate(&self) -> Result<()> {
        let problems = super::validate::problems(self);
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", problems.join("\n"))
        }
    }
}
