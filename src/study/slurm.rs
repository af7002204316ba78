//! A comparison as a Slurm job array: `runs/<experiment>/slurm/array.sbatch`, one array
//! task per group of runs of the plan, each task running `normrl compare --task auto`.
//! Settings come from the comparison's `[slurm]` table, and flags override them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::storage::write_atomic;
use crate::study::plan::Plan;

/// The `[slurm]` table of a comparison config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlurmConfig {
    /// Runs per array task, one after another.
    pub runs_per_task: usize,
    /// Array tasks running at once (`--array=0-N%M`); none: as the cluster allows.
    pub max_parallel: Option<usize>,
    pub cpus_per_task: usize,
    /// Memory per task, as Slurm writes it (`4G`).
    pub mem: Option<String>,
    /// Time limit per task, as Slurm writes it (`2:00:00`, `1-00:00:00`).
    pub time: Option<String>,
    pub partition: Option<String>,
    pub account: Option<String>,
    /// Let Slurm requeue a task (after a preemption, or when normrl asks on a signal).
    pub requeue: bool,
    /// The signal asked for before the time limit (`B:` sends it to normrl itself,
    /// which replaced the batch shell).
    pub signal: String,
    /// Lines written verbatim after the `#SBATCH` header (`#SBATCH --gres=gpu:1`,
    /// `module load cuda`).
    pub extra: Vec<String>,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        Self {
            runs_per_task: 1,
            max_parallel: None,
            cpus_per_task: 1,
            mem: None,
            time: None,
            partition: None,
            account: None,
            requeue: true,
            signal: "B:USR1@120".into(),
            extra: vec![],
        }
    }
}

impl SlurmConfig {
    /// Range problems, named by key.
    pub fn check(&self) -> Result<()> {
        let mut problems = vec![];
        if self.runs_per_task == 0 {
            problems.push("slurm.runs_per_task: a positive integer");
        }
        if self.cpus_per_task == 0 {
            problems.push("slurm.cpus_per_task: a positive integer");
        }
        if self.max_parallel == Some(0) {
            problems.push("slurm.max_parallel: a positive integer");
        }
        let words = [&self.mem, &self.time, &self.partition, &self.account];
        if words
            .iter()
            .any(|w| w.as_ref().is_some_and(|w| !is_word(w)))
        {
            problems.push("slurm.mem, time, partition, account: one word each, no spaces");
        }
        if !is_word(&self.signal) {
            problems.push("slurm.signal: one word, e.g. B:USR1@120");
        }
        if problems.is_empty() {
            return Ok(());
        }
        bail!("invalid Slurm settings:\n  {}", problems.join("\n  "))
    }
}

fn is_word(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '"')
}

/// What an array task runs: this program, the comparison and its runs directory as
/// absolute paths, and the flags that shape the plan.
pub struct TaskCommand {
    pub normrl: PathBuf,
    pub config: PathBuf,
    pub root: PathBuf,
    pub set: Vec<String>,
    pub allow_odd: bool,
    /// Runs of the task at once: its CPUs.
    pub jobs: usize,
}

impl TaskCommand {
    fn line(&self) -> String {
        let mut words = vec![
            quote(&self.normrl.display().to_string()),
            "compare".into(),
            "--config".into(),
            quote(&self.config.display().to_string()),
            "--runs-dir".into(),
            quote(&self.root.display().to_string()),
            "--task".into(),
            "auto".into(),
            "--jobs".into(),
            self.jobs.to_string(),
        ];
        for s in &self.set {
            words.push("--set".into());
            words.push(quote(s));
        }
        if self.allow_odd {
            words.push("--allow-odd".into());
        }
        words.join(" ")
    }
}

/// `s` quoted for the shell (a NUL, which no path or value holds, drops out).
fn quote(s: &str) -> String {
    let clean = s.replace('\0', "");
    shlex::try_quote(&clean).map_or(clean.clone(), |q| q.into_owned())
}

/// The batch script of `plan`'s array.
pub fn script(plan: &Plan, slurm: &SlurmConfig, task: &TaskCommand) -> String {
    let logs = task.root.join("slurm");
    let mut array = format!("0-{}", plan.tasks().saturating_sub(1));
    if let Some(m) = slurm.max_parallel {
        array.push_str(&format!("%{m}"));
    }
    let mut lines = vec![
        "#!/bin/bash".to_string(),
        format!(
            "# normrl compare --slurm: '{}', {} runs in {} array tasks of up to {} runs.",
            plan.name,
            plan.runs.len(),
            plan.tasks(),
            plan.runs_per_task
        ),
        format!("#SBATCH --job-name=normrl-{}", plan.name),
        format!("#SBATCH --array={array}"),
        format!("#SBATCH --cpus-per-task={}", slurm.cpus_per_task),
        // Appended, so that a requeued task's log keeps the first attempt's lines.
        "#SBATCH --open-mode=append".into(),
        format!("#SBATCH --output={}/%A_%a.out", logs.display()),
        format!("#SBATCH --error={}/%A_%a.err", logs.display()),
    ];
    let optional = [
        ("mem", &slurm.mem),
        ("time", &slurm.time),
        ("partition", &slurm.partition),
        ("account", &slurm.account),
    ];
    for (flag, value) in optional {
        if let Some(v) = value {
            lines.push(format!("#SBATCH --{flag}={v}"));
        }
    }
    if slurm.requeue {
        lines.push("#SBATCH --requeue".into());
    }
    lines.push(format!("#SBATCH --signal={}", slurm.signal));
    lines.extend(slurm.extra.iter().cloned());
    lines.push(String::new());
    lines.push(
        "# exec: normrl replaces the shell, so that the signal reaches it (--signal=B:...)".into(),
    );
    lines.push(format!("exec {}", task.line()));
    lines.join("\n") + "\n"
}

/// Writes the script into `<root>/slurm/array.sbatch` (and the log directory).
pub fn write_script(root: &Path, text: &str) -> Result<PathBuf> {
    let dir = root.join("slurm");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("array.sbatch");
    write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// `sbatch` on the PATH, for `--submit` (checked before anything is written).
pub fn find_sbatch() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("sbatch"))
        .find(|p| p.is_file())
        .context("--submit: sbatch is not on the PATH (is this a Slurm login node?); without --submit the script is written and the command printed")
}

/// Submits the script; the array's job id.
pub fn submit(sbatch: &Path, script: &Path) -> Result<String> {
    let out = std::process::Command::new(sbatch)
        .arg("--parsable")
        .arg(script)
        .output()
        .with_context(|| format!("cannot run {}", sbatch.display()))?;
    if !out.status.success() {
        bail!(
            "sbatch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // `--parsable` prints `<job id>[;<cluster>]`.
    Ok(text
        .trim()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::plan::PlanEntry;

    fn plan(runs: usize, per_task: usize) -> Plan {
        let entry = |i: usize| PlanEntry {
            dir: PathBuf::from(format!("env/v/seed-{i}")),
            env: "env".into(),
            variant: "v".into(),
            seed: i as u64,
            overrides: vec![],
        };
        Plan {
            name: "study".into(),
            runs_per_task: per_task,
            set: vec![],
            array: true,
            runs: (0..runs).map(entry).collect(),
        }
    }

    #[test]
    fn the_script_holds_every_setting_before_the_command() {
        let slurm = SlurmConfig {
            max_parallel: Some(3),
            cpus_per_task: 2,
            mem: Some("4G".into()),
            time: Some("1:00:00".into()),
            partition: Some("cpu".into()),
            account: Some("lab".into()),
            extra: vec!["#SBATCH --qos=low".into(), "module load rust".into()],
            ..Default::default()
        };
        let task = TaskCommand {
            normrl: PathBuf::from("/opt/normrl"),
            config: PathBuf::from("/c/it's.toml"),
            root: PathBuf::from("/runs/study"),
            set: vec!["run.total_steps=10".into()],
            allow_odd: true,
            jobs: 2,
        };
        // 7 runs in tasks of 3: tasks 0, 1 and 2 (the last with one run).
        let text = script(&plan(7, 3), &slurm, &task);
        let lines: Vec<&str> = text.lines().collect();
        for expected in [
            "#SBATCH --array=0-2%3",
            "#SBATCH --cpus-per-task=2",
            "#SBATCH --mem=4G",
            "#SBATCH --time=1:00:00",
            "#SBATCH --partition=cpu",
            "#SBATCH --account=lab",
            "#SBATCH --requeue",
            "#SBATCH --signal=B:USR1@120",
            "#SBATCH --open-mode=append",
            "#SBATCH --output=/runs/study/slurm/%A_%a.out",
            "#SBATCH --error=/runs/study/slurm/%A_%a.err",
        ] {
            assert!(lines.contains(&expected), "{expected}:\n{text}");
        }
        // The command's words as the shell splits them.
        let command = lines.last().unwrap().strip_prefix("exec ").unwrap();
        let words = shlex::split(command).unwrap();
        let expected = [
            "/opt/normrl",
            "compare",
            "--config",
            "/c/it's.toml",
            "--runs-dir",
            "/runs/study",
            "--task",
            "auto",
            "--jobs",
            "2",
            "--set",
            "run.total_steps=10",
            "--allow-odd",
        ];
        assert_eq!(words, expected);
        // sbatch reads directives only before the first command: the extra lines come
        // after every #SBATCH line of ours, in the order given.
        let at = |l: &str| lines.iter().position(|x| *x == l).unwrap();
        assert!(at("#SBATCH --signal=B:USR1@120") < at("#SBATCH --qos=low"));
        assert!(at("#SBATCH --qos=low") < at("module load rust"));
        assert_eq!(plan(7, 3).task(2), 6..7);
    }
}
