//! The non-i.i.d. question in numbers: how much each method's IQM of normalized final
//! scores changes when its batches come from a correlated sampler (`sequential`: runs
//! of consecutive transitions) instead of `uniform`, at each batch size, over all
//! environments, with a stratified-bootstrap interval of the difference.

use std::collections::BTreeMap;

use serde::Serialize;

use super::aggregate::{Estimate, Scores, REPS};
use super::grid::UNIFORM;
use super::stats::{aggregate_iqm, paired_ci};

/// Seeds of these intervals' bootstraps start here, apart from the other figures'.
const SEED: u64 = 11_000;

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
            let seed = SEED + out.len() as u64;
            if let Some(change) = iqm_change(scores, from, variant, seed) {
                out.push(SamplerChange {
                    method: method.clone(),
                    batch_size,
                    from: UNIFORM.to_string(),
                    to: to.clone(),
                    change,
                });
            }
        }
    }
    out
}

/// IQM of `to`'s normalized final scores less IQM of `from`'s, with its 95% interval;
/// none when they share no environment. Only environments both variants have runs on
/// count, so that the difference compares the same games. Each environment of each
/// variant is a stratum: seeds are resampled within it, for both samplers apart (their
/// runs are independent, not paired by seed).
pub fn iqm_change(scores: &Scores, from: &str, to: &str, seed: u64) -> Option<Estimate> {
    let (mut x, mut y) = (vec![], vec![]);
    for (a, b) in scores.of(to, true).into_iter().zip(scores.of(from, true)) {
        if !a.is_empty() && !b.is_empty() {
            x.push(a);
            y.push(b);
        }
    }
    if x.is_empty() {
        return None;
    }
    let diff = |a: &[Vec<f64>], b: &[Vec<f64>]| aggregate_iqm(a) - aggregate_iqm(b);
    let (value, (low, high)) = paired_ci(&x, &y, diff, REPS, seed);
    Some(Estimate { value, low, high })
}
