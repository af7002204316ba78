#!/usr/bin/env python3
"""Packs a comparison's finished runs into a small archive that a fresh checkout can
merge and go on from (`normrl compare` counts a run whose folder holds only its
result.json as finished; `normrl report` reads it).

    scripts/pack-results.py runs/minatar-study-v1 docs/results/minatar-study-v1/runs.tar.xz

The plan.json goes with them. Each run's result.json is kept whole except its training curve (one point per
episode, tens of thousands in a 500k-frame MinAtar run), which is binned: one point
per --bin environment steps, at the bin's last episode's end, holding the mean return
of the episodes that ended in it. The evaluation curve, the diagnostics and the
summary's numbers are the run's own. To go on from the archive:

    mkdir -p runs/minatar-study-v1 && tar -xJf docs/results/minatar-study-v1/runs.tar.xz -C runs/minatar-study-v1

With --machines FILE --machine NAME, each packed run that FILE does not name yet is
added to it as `NAME <comparison>/<run>`: which CPU trained which run, for a study that
goes on over several machines (a binary's floating-point sums can differ between CPUs).
"""
import argparse
import io
import json
import lzma
import pathlib
import sys
import tarfile


def binned(curve, width):
    """(step, return) points averaged per `width` steps."""
    bins = {}
    for step, ret in curve:
        key = (step - 1) // width
        last, total, n = bins.get(key, (step, 0.0, 0))
        bins[key] = (max(last, step), total + ret, n + 1)
    return [[last, total / n] for _, (last, total, n) in sorted(bins.items())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=pathlib.Path)
    parser.add_argument("archive", type=pathlib.Path)
    parser.add_argument("--bin", type=int, default=1000)
    parser.add_argument("--machines", type=pathlib.Path)
    parser.add_argument("--machine")
    args = parser.parse_args()
    if (args.machines is None) != (args.machine is None):
        sys.exit("--machines and --machine go together")
    results = sorted(args.runs.rglob("result.json"))
    # A run moved aside as damaged (`<dir>.damaged-<secs>`) is not a result.
    results = [r for r in results if ".damaged-" not in str(r)]
    if not results:
        sys.exit(f"no result.json under {args.runs}")
    args.archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.archive.with_name(args.archive.name + ".tmp")
    with lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz:
        with tarfile.open(fileobj=xz, mode="w") as tar:
            for path in results:
                result = json.loads(path.read_text())
                summary = result["summary"]
                summary["train_curve"] = binned(summary["train_curve"], args.bin)
                data = json.dumps(result, separators=(",", ":")).encode()
                info = tarfile.TarInfo(str(path.relative_to(args.runs)))
                info.size = len(data)
                info.mtime = int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
            # The plan, so that `normrl status` reads the unpacked folder as the study.
            plan = args.runs / "plan.json"
            if plan.exists():
                tar.add(plan, arcname="plan.json")
    tmp.replace(args.archive)
    if args.machines:
        record_machine(args.machines, args.machine, args.runs, results)
    size = args.archive.stat().st_size
    print(f"{len(results)} runs into {args.archive} ({size / 1e6:.2f} MB)")


def record_machine(machines, machine, runs, results):
    """Adds `machine <comparison>/<run>` to `machines` for each run it does not name."""
    lines = machines.read_text().splitlines() if machines.exists() else []
    named = {line.split(" ", 1)[1] for line in lines if line and not line.startswith("#")}
    comparison = runs.resolve().name
    new = []
    for path in results:
        run = f"{comparison}/{path.parent.relative_to(runs)}"
        if run not in named:
            new.append(f"{machine} {run}")
    tmp = machines.with_name(machines.name + ".tmp")
    tmp.write_text("\n".join(lines + new) + "\n")
    tmp.replace(machines)
    print(f"{len(new)} runs recorded as trained on {machine} in {machines}")


if __name__ == "__main__":
    main()
