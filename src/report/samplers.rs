//! The non-i.i.d. question in numbers: how much each method's IQM of normalized final
//! scores changes when its batches come from a correlated sampler (`sequential`: runs
//! of consecutive transitions) instead of `uniform`, at each batch size, over all
//! environments, with a stratified-bootstrap interval of the difference.

use std::collections::BTreeMap;

use serde::Serialize;

use super::aggregate::{iqm_change, Estimate, Scores};
use super::grid::UNIFORM;
use super::records::RunRecord;

/// These intervals' bootstrap salt (the runs seed the rest), apart from the other
/// statistics'.
const SALT: u64 = 11_000;

/// One method's change from `uniform` to another sampler at one batch size.
#[derive(Debug, Clone, Serialize)]
pub struct SamplerChange {
    pub method: String,
    pub batch_size: Option<usize>,
    /// The reference sampler, `uniform`.
    pub from: String,
    pub to: String,
    /// IQM with `to` less IQM with `from`, normalized, over the environments both ran.
    pub change: Estimate,
    /// Every run of `to` trained exactly as `from`'s run of the same environment and
    /// seed, to the same final return (a sampler that draws the same batches, as `sequential` does at batch 1,
    /// whose runs of one transition are uniform draws). The change is then exactly 0:
    /// the bootstrap, which resamples the two samplers apart, would draw a spread
    /// where there is none.
    pub same_runs: bool,
}

/// Every method's [`SamplerChange`] at every batch size where it ran `uniform` and
/// another sampler: none when the grid has a single sampler.
pub fn sampler_changes(scores: &Scores, variants: &[String]) -> Vec<SamplerChange> {
    // (method, batch size) -> sampler -> variant.
    type Cells<'a> = BTreeMap<(String, Option<usize>), BTreeMap<String, &'a str>>;
    let mut cells: Cells = BTreeMap::new();
    for v in variants {
        let Some(axes) = scores.axes(v) else { continue };
        let Some(sampler) = axes.setting.sampler.clone() else {
            continue;
        };
        let key = (axes.method.clone(), axes.setting.batch_size);
        cells.entry(key).or_default().insert(sampler, v);
    }
    let mut out = vec![];
    for ((method, batch_size), samplers) in cells {
        let Some(&from) = samplers.get(UNIFORM) else {
            continue;
        };
        for (to, &variant) in samplers.iter().filter(|(s, _)| *s != UNIFORM) {
            let same_runs = same_runs(scores, from, variant);
            let exact = Estimate {
                value: 0.0,
                low: 0.0,
                high: 0.0,
            };
            let change = match same_runs {
                true => Some(exact),
                false => iqm_change(scores, from, variant, SALT),
            };
            if let Some(change) = change {
                out.push(SamplerChange {
                    method: method.clone(),
                    batch_size,
                    from: UNIFORM.to_string(),
                    to: to.clone(),
                    change,
                    same_runs,
                });
            }
        }
    }
    out
}

/// A run as [`same_runs`] compares it: its training curve and final return.
type Trained<'a> = (&'a Vec<(u64, f64)>, f64);

/// Whether `a` and `b` ran the same seeds on the same environments (at least one) and
/// every pair of runs trained alike (the same training curve) to the same final
/// return, bit for bit. Not the whole evaluation curve: the study's binary evaluated
/// a run resumed between two evaluations otherwise (fixed since), and one such pair
/// differs in an evaluation midway.
fn same_runs(scores: &Scores, a: &str, b: &str) -> bool {
    let mut pairs = 0;
    for env in scores.envs {
        let runs = |v: &str| -> BTreeMap<u64, Trained> {
            let rs = scores
                .groups
                .get(&(*env, v))
                .map_or(&[][..], |r| r.as_slice());
            rs.iter()
                .map(|r: &&RunRecord| (r.seed, (&r.train_curve, r.final_return)))
                .collect()
        };
        let (x, y) = (runs(a), runs(b));
        if x != y {
            return false;
        }
        pairs += x.len();
    }
    pairs > 0
}
