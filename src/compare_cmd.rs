//! `normrl compare` and `normrl report`.

use std::path::PathBuf;

use anyhow::Result;

use crate::compare::{
    check_plan, describe_plan, execute, parse_shard, CompareConfig, ReportConfig,
};
use crate::report;

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
    /// Print the plan and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Accept legal values that are almost surely a mistake in every run
    /// (`run.allow_odd = true`).
    #[arg(long)]
    pub allow_odd: bool,
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
}

pub fn compare(args: &CompareArgs) -> Result<()> {
    let mut config = CompareConfig::load(&args.config)?;
    if args.allow_odd {
        config
            .set
            .insert("run.allow_odd".into(), toml::Value::Boolean(true));
    }
    let mut runs = config.expand()?;
    check_plan(&config, &runs, args.jobs)?;
    let total = runs.len();
    if let Some(shard) = &args.shard {
        let (i, n) = parse_shard(shard)?;
        runs = runs
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % n == i)
            .map(|(_, r)| r)
            .collect();
        eprintln!("shard {i}/{n}: {} of {total} runs", runs.len());
    }
    let root = args
        .runs_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&config.name));
    eprintln!("{}", describe_plan(&config, &runs, args.jobs)?);
    eprintln!("runs directory: {}", root.display());
    if args.dry_run {
        for r in &runs {
            println!("{}", r.rel_dir.display());
        }
        return Ok(());
    }
    let skipped = execute(&config, &runs, &root, args.jobs)?;
    if skipped > 0 {
        eprintln!("{skipped} runs were already finished and skipped");
    }
    if args.shard.is_none() {
        let records = report::load_runs(std::slice::from_ref(&root), &config.report.thresholds)?;
        let built = report::build(records, &config.report)?;
        let out = root.join("report");
        report::write(&built, &out)?;
        println!("{}", report::markdown(&built));
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
    let records = report::load_runs(&args.dirs, &settings.thresholds)?;
    let built = report::build(records, &settings)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.dirs[0].join("report"));
    report::write(&built, &out)?;
    println!("{}", report::markdown(&built));
    eprintln!("report written to {}", out.display());
    Ok(())
}
