//! A comparison that extends another (`extends = "..."`) says only what differs: the
//! study's two follow-ups written so plan exactly the runs of their files written out
//! in full, and the mistakes an extension invites are named.

use std::path::{Path, PathBuf};

use normrl::compare::CompareConfig;

mod common;

const METHODS: [(&str, &str); 7] = [
    ("none", "none"),
    ("weight_norm_init256", "weight_norm"),
    ("wn_mean_only_bn_init256", "wn_mean_only_bn"),
    ("batch_norm", "batch_norm"),
    ("batch_renorm", "batch_renorm"),
    ("layer_norm", "layer_norm"),
    ("group_norm", "group_norm"),
];

/// Writes `body` after an `extends` of the study (by its absolute path, from a folder
/// elsewhere: its `base` must still resolve against the study's folder).
fn extension(dir: &Path, file: &str, body: &str) -> PathBuf {
    let study = std::fs::canonicalize("configs/compare/minatar-study-v1.toml").unwrap();
    let path = dir.join(file);
    let text = format!("extends = {:?}\n{body}", study.display().to_string());
    std::fs::write(&path, text).unwrap();
    path
}

fn variants(methods: &[(&str, &str)]) -> String {
    let one = |(name, kind): &(&str, &str)| {
        format!("[[variants]]\nname = \"{name}\"\nset = {{ \"norm.kind\" = \"{kind}\" }}\n")
    };
    methods.iter().map(one).collect()
}

/// The plan of a comparison: each run's directory and overrides.
fn plan(path: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let config = CompareConfig::load(path).unwrap();
    let runs = config.expand().unwrap();
    runs.into_iter().map(|r| (r.rel_dir, r.overrides)).collect()
}

#[test]
fn the_studys_follow_ups_as_extensions_plan_as_written_out() {
    let dir = common::fresh_dir("extends");
    let online = extension(
        &dir,
        "online.toml",
        &format!(
            "name = \"minatar-study-v1-online\"\n[axes]\nbatch_size = [1]\nsampler = [{{ type = \"online\" }}]\n{}[report]\nbaseline = \"b1-online-none\"\n",
            variants(&METHODS)
        ),
    );
    let full = plan(Path::new("configs/compare/minatar-study-v1-online.toml"));
    assert_eq!(full.len(), 175);
    assert_eq!(plan(&online), full);
    let init256 = extension(
        &dir,
        "init256.toml",
        &format!(
            "name = \"minatar-study-v1-init256\"\n{}[report]\nbaseline = \"b4-uniform-weight_norm_init256\"\n",
            variants(&METHODS[1..3])
        ),
    );
    let full = plan(Path::new("configs/compare/minatar-study-v1-init256.toml"));
    assert_eq!(full.len(), 300);
    assert_eq!(plan(&init256), full);
    // What the extension does not say, it takes from the study: its report's scores.
    let config = CompareConfig::load(&online).unwrap();
    assert_eq!(config.report.baseline.as_deref(), Some("b1-online-none"));
    let study = CompareConfig::load(Path::new("configs/compare/minatar-study-v1.toml")).unwrap();
    assert_eq!(config.report.scores.len(), study.report.scores.len());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_value_in_set_replaces_the_extended_one_whole() {
    let dir = common::fresh_dir("extends-set");
    // The parent's base, relative to the parent's folder, resolves from the child's.
    std::fs::create_dir_all(dir.join("base")).unwrap();
    std::fs::copy("configs/cartpole.toml", dir.join("base/cartpole.toml")).unwrap();
    let parent_dir = dir.join("a/b");
    std::fs::create_dir_all(&parent_dir).unwrap();
    let parent = "name = \"parent\"\nbase = \"../../base/cartpole.toml\"\n[set]\n\"run.total_steps\" = 2000\n\"dqn.target_update\" = { type = \"hard\", every = 100 }\n";
    std::fs::write(parent_dir.join("parent.toml"), parent).unwrap();
    let child = dir.join("child.toml");
    std::fs::write(
        &child,
        "extends = \"a/b/parent.toml\"\nname = \"child\"\n[set]\n\"dqn.target_update\" = { type = \"polyak\", tau = 0.005 }\n",
    )
    .unwrap();
    let runs = CompareConfig::load(&child).unwrap().expand().unwrap();
    let overrides = &runs[0].overrides;
    assert!(
        overrides.contains(&"run.total_steps=2000".to_string()),
        "{overrides:?}"
    );
    let target: Vec<&String> = overrides
        .iter()
        .filter(|o| o.contains("target_update"))
        .collect();
    assert_eq!(target.len(), 1, "{overrides:?}");
    assert!(
        target[0].contains("polyak") && !target[0].contains("every"),
        "{target:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_extension_needs_a_name_of_its_own_and_no_loop() {
    let dir = common::fresh_dir("extends-errors");
    let nameless = extension(&dir, "nameless.toml", "seeds = 2\n");
    let err = format!("{:#}", CompareConfig::load(&nameless).unwrap_err());
    assert!(
        err.contains("give this comparison a name of its own"),
        "{err}"
    );
    std::fs::write(dir.join("a.toml"), "extends = \"b.toml\"\nname = \"a\"\n").unwrap();
    std::fs::write(dir.join("b.toml"), "extends = \"a.toml\"\nname = \"b\"\n").unwrap();
    let err = format!(
        "{:#}",
        CompareConfig::load(&dir.join("a.toml")).unwrap_err()
    );
    assert!(err.contains("extend each other in a loop"), "{err}");
    std::fs::write(dir.join("bad.toml"), "extends = 3\nname = \"bad\"\n").unwrap();
    let err = format!(
        "{:#}",
        CompareConfig::load(&dir.join("bad.toml")).unwrap_err()
    );
    assert!(
        err.contains("extends = 3 must be the path of a comparison file"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
