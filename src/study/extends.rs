//! A comparison that extends another (`extends = "study.toml"`): the other's settings
//! are its defaults, so that a study's follow-ups (the same games and settings under
//! another sampler, a method retrained) say only what differs instead of repeating the
//! study's `[set]` block. This file's keys win: a scalar or a list replaces the other's
//! (`seeds`, `variants`, an axis' values); the tables `set`, `axes`, `slurm` and
//! `report` (with its `thresholds` and `scores`) merge key by key. A value inside
//! `set` is never merged (`{ type = "polyak", tau = 0.005 }` replaces a hard target
//! update whole). `name` must be its own: runs go to `runs/<name>/`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Extensions followed at most this deep (a chain, not a cycle).
const DEPTH: usize = 8;

/// The tables merged key by key; within `report`, its own tables one level deeper.
const MERGED: [&str; 4] = ["set", "axes", "slurm", "report"];
const MERGED_IN_REPORT: [&str; 2] = ["thresholds", "scores"];

/// The comparison at `path` with what it extends merged in, `base` resolved against
/// the file that names it (as a path relative to `path`'s folder).
pub(crate) fn load_table(path: &Path) -> Result<toml::Table> {
    let mut chain: Vec<PathBuf> = vec![];
    load(path, &mut chain)
}

fn load(path: &Path, chain: &mut Vec<PathBuf>) -> Result<toml::Table> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read comparison {}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", path.display()))?;
    let Some(parent) = table.remove("extends") else {
        return Ok(table);
    };
    let Some(parent) = parent.as_str() else {
        bail!("extends = {parent} must be the path of a comparison file, relative to this one");
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let parent_path = dir.join(parent);
    let key = parent_path.canonicalize().unwrap_or(parent_path.clone());
    if chain.contains(&key) || chain.len() >= DEPTH {
        bail!("extends = '{parent}': the comparisons extend each other in a loop (or more than {DEPTH} deep)");
    }
    chain.push(key);
    let mut merged =
        load(&parent_path, chain).with_context(|| format!("in extends = '{parent}'"))?;
    if !table.contains_key("name") {
        bail!("extends = '{parent}': give this comparison a name of its own (runs go to runs/<name>/, and the one it extends writes there too)");
    }
    // The base the other names is relative to the other's folder.
    if let Some(base) = merged.get("base").and_then(|b| b.as_str()) {
        let from_here = relative_to(
            dir,
            &parent_path.parent().unwrap_or(Path::new(".")).join(base),
        );
        merged.insert("base".into(), toml::Value::String(from_here));
    }
    merge(&mut merged, table);
    Ok(merged)
}

/// `path` as a path from `dir` when it lies below it, else as it is (`dir` joined to an
/// absolute path is that path).
fn relative_to(dir: &Path, path: &Path) -> String {
    let shown = path.strip_prefix(dir).unwrap_or(path);
    shown.to_string_lossy().into_owned()
}

/// `child`'s keys over `parent`'s, the tables of [`MERGED`] key by key.
fn merge(parent: &mut toml::Table, child: toml::Table) {
    for (key, value) in child {
        match (parent.get_mut(&key), value) {
            (Some(toml::Value::Table(old)), toml::Value::Table(new))
                if MERGED.contains(&key.as_str()) =>
            {
                for (k, v) in new {
                    match (old.get_mut(&k), v) {
                        (Some(toml::Value::Table(o)), toml::Value::Table(n))
                            if key == "report" && MERGED_IN_REPORT.contains(&k.as_str()) =>
                        {
                            o.extend(n);
                        }
                        (_, v) => {
                            old.insert(k, v);
                        }
                    }
                }
            }
            (_, value) => {
                parent.insert(key, value);
            }
        }
    }
}
