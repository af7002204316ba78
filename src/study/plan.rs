//! A comparison's plan, written once to `runs/<experiment>/plan.json`: every run in a
//! fixed order with its resolved overrides, and how many consecutive runs make one
//! array task. Slurm array task `i` (or Kubernetes completion index `i`) runs runs
//! `i*K .. (i+1)*K`, on whichever machine it lands, and a task whose comparison no
//! longer gives the same runs refuses to run: its index would mean other runs.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::storage::{create_atomic, write_atomic};

/// One run of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    pub env: String,
    pub variant: String,
    pub seed: u64,
    pub overrides: Vec<String>,
    /// `<env>/<variant>/seed-<k>` below the experiment directory.
    pub rel_dir: PathBuf,
}

pub const PLAN_FILE: &str = "plan.json";

/// One run of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanEntry {
    /// `<env>/<variant>/seed-<k>` below the experiment directory.
    pub dir: PathBuf,
    pub env: String,
    pub variant: String,
    pub seed: u64,
    /// Everything set on top of the base config, in order (the comparison's `[set]`
    /// and `--set`, the axes, the variant, the seed).
    pub overrides: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub name: String,
    /// Runs per array task, run one after another.
    pub runs_per_task: usize,
    /// The `--set` assignments given to `normrl compare` (already in each run's
    /// overrides; kept here to say how the study was scaled).
    pub set: Vec<String>,
    /// An array was written or one of its tasks ran: the grouping is fixed. (A plan
    /// only run locally may still be regrouped.)
    #[serde(default)]
    pub array: bool,
    pub runs: Vec<PlanEntry>,
}

impl Plan {
    pub fn new(name: &str, runs: &[PlannedRun], runs_per_task: usize, set: &[String]) -> Self {
        Self {
            name: name.to_string(),
            runs_per_task: runs_per_task.max(1),
            set: set.to_vec(),
            array: false,
            runs: runs
                .iter()
                .map(|r| PlanEntry {
                    dir: r.rel_dir.clone(),
                    env: r.env.clone(),
                    variant: r.variant.clone(),
                    seed: r.seed,
                    overrides: r.overrides.clone(),
                })
                .collect(),
        }
    }

    /// The plan in `root`, if one was written.
    pub fn load(root: &Path) -> Result<Option<Self>> {
        let path = root.join(PLAN_FILE);
        let plan: Option<Self> = crate::storage::read_json(&path, "a comparison plan")?;
        // Written as at least 1; a hand-edited 0 would divide the runs into no tasks.
        if plan.as_ref().is_some_and(|p| p.runs_per_task == 0) {
            bail!(
                "{}: runs_per_task = 0; it must be a positive number of runs per array task",
                path.display()
            );
        }
        Ok(plan)
    }

    /// Array tasks: `ceil(runs / runs_per_task)`.
    pub fn tasks(&self) -> usize {
        self.runs.len().div_ceil(self.runs_per_task)
    }

    /// The runs of task `i` (an index below [`Self::tasks`]).
    pub fn task(&self, i: usize) -> Range<usize> {
        let start = i * self.runs_per_task;
        start..(start + self.runs_per_task).min(self.runs.len())
    }

    /// The plan to run by: this one if `root` has none; else the one there, which must
    /// have the same runs (and, when `runs_per_task` was asked for, the same grouping
    /// once that is fixed). `array`: an array is written, or a task runs, with this
    /// plan, which fixes its grouping. Nothing is written: [`Settled::commit`] does,
    /// once the caller has checked what depends on the plan (a task's index).
    pub fn settle(mut self, root: &Path, array: bool, grouping_asked: bool) -> Result<Settled> {
        let path = root.join(PLAN_FILE);
        let Some(mut written) = Self::load(root)? else {
            self.array = array;
            return Ok(Settled {
                plan: self,
                changed: true,
                fresh: Some(grouping_asked),
            });
        };
        if let Some(why) = written.difference(&self) {
            bail!(
                "{} was written for another plan ({why}): its task indices would now mean other runs. Run the comparison as planned, or give this one a new --runs-dir",
                path.display()
            );
        }
        let regroup = grouping_asked && written.runs_per_task != self.runs_per_task;
        if regroup && written.array {
            bail!(
                "{} groups {} runs per task, not {}: an array of it exists, so its task indices are fixed; give a new --runs-dir to regroup",
                path.display(),
                written.runs_per_task,
                self.runs_per_task
            );
        }
        if regroup {
            written.runs_per_task = self.runs_per_task;
        }
        let changed = regroup || (array && !written.array);
        written.array |= array;
        Ok(Settled {
            plan: written,
            changed,
            fresh: None,
        })
    }

    /// The first way `other` differs in its runs, in words.
    fn difference(&self, other: &Plan) -> Option<String> {
        if self.name != other.name {
            return Some(format!("experiment '{}', now '{}'", self.name, other.name));
        }
        if self.runs.len() != other.runs.len() {
            return Some(format!(
                "{} runs, now {}",
                self.runs.len(),
                other.runs.len()
            ));
        }
        let (i, (was, now)) = self
            .runs
            .iter()
            .zip(&other.runs)
            .enumerate()
            .find(|(_, (a, b))| a != b)?;
        if was.dir != now.dir {
            return Some(format!(
                "run {i} was {}, now {}",
                was.dir.display(),
                now.dir.display()
            ));
        }
        let changed: Vec<&String> = now
            .overrides
            .iter()
            .filter(|o| !was.overrides.contains(o))
            .collect();
        Some(format!(
            "run {i} ({}) now sets {changed:?}",
            was.dir.display()
        ))
    }
}

/// A plan as [`Plan::settle`] resolved it, and whether `plan.json` must be (re)written.
pub struct Settled {
    pub plan: Plan,
    changed: bool,
    /// `root` had no plan when this one was settled (and whether a grouping was
    /// asked for): another invocation may have written one since.
    fresh: Option<bool>,
}

impl Settled {
    /// Writes `plan.json` if it changed; the plan to run by. A new plan is published
    /// only if no other invocation (two shards started together on a shared disk)
    /// wrote one since [`Plan::settle`]; if one did, this plan is settled against that
    /// one: the same runs go on by it, other runs are refused naming the difference.
    pub fn commit(self, root: &Path) -> Result<Plan> {
        if !self.changed {
            return Ok(self.plan);
        }
        std::fs::create_dir_all(root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        let text = serde_json::to_string_pretty(&self.plan)?;
        let path = root.join(PLAN_FILE);
        let Some(grouping_asked) = self.fresh else {
            write_atomic(&path, text.as_bytes())?;
            return Ok(self.plan);
        };
        if create_atomic(&path, text.as_bytes())? {
            return Ok(self.plan);
        }
        let array = self.plan.array;
        self.plan.settle(root, array, grouping_asked)?.commit(root)
    }
}

/// The array task index: a number, or `auto` for the scheduler's
/// (`SLURM_ARRAY_TASK_ID`, else Kubernetes' `JOB_COMPLETION_INDEX`); checked against
/// the plan's `tasks`.
pub fn task_index(task: &str, tasks: usize) -> Result<usize> {
    let (index, source) = if task == "auto" {
        let found = ["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"]
            .into_iter()
            .find_map(|var| std::env::var(var).ok().map(|v| (v, var)));
        let Some((value, var)) = found else {
            bail!("--task auto: neither SLURM_ARRAY_TASK_ID (a Slurm array task) nor JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) is set; give --task I");
        };
        (value, var)
    } else {
        (task.to_string(), "--task")
    };
    match index.trim().parse::<usize>() {
        Ok(i) if i < tasks => Ok(i),
        _ => bail!(
            "{source} = '{index}': the plan has tasks 0 to {} (allowed: an index in that range, or auto)",
            tasks.saturating_sub(1)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seeds: u64) -> Plan {
        let runs: Vec<PlannedRun> = (0..seeds)
            .map(|seed| PlannedRun {
                env: "cartpole".into(),
                variant: "none".into(),
                seed,
                overrides: vec![format!("run.seed={seed}")],
                rel_dir: PathBuf::from(format!("cartpole/none/seed-{seed}")),
            })
            .collect();
        Plan::new("race", &runs, 1, &[])
    }

    fn fresh_root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("normrl-plan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        root
    }

    /// Two invocations both find no plan, then both publish theirs (the interleaving
    /// that killed one shard of two started together): both run by the one plan.
    #[test]
    fn invocations_racing_on_a_new_plan_both_run_it() {
        let root = fresh_root("same");
        let first = plan(3).settle(&root, false, false).unwrap();
        let second = plan(3).settle(&root, false, false).unwrap();
        assert_eq!(second.commit(&root).unwrap(), plan(3));
        assert_eq!(first.commit(&root).unwrap(), plan(3));
        assert_eq!(Plan::load(&root).unwrap(), Some(plan(3)));
        let files: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().collect();
        assert_eq!(files.len(), 1, "only plan.json is left");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The same race between two different grids: the one that publishes second is
    /// refused, naming the difference, and the plan on disk is the first one's.
    #[test]
    fn an_invocation_racing_with_another_plan_is_refused() {
        let root = fresh_root("other");
        let late = plan(3).settle(&root, false, false).unwrap();
        plan(2)
            .settle(&root, false, false)
            .unwrap()
            .commit(&root)
            .unwrap();
        let err = late.commit(&root).unwrap_err().to_string();
        assert!(
            err.contains("was written for another plan (2 runs, now 3)"),
            "{err}"
        );
        assert_eq!(Plan::load(&root).unwrap(), Some(plan(2)));
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A plan edited to 0 runs per task is refused as it is read, naming the file and
    /// the key: `tasks` divided by it (a panic in `--task` and `--slurm`).
    #[test]
    fn a_plan_of_no_runs_per_task_is_refused() {
        let root = fresh_root("zero");
        plan(3)
            .settle(&root, false, false)
            .unwrap()
            .commit(&root)
            .unwrap();
        let path = root.join(PLAN_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = text.replace("\"runs_per_task\": 1", "\"runs_per_task\": 0");
        assert_ne!(edited, text, "{text}");
        std::fs::write(&path, edited).unwrap();
        let err = Plan::load(&root).unwrap_err().to_string();
        assert!(err.contains("plan.json: runs_per_task = 0"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Many threads settling and committing one plan at once: every one runs by it.
    #[test]
    fn simultaneous_invocations_all_run() {
        let root = fresh_root("threads");
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| plan(4).settle(&root, false, false)?.commit(&root)))
                .collect();
            for h in handles {
                assert_eq!(h.join().unwrap().unwrap(), plan(4));
            }
        });
        std::fs::remove_dir_all(&root).unwrap();
    }
}
