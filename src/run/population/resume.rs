//! Which checkpoint step each member of a population resumes from: the newest all hold,
//! else groups of those at the same step; each chosen checkpoint verified first.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::run::checkpoint;

pub(super) fn checkpoint_dir(run_dir: &std::path::Path, step: u64) -> PathBuf {
    checkpoint::complete(run_dir)
        .into_iter()
        .find(|(s, _)| *s == step)
        .map(|(_, dir)| dir)
        .expect("a step listed among the run's complete checkpoints")
}

/// The pending members (indices into `dirs`, each member's run directory) by the step
/// each resumes from (0: fresh): all at the newest step they share, else grouped by
/// their own newest. Each chosen checkpoint is verified first; a damaged one is set
/// aside (said on stderr) and the choice made again without it.
pub(super) fn resume_groups(dirs: &[&Path], pending: &[usize]) -> Result<Vec<(u64, Vec<usize>)>> {
    let mut points: Vec<BTreeSet<u64>> = pending
        .iter()
        .map(|&i| {
            let steps: BTreeSet<u64> = checkpoint::complete(dirs[i])
                .into_iter()
                .map(|(s, _)| s)
                .collect();
            if steps.is_empty() {
                BTreeSet::from([0])
            } else {
                steps
            }
        })
        .collect();
    let mut verified = BTreeSet::new();
    'choose: loop {
        let groups = group_by_steps(pending, &points);
        for (step, group) in groups.iter().filter(|(s, _)| *s > 0) {
            for &i in group {
                let k = pending
                    .iter()
                    .position(|&p| p == i)
                    .expect("a pending member");
                if !verified.insert((i, *step)) {
                    continue;
                }
                let dir = checkpoint_dir(dirs[i], *step);
                match checkpoint::verify(&dir) {
                    Ok(how) => checkpoint::note_unverified(&dir, how),
                    Err(e) => {
                        points[k].remove(step);
                        let instead = points[k].iter().next_back().copied();
                        checkpoint::warn_damaged(*step, &e, instead);
                        if instead.is_none() {
                            bail!(
                                "{} has no valid checkpoint to resume from: {e:#}",
                                dirs[i].display()
                            );
                        }
                        continue 'choose;
                    }
                }
            }
        }
        return Ok(groups);
    }
}

/// [`resume_groups`]' choice on the steps each member holds.
fn group_by_steps(pending: &[usize], points: &[BTreeSet<u64>]) -> Vec<(u64, Vec<usize>)> {
    let common = points
        .iter()
        .skip(1)
        .fold(points.first().cloned().unwrap_or_default(), |a, b| {
            a.intersection(b).copied().collect()
        });
    if let Some(&step) = common.last() {
        return vec![(step, pending.to_vec())];
    }
    let mut groups: Vec<(u64, Vec<usize>)> = vec![];
    for (&i, p) in pending.iter().zip(points) {
        let newest = *p.last().expect("never empty");
        match groups.iter_mut().find(|(s, _)| *s == newest) {
            Some((_, g)) => g.push(i),
            None => groups.push((newest, vec![i])),
        }
    }
    groups
}
