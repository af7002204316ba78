//! Edits of a config's TOML table before it is read: a `--set` assignment parsed and
//! applied, and a normalization preset (`norm.kind`) resolved into its two parts.
//! Config loading and method presets (`presets.rs`) both edit tables this way.

use anyhow::{anyhow, bail, Context, Result};
use normrl_agents::nn::NormKind;
use serde::Deserialize;

/// `key.path=value` as the key and the value, parsed as a TOML value where it parses
/// (numbers, booleans, arrays, inline tables) and as a string otherwise.
pub fn parse_assignment(assignment: &str) -> Result<(String, toml::Value)> {
    let (path, raw) = assignment.split_once('=').with_context(|| {
        format!("--set '{assignment}': expected key=value, e.g. replay.batch_size=32")
    })?;
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    Ok((path.trim().to_string(), value))
}

/// Sets `path` (dotted) in `table` to the assignment's value, creating the tables on
/// the way (a `--set` may name a section the file leaves out).
pub fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let (path, value) = parse_assignment(assignment)?;
    let keys: Vec<&str> = path.trim().split('.').collect();
    let mut node = table;
    for key in &keys[..keys.len() - 1] {
        node = node
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .with_context(|| format!("--set '{assignment}': '{key}' is not a table"))?;
    }
    node.insert(keys[keys.len() - 1].to_string(), value);
    Ok(())
}

/// `norm.kind`, a preset, as its two parts: `norm.weight` and `norm.activation` filled
/// in where the table leaves them out, and refused where it gives another (a config's
/// `NormConfig` holds the parts; [`TrainConfig::to_toml`] writes the preset's name back
/// beside them).
pub(super) fn resolve_preset(table: &mut toml::Table) -> Result<()> {
    let Some(norm) = table.get_mut("norm").and_then(toml::Value::as_table_mut) else {
        return Ok(());
    };
    let Some(value) = norm.remove("kind") else {
        return Ok(());
    };
    let kind = NormKind::deserialize(value)
        .map_err(|e| anyhow!("invalid value for 'norm.kind': {}", e.message().trim()))?;
    let (weight, activation) = kind.parts();
    for (key, part) in [("weight", weight.name()), ("activation", activation.name())] {
        match norm.get(key) {
            None => {
                norm.insert(key.into(), toml::Value::String(part.into()));
            }
            Some(given) if given.as_str() == Some(part) => {}
            Some(given) => bail!(
                "norm.kind = \"{kind}\" is norm.weight = \"{weight}\" with norm.activation = \"{activation}\", but norm.{key} = {given}: give the preset or the two parts, not both"
            ),
        }
    }
    Ok(())
}

/// Before a `--set` of the method at `path`: what the table said of it gives way, the two
/// parts to a preset (`norm.kind`), a preset to a part (its other part stays), so that
/// a later setting wins as any other key's does.
pub(super) fn replace_method(table: &mut toml::Table, path: &str) -> Result<()> {
    let has = |table: &toml::Table, key: &str| {
        let norm = table.get("norm").and_then(toml::Value::as_table);
        norm.is_some_and(|n| n.contains_key(key))
    };
    match path {
        "norm.kind" => {
            if let Some(norm) = table.get_mut("norm").and_then(toml::Value::as_table_mut) {
                norm.remove("weight");
                norm.remove("activation");
            }
            Ok(())
        }
        "norm.weight" | "norm.activation" if has(table, "kind") => resolve_preset(table),
        _ => Ok(()),
    }
}
