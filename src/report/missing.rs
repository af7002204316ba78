//! The report's list of missing runs, grouped. A study drawn part-way through misses
//! hundreds of runs (the first edition's, at 586 of 1,050: 464 lines), which one line
//! each buried the report's first page under; grouped, it is a line per variant and
//! reason, and a count per environment.

use std::path::Path;

/// A missing run's line, `<dir>/seed-<k>: <why>`, as its variant's directory, seed and
/// reason; `None` for a line of another form (kept as it is).
fn parts(line: &str) -> Option<(&str, u64, &str)> {
    let (dir, why) = line.split_once(": ")?;
    let (variant, seed) = dir.rsplit_once('/')?;
    let seed = seed.strip_prefix("seed-")?.parse().ok()?;
    Some((variant, seed, why))
}

/// A missing run's variant label (`b32-uniform-none`), for a line of that form.
pub(super) fn variant_of(line: &str) -> Option<&str> {
    let (dir, _, _) = parts(line)?;
    Path::new(dir).file_name()?.to_str()
}

/// The lines with the runs of one variant that share a reason together (`<dir>/seed-1
/// to seed-5: not finished`), in order; a run alone keeps its own line.
pub(super) fn grouped(missing: &[String]) -> Vec<String> {
    let mut out: Vec<(String, Vec<u64>, String)> = Vec::new();
    for line in missing {
        match parts(line) {
            Some((variant, seed, why)) => match out.last_mut() {
                Some((v, seeds, w)) if v == variant && w == why => seeds.push(seed),
                _ => out.push((variant.to_string(), vec![seed], why.to_string())),
            },
            None => out.push((line.clone(), vec![], String::new())),
        }
    }
    out.into_iter()
        .map(|(variant, seeds, why)| match seeds.as_slice() {
            [] => variant,
            seeds => format!("{variant}/{}: {why}", seed_list(seeds)),
        })
        .collect()
}

/// `seed-3`; `seed-1 to seed-5` for a run of consecutive seeds; else each named.
fn seed_list(seeds: &[u64]) -> String {
    let consecutive = seeds.windows(2).all(|w| w[1] == w[0] + 1);
    match seeds {
        [one] => format!("seed-{one}"),
        [first, .., last] if consecutive => format!("seed-{first} to seed-{last}"),
        _ => {
            let named: Vec<String> = seeds.iter().map(|s| format!("seed-{s}")).collect();
            named.join(", ")
        }
    }
}

/// How many runs each environment misses, in order of first appearance, over every
/// runs directory of a merged report (whose lines come a directory after another, so
/// that one environment's lines are apart); lines of another form are not counted.
pub(super) fn per_environment(missing: &[String]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for (variant, _, _) in missing.iter().filter_map(|l| parts(l)) {
        let env = Path::new(variant)
            .parent()
            .and_then(Path::file_name)
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match out.iter_mut().find(|(e, _)| *e == env) {
            Some((_, n)) => *n += 1,
            None => out.push((env, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_runs_are_grouped_by_variant_and_reason() {
        let lines: Vec<String> = [
            "runs/s/minatar_freeway/b32-none/seed-1: not finished",
            "runs/s/minatar_freeway/b32-none/seed-2: not finished",
            "runs/s/minatar_freeway/b32-none/seed-3: not finished",
            "runs/s/minatar_freeway/b4-none/seed-1: not finished",
            "runs/s/minatar_freeway/b4-none/seed-2: runs/s/minatar_freeway/b4-none/seed-2/result.json is not a run result",
            "runs/s/minatar_freeway/b4-none/seed-4: not finished",
            "runs/s/minatar_freeway/b4-none/seed-5: not finished",
            "runs/s/minatar_seaquest/b1-none/seed-2: not finished",
            "runs/s/minatar_seaquest/b1-none/seed-4: not finished",
            "a line of another form",
            // A second runs directory of a merged report: counted with the first's.
            "runs/t/minatar_freeway/b1-online-none/seed-3: not finished",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            grouped(&lines),
            [
                "runs/s/minatar_freeway/b32-none/seed-1 to seed-3: not finished",
                "runs/s/minatar_freeway/b4-none/seed-1: not finished",
                "runs/s/minatar_freeway/b4-none/seed-2: runs/s/minatar_freeway/b4-none/seed-2/result.json is not a run result",
                "runs/s/minatar_freeway/b4-none/seed-4 to seed-5: not finished",
                "runs/s/minatar_seaquest/b1-none/seed-2, seed-4: not finished",
                "a line of another form",
                "runs/t/minatar_freeway/b1-online-none/seed-3: not finished",
            ]
        );
        assert_eq!(
            per_environment(&lines),
            [
                ("minatar_freeway".to_string(), 8),
                ("minatar_seaquest".to_string(), 2)
            ]
        );
    }
}
