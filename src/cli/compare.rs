//! `normrl compare` and `normrl report`.

use std::path::{Path, PathBuf};

use std::io::Write;

use anyhow::{bail, Context, Result};

use crate::config::parse_assignment;
use crate::report;
use crate::report::settings::ReportConfig;
use crate::study::compare::{CompareConfig, PlannedRun};
use crate::study::estimate::{
    check_plan, class_costs, describe_plan, measure_rates, rates_by_env, study_on_gpu, Timing,
    MEASURED_STEPS,
};
use crate::study::execute::execute;
use crate::study::plan::{task_index, Plan};
use crate::study::slurm::{self, SlurmConfig, TaskCommand};

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The comparison's TOML file (see configs/compare/).
    #[arg(long)]
    pub config: PathBuf,
    /// Runs in parallel, one CPU thread each.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Run only every n-th run starting at i (`i/n`), to split a grid over machines;
    /// `normrl report` merges the shards' directories.
    #[arg(long)]
    pub shard: Option<String>,
    /// Where the experiment's runs go (default: runs/<name>).
    #[arg(long)]
    pub runs_dir: Option<PathBuf>,
    /// Print the plan, its runs and its time, and stop. The time is measured: on the
    /// CPU each cost class of the grid (environment, network, method, batch size,
    /// update frequency) trains for a few hundred updates in a scratch folder (kept
    /// in ~/.cache/normrl/step-costs.json for this machine and binary); on a GPU, or
    /// with `population`, the first population of each batch size trains for 300 steps
    /// with updates.
    #[arg(long)]
    pub dry_run: bool,
    /// Accepted for older scripts: a dry run always measures now.
    #[arg(long, hide = true)]
    pub measure: bool,
    /// Accept legal values that are almost surely a mistake in every run
    /// (`run.allow_odd = true`).
    #[arg(long)]
    pub allow_odd: bool,
    /// Override a value in every run, like an entry of the comparison's `[set]`
    /// (repeatable; recorded in plan.json), e.g. `--set run.total_steps=100000`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Write runs/<name>/slurm/array.sbatch, a Slurm job array of the plan, and print
    /// the command that submits it.
    #[arg(long, conflicts_with = "shard")]
    pub slurm: bool,
    /// With --slurm: submit the array with sbatch.
    #[arg(long, requires = "slurm")]
    pub submit: bool,
    /// Run the runs of one array task: its index, or `auto` (SLURM_ARRAY_TASK_ID, else
    /// JOB_COMPLETION_INDEX).
    #[arg(long, conflicts_with_all = ["slurm", "shard"])]
    pub task: Option<String>,
    #[command(flatten)]
    pub slurm_flags: SlurmFlags,
}

/// Flags that override the comparison's `[slurm]` table.
#[derive(Debug, Default, clap::Args)]
pub struct SlurmFlags {
    /// Runs per array task, run one after another (fixed once an array of the plan is
    /// written).
    #[arg(long)]
    pub runs_per_task: Option<usize>,
    /// Array tasks running at once (`--array=0-N%M`).
    #[arg(long)]
    pub max_parallel: Option<usize>,
    /// CPUs per task, also its runs at once.
    #[arg(long)]
    pub cpus_per_task: Option<usize>,
    /// Memory per task (`4G`).
    #[arg(long)]
    pub mem: Option<String>,
    /// Time limit per task (`2:00:00`).
    #[arg(long)]
    pub time: Option<String>,
    /// The Slurm partition.
    #[arg(long)]
    pub partition: Option<String>,
    /// The Slurm account charged.
    #[arg(long)]
    pub account: Option<String>,
    /// The signal asked for before the time limit (`B:USR1@120`).
    #[arg(long)]
    pub signal: Option<String>,
    /// Do not let Slurm requeue tasks (`--requeue` is written otherwise).
    #[arg(long)]
    pub no_requeue: bool,
    /// A line for the script after the `#SBATCH` header (repeatable), e.g.
    /// `--extra "#SBATCH --gres=gpu:1"`.
    #[arg(long = "extra", value_name = "LINE")]
    pub extra: Vec<String>,
}

impl SlurmFlags {
    fn apply(&self, slurm: &mut SlurmConfig) {
        if let Some(k) = self.runs_per_task {
            slurm.runs_per_task = k;
        }
        if let Some(m) = self.max_parallel {
            slurm.max_parallel = Some(m);
        }
        if let Some(c) = self.cpus_per_task {
            slurm.cpus_per_task = c;
        }
        let words = [
            (&self.mem, &mut slurm.mem),
            (&self.time, &mut slurm.time),
            (&self.partition, &mut slurm.partition),
            (&self.account, &mut slurm.account),
        ];
        for (flag, setting) in words {
            if flag.is_some() {
                setting.clone_from(flag);
            }
        }
        if let Some(signal) = &self.signal {
            slurm.signal.clone_from(signal);
        }
        if self.no_requeue {
            slurm.requeue = false;
        }
        slurm.extra.extend(self.extra.iter().cloned());
    }
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Experiment directories (several merge shards).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The comparison config, for its [report] settings (baseline, thresholds, scores).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Baseline variant for the probability of improvement.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Output directory (default: <first dir>/report).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Leave out every run of this method (repeatable): one that another comparison
    /// retrained, say. The report names it at the top; scores are normalized as with
    /// it, so that the other methods' normalized scores stay where they were.
    #[arg(long = "leave-out", value_name = "METHOD")]
    pub leave_out: Vec<String>,
}

pub fn compare(args: &CompareArgs) -> Result<()> {
    let mut config = CompareConfig::load(&args.config)?;
    if args.allow_odd {
        config
            .set
            .insert("run.allow_odd".into(), toml::Value::Boolean(true));
    }
    for assignment in &args.overrides {
        let (key, value) = parse_assignment(assignment)?;
        config.set.insert(key, value);
    }
    args.slurm_flags.apply(&mut config.slurm);
    config.slurm.check()?;
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    let sbatch = if args.submit {
        Some(slurm::find_sbatch()?)
    } else {
        None
    };
    let runs = config.expand()?;
    check_plan(&config, &runs, args.jobs)?;
    let root = args
        .runs_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&config.name));
    let grouping_asked = args.slurm_flags.runs_per_task.is_some() || args.slurm;
    if args.dry_run {
        return dry_run(args, &config, runs, &root, shard);
    }
    let plan = Plan::new(
        &config.name,
        &runs,
        config.slurm.runs_per_task,
        &args.overrides,
    );
    let array = args.slurm || args.task.is_some();
    let settled = plan.settle(&root, array, grouping_asked)?;
    // The task's index is checked against the plan it runs by before plan.json is
    // written: a bad index writes nothing.
    let task = match &args.task {
        Some(task) => Some(task_index(task, settled.plan.tasks())?),
        None => None,
    };
    let plan = settled.commit(&root)?;
    if let Some(i) = task {
        return run_task(&config, &runs, &plan, i, &root, args.jobs);
    }
    if args.slurm {
        return write_array(args, &config, &plan, &root, sbatch.as_deref());
    }
    run_locally(args, &config, runs, &root, shard)
}

/// `--dry-run`: what this invocation would run (its shard's or task's runs, or all),
/// their cost, and each run's folder beside the method it trains; refused, as the run
/// itself would be, where `plan.json` was written for another plan. Writes nothing.
fn dry_run(
    args: &CompareArgs,
    config: &CompareConfig,
    runs: Vec<PlannedRun>,
    root: &Path,
    shard: Option<(usize, usize)>,
) -> Result<()> {
    let grouping_asked = args.slurm_flags.runs_per_task.is_some() || args.slurm;
    let plan = Plan::new(
        &config.name,
        &runs,
        config.slurm.runs_per_task,
        &args.overrides,
    );
    let settled = plan.settle(root, args.slurm || args.task.is_some(), grouping_asked)?;
    let total = runs.len();
    let mine = match (&args.task, shard) {
        (Some(task), _) => {
            let i = task_index(task, settled.plan.tasks())?;
            eprintln!("array task {i} of {}", settled.plan.tasks());
            runs[settled.plan.task(i)].to_vec()
        }
        (None, Some(shard)) => shard_runs(runs, shard),
        (None, None) => runs,
    };
    if mine.len() < total {
        eprintln!("{} of {total} runs", mine.len());
    }
    // A GPU's or a population's rates are the first unit's of each batch size;
    // separate runs on the CPU are timed by their cost classes.
    let rate = match config.population.is_some() || study_on_gpu(config, &mine)? {
        true => Some(measure_rates(config, &mine, MEASURED_STEPS)?),
        false => None,
    };
    let describe = |runs: &[PlannedRun]| match &rate {
        Some(rate) => describe_plan(config, runs, args.jobs, Timing::Device(rate)),
        None => describe_plan(
            config,
            runs,
            args.jobs,
            Timing::Classes(&class_costs(config, runs)?),
        ),
    };
    match &rate {
        Some(_) => eprintln!("{}", describe(&mine)?),
        // The plan's cost classes once, for its line and its table per setting.
        None => {
            let costs = class_costs(config, &mine)?;
            let timing = Timing::Classes(&costs);
            eprintln!("{}", describe_plan(config, &mine, args.jobs, timing)?);
            eprintln!("{}", rates_by_env(&costs));
        }
    }
    // A study that goes on (a restart, an archive merged) costs only what is left.
    let left: Vec<PlannedRun> = mine
        .iter()
        .filter(|r| !crate::study::status::has_finished(&root.join(&r.rel_dir)))
        .cloned()
        .collect();
    match left.len() {
        n if n == mine.len() => {}
        0 => eprintln!("all {} of these runs have finished", mine.len()),
        n => eprintln!(
            "{} of these {} runs have finished; the {n} left: {}",
            mine.len() - n,
            mine.len(),
            describe(&left)?
        ),
    }
    let mut out = std::io::stdout().lock();
    for r in &mine {
        let method = config.config_for(r)?.norm.name();
        let line = format!("{}\t{method}", r.rel_dir.display());
        // A closed pipe (`| head`) ends the listing, not the program.
        if writeln!(out, "{line}").is_err() {
            break;
        }
    }
    Ok(())
}

/// The runs of shard `i` of `n`: every n-th run from run i.
fn shard_runs(runs: Vec<PlannedRun>, (i, n): (usize, usize)) -> Vec<PlannedRun> {
    runs.into_iter()
        .enumerate()
        .filter(|(k, _)| k % n == i)
        .map(|(_, r)| r)
        .collect()
}

/// The runs of one array task, one after another (or `--jobs` at a time).
fn run_task(
    config: &CompareConfig,
    runs: &[PlannedRun],
    plan: &Plan,
    i: usize,
    root: &Path,
    jobs: usize,
) -> Result<()> {
    let mine = &runs[plan.task(i)];
    eprintln!(
        "array task {i} of {}: {} runs ({})",
        plan.tasks(),
        mine.len(),
        mine.iter()
            .map(|r| r.rel_dir.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let done = execute(config, mine, root, jobs)?;
    eprintln!(
        "array task {i}: done ({} were finished already, {} held by another process)",
        done.finished_before, done.held_elsewhere
    );
    Ok(())
}

/// `--slurm`: the batch script, and its submission with `--submit`.
fn write_array(
    args: &CompareArgs,
    config: &CompareConfig,
    plan: &Plan,
    root: &Path,
    sbatch: Option<&Path>,
) -> Result<()> {
    let absolute = |p: &Path| -> Result<PathBuf> {
        std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
    };
    let task = TaskCommand {
        normrl: std::env::current_exe().context("cannot find this program's path")?,
        config: absolute(&args.config)?,
        root: absolute(root)?,
        set: args.overrides.clone(),
        allow_odd: args.allow_odd,
        jobs: config.slurm.cpus_per_task,
    };
    let text = slurm::script(plan, &config.slurm, &task);
    let script = slurm::write_script(root, &text)?;
    eprintln!(
        "{} runs in {} array tasks: {}",
        plan.runs.len(),
        plan.tasks(),
        script.display()
    );
    match sbatch {
        Some(sbatch) => {
            let job = slurm::submit(sbatch, &script)?;
            println!("{job}");
            eprintln!(
                "submitted array job {job}; follow it with: normrl status {}",
                root.display()
            );
        }
        None => println!("sbatch {}", script.display()),
    }
    Ok(())
}

/// All runs here (or a `--shard`'s), with `--jobs` workers, then the report.
fn run_locally(
    args: &CompareArgs,
    config: &CompareConfig,
    mut runs: Vec<PlannedRun>,
    root: &Path,
    shard: Option<(usize, usize)>,
) -> Result<()> {
    let total = runs.len();
    if let Some((i, n)) = shard {
        runs = shard_runs(runs, (i, n));
        eprintln!("shard {i}/{n}: {} of {total} runs", runs.len());
    }
    eprintln!(
        "{}",
        describe_plan(config, &runs, args.jobs, Timing::Unmeasured)?
    );
    eprintln!("runs directory: {}", root.display());
    let done = execute(config, &runs, root, args.jobs)?;
    if done.finished_before > 0 {
        eprintln!(
            "{} runs were already finished and skipped",
            done.finished_before
        );
    }
    if done.held_elsewhere > 0 {
        eprintln!(
            "{} runs are being trained by another process and were skipped; the report waits for them: `normrl status {}` follows them, and `normrl compare` again (or `normrl report`) reports once they are done",
            done.held_elsewhere,
            root.display()
        );
    }
    if shard.is_none() && done.held_elsewhere == 0 {
        let loaded = report::load_runs(&[root.to_path_buf()], &config.report.thresholds)?;
        let built = report::build(loaded, &config.report)?;
        let out = root.join("report");
        report::write(&built, &out)?;
        println!("{}", report::markdown(&built));
        say_missing(&built);
        eprintln!("report written to {}", out.display());
    }
    Ok(())
}

pub fn report(args: &ReportArgs) -> Result<()> {
    let mut settings = match &args.config {
        Some(path) => CompareConfig::load(path)?.report,
        None => ReportConfig::default(),
    };
    if args.baseline.is_some() {
        settings.baseline = args.baseline.clone();
    }
    let mut loaded = report::load_runs(&args.dirs, &settings.thresholds)?;
    if !args.leave_out.is_empty() {
        // Normalized by every run's ranges, the left-out methods' included.
        settings.scores = report::all_score_ranges(&loaded, &settings);
    }
    let left_out = report::leave_out(&mut loaded, &args.leave_out)?;
    let mut built = report::build(loaded, &settings)?;
    built.left_out = left_out;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.dirs[0].join("report"));
    report::write(&built, &out)?;
    println!("{}", report::markdown(&built));
    say_missing(&built);
    eprintln!("report written to {}", out.display());
    Ok(())
}

/// The runs a report left out, on standard error too (its Markdown names them first).
fn say_missing(report: &report::Report) {
    if !report.missing.is_empty() {
        eprintln!(
            "{} runs are missing from the report (named at the top of report.md)",
            report.missing.len()
        );
    }
}

/// `i/n`: this machine runs every n-th run, starting at run i (0-based).
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let parsed = s
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some((i, n)) if n > 0 && i < n => Ok((i, n)),
        _ => bail!("--shard '{s}': expected i/n with 0 <= i < n, e.g. 0/4"),
    }
}
