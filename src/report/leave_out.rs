//! Methods a report is asked to leave out (`normrl report --leave-out METHOD`): a
//! comparison whose method another one retrained (the study's `weight_norm`, trained
//! with a degenerate init and retrained as `weight_norm_init256`) reports its seven
//! methods without the superseded cells, and says at the top what it left out.

use anyhow::{bail, Result};
use serde::Serialize;

use super::grid::RunAxes;
use super::missing;
use super::records::Loaded;

/// What a report left out on request: the methods, and how many finished runs and
/// missing ones they had.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeftOut {
    pub methods: Vec<String>,
    pub runs: usize,
    pub missing: usize,
}

/// Removes every run of `methods` from `loaded`, finished or missing (a method is a
/// variant's label less its batch size and sampler, as the figures name it). A method
/// with no run at all is an error that names the methods there are.
pub fn leave_out(loaded: &mut Loaded, methods: &[String]) -> Result<LeftOut> {
    let mut known: Vec<&str> = loaded.runs.iter().map(|r| r.axes.method.as_str()).collect();
    known.sort_unstable();
    known.dedup();
    for m in methods {
        if !known.contains(&m.as_str()) {
            bail!(
                "--leave-out '{m}': no finished run of that method; the methods are: {}",
                known.join(", ")
            );
        }
    }
    let left = |method: &str| methods.iter().any(|m| m == method);
    let runs = loaded.runs.len();
    loaded.runs.retain(|r| !left(&r.axes.method));
    let missing = loaded.missing.len();
    loaded.missing.retain(|line| {
        let method = missing::variant_of(line).map(|v| RunAxes::of(v, None, "").method);
        !method.is_some_and(|m| left(&m))
    });
    Ok(LeftOut {
        methods: methods.to_vec(),
        runs: runs - loaded.runs.len(),
        missing: missing - loaded.missing.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::records::RunRecord;

    fn run(variant: &str) -> RunRecord {
        crate::report::samplers_tests::run("minatar/breakout", variant, 1, 1.0)
    }

    #[test]
    fn a_method_leaves_with_its_runs_and_missing_runs_and_not_its_variants() {
        let mut loaded = Loaded {
            runs: ["b1-uniform-weight_norm", "b4-sequential-weight_norm"]
                .into_iter()
                .chain(["b1-uniform-weight_norm_init256", "b1-uniform-none"])
                .map(run)
                .collect(),
            missing: [
                "runs/s/minatar_freeway/b32-uniform-weight_norm/seed-2: not finished",
                "runs/s/minatar_freeway/b32-uniform-weight_norm_init256/seed-2: not finished",
                "a line of another form",
            ]
            .map(String::from)
            .into(),
            duplicates: 0,
        };
        let left = leave_out(&mut loaded, &["weight_norm".into()]).unwrap();
        assert_eq!((left.runs, left.missing), (2, 1));
        let variants: Vec<&str> = loaded.runs.iter().map(|r| r.variant.as_str()).collect();
        assert_eq!(
            variants,
            ["b1-uniform-weight_norm_init256", "b1-uniform-none"]
        );
        assert_eq!(loaded.missing.len(), 2);
        assert!(loaded.missing[0].contains("weight_norm_init256"));
    }

    #[test]
    fn a_method_without_runs_is_named_with_the_methods_there_are() {
        let mut loaded = Loaded {
            runs: vec![run("b1-uniform-none"), run("b1-uniform-layer_norm")],
            ..Loaded::default()
        };
        let err = leave_out(&mut loaded, &["weigth_norm".into()]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--leave-out 'weigth_norm'"), "{text}");
        assert!(text.contains("layer_norm, none"), "{text}");
        assert_eq!(loaded.runs.len(), 2, "nothing left out on an error");
    }
}
