"""What a sweep found: per run, per cell, and the files that say it.

    results = {run.label: read_result(run.dir, sweep.target) for run in finished}
    cells = summarize(sweep, results)
    print(format_table(cells, sweep.target))
    write_summary(root, sweep, cells)      # summary.csv, summary.json, report.html (+ PNGs)

Per run (:func:`read_result`, from its ``metrics.jsonl``): the held-out accuracy ``val/acc``
(mean@k over eval.n_prompts held-out prompts) at each validation, its final value (the last
validation, after the last step) and its best; and the first validation that reached the
sweep's target, with the step, the samples generated up to that step (``batch/generated_samples``
summed) and the training time up to it (``timing_s/step`` + ``timing_s/testing`` summed: steps
and validations, not start-up, checkpoints or time lost to restarts).

Per cell (:func:`summarize`, over the seeds whose runs finished), with
:mod:`reasonrl.experiments.stats`: the mean of the final and of the best accuracy with their
95% t-intervals; the mean paired difference of the final accuracy to the baseline cell over
the seeds both finished, with its 95% paired percentile bootstrap interval, and the verdict
(and, where the sweep file states what it ``expect``s, whether the cell reproduced it);
how many seeds reached the target, and the mean steps, samples and seconds of those that did;
and the mean curve with its 95% t-interval band at each validation step every seed has.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from reasonrl.experiments import stats
from reasonrl.experiments.sweep import Cell, Sweep
from reasonrl.metrics import read_jsonl, write_atomic
from reasonrl.report import _HEAD, _fit, _fmt_duration, _table

LEVEL = 0.95
"""The confidence level of every interval of the summary."""

METRIC = "val/acc"
"""The held-out accuracy a sweep compares: mean@k over the validation prompts."""


@dataclass(frozen=True)
class RunResult:
    """One finished run, from its metrics.jsonl."""

    curve: list[tuple[int, float]]
    """(step, val/acc) of every validation."""
    final: float
    best: float
    to_target: tuple[int, float, float] | None
    """(step, samples, seconds) of the first validation at or above the target; None: never."""


def read_result(run_dir: Path, target: float | None) -> RunResult | None:
    """The RunResult of ``run_dir``; None when its metrics.jsonl has no held-out accuracy."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = read_jsonl(path) if path.is_file() else []
    samples = seconds = 0.0
    points = []
    for row in sorted(rows, key=lambda r: r["step"]):
        samples += row.get("batch/generated_samples", 0.0)
        seconds += row.get("timing_s/step", 0.0) + row.get("timing_s/testing", 0.0)
        if row.get(METRIC) is not None and math.isfinite(row[METRIC]):
            points.append((row[METRIC], row["step"], samples, seconds))
    if not points:
        return None
    reached = stats.first_reaching(points, target) if target is not None else None
    return RunResult([(step, acc) for acc, step, _, _ in points], points[-1][0], max(p[0] for p in points),
                     (int(reached[0]), reached[1], reached[2]) if reached else None)


@dataclass(frozen=True)
class CellSummary:
    """One cell's row of the summary (None where there is too little to say)."""

    name: str
    settings: dict[str, Any]
    seeds: list[int]
    """The seeds whose runs finished (the values below are over these)."""
    finals: list[float]
    """The final val/acc of each of those seeds, in their order."""
    final_mean: float | None
    final_lo: float | None
    final_hi: float | None
    best_mean: float | None
    best_lo: float | None
    best_hi: float | None
    diff: float | None
    """Mean of (this cell's final val/acc − the baseline's) over the seeds both finished."""
    diff_lo: float | None
    diff_hi: float | None
    diff_seeds: int
    verdict: str
    finding: str | None
    """Against the sweep's ``expect``: reproduced, not reproduced or inconclusive; None for the
    baseline or without an expectation (:func:`reasonrl.experiments.stats.finding`)."""
    reached: int
    """Seeds that reached the target."""
    steps_to_target: float | None
    samples_to_target: float | None
    seconds_to_target: float | None
    """Means over the seeds that reached the target."""
    curve: list[dict[str, float | None]]
    """{step, mean, lo, hi} at each validation step every seed of the cell has."""


def summarize(sweep: Sweep, results: dict[tuple[str, int], RunResult]) -> list[CellSummary]:
    """The summary of every cell of ``sweep`` from ``results`` {(cell name, seed): RunResult}
    of the finished runs (see the module docstring)."""
    base = {seed: results[(sweep.baseline.name, seed)].final for seed in sweep.seeds
            if (sweep.baseline.name, seed) in results}
    return [_cell(sweep, cell, results, base) for cell in sweep.cells]


def _cell(sweep: Sweep, cell: Cell, results: dict[tuple[str, int], RunResult], base: dict[int, float]) -> CellSummary:
    runs = {seed: results[(cell.name, seed)] for seed in sweep.seeds if (cell.name, seed) in results}
    finals = [r.final for r in runs.values()]
    final = stats.t_interval(finals, LEVEL) if finals else (None, None, None)
    best = stats.t_interval([r.best for r in runs.values()], LEVEL) if runs else (None, None, None)
    is_baseline = cell.name == sweep.baseline.name
    paired = [seed for seed in runs if seed in base]
    diff: tuple[float | None, float | None, float | None] = (None, None, None)
    if paired and not is_baseline:
        diff = stats.paired_bootstrap([runs[s].final for s in paired], [base[s] for s in paired], LEVEL)
    reached = [r.to_target for r in runs.values() if r.to_target is not None]

    def mean_of(i: int) -> float | None:
        return stats.mean([t[i] for t in reached]) if reached else None

    verdict = stats.verdict(diff[1], diff[2], is_baseline)
    found = stats.finding(verdict, sweep.expect, diff[1], diff[2], sweep.margin)
    return CellSummary(cell.name, cell.settings, list(runs), finals, *final, *best, *diff, len(paired),
                       verdict, found, len(reached), mean_of(0), mean_of(1), mean_of(2), _curve(list(runs.values())))


def _curve(runs: list[RunResult]) -> list[dict[str, float | None]]:
    """The mean val/acc and its t-interval at each step that every run validated at."""
    if not runs:
        return []
    by_run = [dict(r.curve) for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in by_run)))
    out = []
    for step in steps:
        m, lo, hi = stats.t_interval([c[step] for c in by_run], LEVEL)
        out.append({"step": step, "mean": m, "lo": lo, "hi": hi})
    return out


# --- text ------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _interval(mean: float | None, lo: float | None, hi: float | None, signed: bool = False) -> str:
    if mean is None:
        return "–"
    m = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return m if lo is None else f"{m} [{lo:+.3f}, {hi:+.3f}]" if signed else f"{m} [{lo:.3f}, {hi:.3f}]"


def _to_target(c: CellSummary) -> str:
    if c.reached == 0:
        return f"not reached (0/{len(c.seeds)})" if c.seeds else "–"
    return (f"{c.steps_to_target:.1f} / {c.samples_to_target:.0f} / {_fmt_duration(c.seconds_to_target)} "
            f"({c.reached}/{len(c.seeds)})")


def table_rows(cells: list[CellSummary], target: float | None) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the summary table the terminal and the report show."""
    header = ["cell", "seeds", "final val/acc [95% t]", "best val/acc [95% t]",
              "diff to baseline [95% paired bootstrap]", "verdict"]
    expected = any(c.finding is not None for c in cells)
    if expected:
        header.append("finding")
    if target is not None:
        header.append(f"to val/acc {target:g}: steps / samples / h:mm:ss (seeds)")
    rows = []
    for c in cells:
        row = [c.name, str(len(c.seeds)), _interval(c.final_mean, c.final_lo, c.final_hi),
               _interval(c.best_mean, c.best_lo, c.best_hi),
               "–" if c.verdict == "baseline" else _interval(c.diff, c.diff_lo, c.diff_hi, signed=True)
               + (f" ({c.diff_seeds} seed{'s' if c.diff_seeds != 1 else ''})" if c.diff is not None else ""),
               c.verdict if c.verdict != "no difference" or c.diff_lo is not None else "– (too few seeds)"]
        if expected:
            row.append(c.finding or "–")
        if target is not None:
            row.append(_to_target(c))
        rows.append(row)
    return header, rows


def format_table(cells: list[CellSummary], target: float | None) -> str:
    """The summary as an aligned text table."""
    header, rows = table_rows(cells, target)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


CSV_FIELDS = ("cell", "seeds", "final_mean", "final_lo", "final_hi", "best_mean", "best_lo", "best_hi", "diff",
              "diff_lo", "diff_hi", "diff_seeds", "verdict", "finding", "reached", "steps_to_target", "samples_to_target",
              "seconds_to_target")
"""The columns of summary.csv after one column per swept key."""


def summary_csv(cells: list[CellSummary]) -> str:
    """summary.csv: one row a cell; a column per key any cell sets (its value as JSON, empty
    where the cell does not set it), then CSV_FIELDS (``seeds``: their count; empty: none)."""
    keys = list(dict.fromkeys(k for c in cells for k in c.settings))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*keys, *CSV_FIELDS])
    for c in cells:
        values = asdict(c) | {"cell": c.name, "seeds": len(c.seeds)}
        writer.writerow([json.dumps(c.settings[k]) if k in c.settings else "" for k in keys]
                        + ["" if values[f] is None else values[f] for f in CSV_FIELDS])
    return out.getvalue()


def summary_json(sweep: Sweep, cells: list[CellSummary]) -> dict[str, Any]:
    """summary.json: the sweep's target, level, intervals and baseline, and ``cells``."""
    return {
        "metric": METRIC,
        "level": LEVEL,
        "intervals": {"final": "t-interval over seeds", "best": "t-interval over seeds",
                      "diff": "paired percentile bootstrap over seeds (exact up to 8 seeds)"},
        "target": sweep.target,
        "expect": sweep.expect,
        "margin": sweep.margin,
        "baseline": sweep.baseline.settings,
        "seeds": list(sweep.seeds),
        "cells": [asdict(c) for c in cells],
    }


# --- report ---------------------------------------------------------------------------


def curves_figure(cells: list[CellSummary], target: float | None) -> Figure | None:
    """Every cell's mean val/acc curve with its 95% band, on one axes; None without curves."""
    drawn = [c for c in cells if c.curve]
    if not drawn:
        return None
    legend_in = 0.2 + 0.2 * (len(drawn) + (target is not None))  # one line a cell (and the target), below the axes
    height = 5.5 + legend_in
    fig = Figure(figsize=(9, height))
    ax = fig.subplots()
    for index, c in enumerate(drawn):
        colour = f"C{index % 10}"
        steps = [p["step"] for p in c.curve]
        ax.plot(steps, [p["mean"] for p in c.curve], color=colour, marker="o", markersize=3,
                label=f"{c.name} ({len(c.seeds)} seeds)")
        band = [p for p in c.curve if p["lo"] is not None]
        if band:
            ax.fill_between([p["step"] for p in band], [max(0.0, p["lo"]) for p in band],
                            [min(1.0, p["hi"]) for p in band], color=colour, alpha=0.15, linewidth=0)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set(title="held-out accuracy (val/acc): mean over seeds; band: 95% t-interval, within [0, 1]", xlabel="step",
           ylabel="val/acc", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _fit(fig, 1, 1)
    fig.subplots_adjust(bottom=(0.6 + legend_in) / height)  # the legend below the axes, clear of every band
    fig.legend(*ax.get_legend_handles_labels(), fontsize="small", loc="lower left", bbox_to_anchor=(0.1, 0.05 / height))
    return fig


def diffs_figure(cells: list[CellSummary]) -> Figure | None:
    """Each cell's paired difference to the baseline with its 95% interval, around 0; None
    when no cell has one."""
    drawn = [c for c in cells if c.diff is not None]
    if not drawn:
        return None
    height = 1.5 + 0.4 * len(drawn)
    fig = Figure(figsize=(10, height))
    ax = fig.subplots()
    for y, c in enumerate(reversed(drawn)):
        colour = {"better": "C2", "worse": "C3"}.get(c.verdict, "C7")
        if c.diff_lo is not None:
            ax.plot([c.diff_lo, c.diff_hi], [y, y], color=colour, linewidth=2)
        ax.plot([c.diff], [y], "o", color=colour)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(range(len(drawn)), [c.name for c in reversed(drawn)], fontsize="small")
    ax.set(xlabel="difference", ylim=(-0.5, len(drawn) - 0.5))
    fig.suptitle("final val/acc minus the baseline's (same seeds): mean and 95% paired bootstrap interval")
    ax.grid(alpha=0.3, axis="x")
    names = max(len(c.name) for c in drawn)  # the tick labels: about 0.065 inch a character
    fig.subplots_adjust(left=min(0.6, (0.3 + 0.065 * names) / 10), right=0.97, bottom=0.6 / height,
                        top=1 - 0.45 / height)
    return fig


_PAGE = _HEAD + """<body>
<h1>{title}</h1>
<p>{intro}</p>
{summary}
<h2>Plots</h2>
{images}
<h2>Final val/acc per seed</h2>
{per_seed}
<h2>Sweep file</h2>
<pre>{sweep}</pre>
</body>
</html>
"""


def report_html(sweep: Sweep, cells: list[CellSummary], images: list[str]) -> str:
    """report.html: the summary table, the plots, every run's final accuracy and the sweep."""
    header, rows = table_rows(cells, sweep.target)
    per_seed = [[c.name, *(_num(dict(zip(c.seeds, c.finals)).get(s)) for s in sweep.seeds)] for c in cells]
    intro = (f"{len(cells)} cells x {len(sweep.seeds)} seeds of {sweep.recipe.name}; baseline "
             f"{sweep.baseline.name}. Intervals at 95%: the final and best accuracy over seeds by Student's t, the "
             "difference to the baseline (final val/acc, same seeds) by the paired percentile bootstrap; the verdict "
             "is better or worse when that interval excludes 0.")
    return _PAGE.format(
        title=html.escape(f"reasonrl sweep: {sweep.source}"),
        intro=html.escape(intro),
        summary=_table(header, rows),
        images="\n".join(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">' for name in images),
        per_seed=_table(["cell", *(f"seed {s}" for s in sweep.seeds)], per_seed),
        sweep=html.escape(json.dumps(sweep.to_dict(), indent=2)),
    )


def write_summary(root: Path, sweep: Sweep, cells: list[CellSummary]) -> list[Path]:
    """Write summary.csv, summary.json, report.html and its PNGs (curves.png, diffs.png when
    there is a difference to draw) into ``root``, each replaced atomically; return the paths."""
    root = Path(root)
    write_atomic(root / "summary.csv", summary_csv(cells))
    write_atomic(root / "summary.json", json.dumps(summary_json(sweep, cells), indent=2) + "\n")
    images = []
    for name, fig in (("curves.png", curves_figure(cells, sweep.target)), ("diffs.png", diffs_figure(cells))):
        if fig is not None:
            fig.savefig(root / name, format="png", dpi=100)
            images.append(name)
    write_atomic(root / "report.html", report_html(sweep, cells, images))
    return [root / "summary.csv", root / "summary.json", root / "report.html", *(root / n for n in images)]
