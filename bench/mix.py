"""Samples to the baseline's best: how many generated samples each cell of a finished sweep
needed to reach the best held-out accuracy its baseline run reached, seed by seed.

    python bench/mix.py runs/mix          # a directory `reasonrl sweep sweeps/mix.yaml --dir runs/mix` wrote

For each seed: B = the baseline run's best val/acc over its validations, S_base = the samples it
had generated (``batch/generated_samples`` summed up to that validation's step) when it first
reached B, and S_cell = the samples the cell's run of the same seed had generated when its
val/acc first reached B (None: never). Per cell: the ratio S_cell / S_base of each seed, their
mean, the seeds that reached B at all, and the mean of S_cell - S_base over the seeds that did
with its 95% paired percentile bootstrap interval (reasonrl.experiments.stats); issue 27's
criterion for data.mix=adaptive is every seed reaching B, a mean ratio of at most 0.7 and an
interval below 0. The same figures for the sweep's fixed ``target`` accuracy instead of B are
under ``to_target`` (seeds where the baseline never reached it are left out). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reasonrl.experiments import stats
from reasonrl.experiments.sweep import read_sweep
from reasonrl.metrics import read_jsonl


def curve(run_dir: Path) -> list[tuple[float, int, float]]:
    """(val/acc, step, samples generated up to that step) of every validation of a run."""
    samples, points = 0.0, []
    for row in sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda r: r["step"]):
        samples += row.get("batch/generated_samples", 0.0)
        if row.get("val/acc") is not None:
            points.append((row["val/acc"], row["step"], samples))
    return points


def samples_to(points: list[tuple[float, int, float]], level: float) -> float | None:
    """The samples at the first validation at or above ``level``; None: never."""
    reached = stats.first_reaching(points, level)
    return None if reached is None else reached[1]


def paired(seeds: list[dict]) -> dict:
    """Per cell: the seeds whose cell run reached the level, the mean ratio of the samples and the
    mean difference (cell - baseline) with its 95% paired bootstrap interval, over those seeds."""
    reached = [s for s in seeds if s["cell_samples"] is not None]
    diff = (stats.paired_bootstrap([s["cell_samples"] for s in reached], [s["baseline_samples"] for s in reached])
            if reached else (None, None, None))
    return {"seeds": seeds, "reached": len(reached),
            "mean_ratio": stats.mean([s["ratio"] for s in reached]) if reached else None,
            "diff_samples": diff[0], "diff_lo": diff[1], "diff_hi": diff[2]}


def compare(root: Path) -> dict:
    sweep = read_sweep(root / "sweep.json")
    dirs = {(run.cell.name, run.seed): run.dir for run in sweep.runs(root)}
    base = sweep.baseline
    out = {"sweep": str(root), "baseline": base.name, "cells": []}
    for cell in sweep.cells:
        if cell.name == base.name:
            continue
        seeds, at_target = [], []
        for seed in sweep.seeds:
            b_dir, c_dir = dirs[(base.name, seed)], dirs[(cell.name, seed)]
            if not ((b_dir / "metrics.jsonl").is_file() and (c_dir / "metrics.jsonl").is_file()):
                continue
            b_points, c_points = curve(b_dir), curve(c_dir)
            best = max(p[0] for p in b_points)
            s_base, s_cell = samples_to(b_points, best), samples_to(c_points, best)
            seeds.append({"seed": seed, "baseline_best": best, "baseline_samples": s_base, "cell_samples": s_cell,
                          "cell_best": max(p[0] for p in c_points),
                          "ratio": None if s_cell is None else s_cell / s_base})
            t_base = samples_to(b_points, sweep.target) if sweep.target is not None else None
            if t_base is not None:
                t_cell = samples_to(c_points, sweep.target)
                at_target.append({"seed": seed, "baseline_samples": t_base, "cell_samples": t_cell,
                                  "ratio": None if t_cell is None else t_cell / t_base})
        out["cells"].append({"cell": cell.name, **paired(seeds),
                             "to_target": {"target": sweep.target, **paired(at_target)}})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args()
    print(json.dumps(compare(args.sweep_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
