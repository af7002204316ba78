//! `bench --launches N`: the same benchmark in N fresh processes, one after another,
//! each row's numbers over the launches. Where a buffer lands in memory differs from
//! one launch to the next (address randomization), and a layout's effect on speed is
//! the same for every timing of one launch: only fresh processes show it.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// One row's values over the launches: each launch's median (or single measurement)
/// and, for timings, each launch's fastest.
#[derive(Default)]
struct OverLaunches {
    unit: String,
    values: Vec<f64>,
    mins: Vec<f64>,
}

/// This process's arguments without `--launches` and `--json`, then `--json`.
fn child_args() -> Vec<String> {
    let mut args = vec![];
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--launches" => {
                given.next();
            }
            "--json" => {}
            a if a.starts_with("--launches=") => {}
            _ => args.push(arg),
        }
    }
    args.push("--json".into());
    args
}

/// Runs this benchmark in `launches` fresh processes and prints each row's minimum,
/// median and maximum over them.
pub(crate) fn run(launches: usize, json: bool) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the normrl binary")?;
    let args = child_args();
    let mut rows: BTreeMap<(String, String), OverLaunches> = BTreeMap::new();
    let mut order = vec![];
    for launch in 0..launches {
        let out = Command::new(&exe).args(&args).output()?;
        if !out.status.success() {
            bail!(
                "launch {} of {launches} failed: {}",
                launch + 1,
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .trim_start_matches("error: ")
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let row: serde_json::Value = serde_json::from_str(line)?;
            let text = |k: &str| row[k].as_str().unwrap_or_default().to_string();
            let key = (text("bench"), text("case"));
            if !rows.contains_key(&key) {
                order.push(key.clone());
            }
            let entry = rows.entry(key).or_default();
            entry.unit = text("unit");
            entry.values.extend(row["value"].as_f64());
            entry.mins.extend(row["min"].as_f64());
        }
    }
    if !json {
        println!("{launches} launches; over them, each launch's median (timings) or measurement:");
        println!(
            "{:<26} {:<30} {:>10} {:>10} {:>10} {:>7}  {:>10}",
            "benchmark", "case", "min", "median", "max", "spread", "best min"
        );
    }
    for key in order {
        print_row(&key, &rows[&key], json);
    }
    Ok(())
}

/// Minimum, median and maximum of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn print_row((bench, case): &(String, String), row: &OverLaunches, json: bool) {
    let (min, median, max) = spread(&row.values);
    let best = (!row.mins.is_empty()).then(|| spread(&row.mins).0);
    if json {
        let line = serde_json::json!({"bench": bench, "case": case, "unit": row.unit,
            "launches": row.values.len(), "min": min, "median": median, "max": max,
            "best_min": best});
        println!("{line}");
        return;
    }
    let best = best.map_or(String::new(), |b| format!("{b:>10.1}"));
    println!(
        "{bench:<26} {case:<30} {min:>10.1} {median:>10.1} {max:>10.1} {:>6.1}%  {best} {}",
        (max / min - 1.0) * 100.0,
        row.unit
    );
}
