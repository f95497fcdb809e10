"""A run report: PNG plots of one or several runs' ``metrics.jsonl`` and a ``report.html``.

    write_report(["runs/dapo", "runs/grpo"])   # -> runs/report/report.html

Every plot puts all runs on the same axes (x = step, one colour per run); a plot whose
metrics appear in no run is not written. Validation metrics exist only on evaluation
steps, so each series is drawn through the steps that have it.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

from reasonrl.errors import InputError, InputNotFound
from reasonrl.metrics import read_jsonl
from reasonrl.resilience.ettr import effective_time, step_seconds

_PASS_AT_K = re.compile(r"^val/pass@\d+$")


@dataclass
class Run:
    """One run directory's label, metric rows and, with an event log, its ETTR figures
    (:func:`~reasonrl.resilience.ettr.effective_time`, as ``summary.json`` has them)."""

    label: str
    rows: list[dict[str, Any]]
    figures: dict[str, Any] | None = None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The steps that have ``key`` and its values there."""
        points = [(row["step"], row[key]) for row in self.rows if row.get(key) is not None]
        return [s for s, _ in points], [v for _, v in points]

    def keys(self) -> set[str]:
        """Every metric name appearing in some row."""
        return {key for row in self.rows for key in row}


def load_run(run_dir: str | Path) -> Run:
    """Read ``run_dir/metrics.jsonl`` and label the run ``"<dir name> (<algo.adv_estimator>)"``
    (just the directory name when ``config.yaml`` is absent or lacks the key)."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise InputNotFound(f"run directory {run_dir} does not exist")
    if not metrics.is_file():
        raise InputNotFound(f"run directory {run_dir} has no metrics.jsonl ({metrics} not found)")
    rows = read_jsonl(metrics)
    if not rows:
        raise InputError(f"{metrics} has no metric rows")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row.get("step"), int):
            raise InputError(f"{metrics}: row {number} has step={row.get('step')!r}, expected an integer")
    label = run_dir.resolve().name
    estimator = _adv_estimator(run_dir / "config.yaml")
    if estimator:
        label = f"{label} ({estimator})"
    events = run_dir / "events.jsonl"
    figures = effective_time(read_jsonl(events), step_seconds(rows)) if events.is_file() else None
    return Run(label, rows, figures)


def _adv_estimator(config_path: Path) -> str | None:
    if not config_path.is_file():
        return None
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise InputError(f"{config_path}: not valid YAML ({err})") from err
    algo = config.get("algo") if isinstance(config, dict) else None
    return algo.get("adv_estimator") if isinstance(algo, dict) else None


def _line_plot(
    runs: list[Run], path: Path, title: str, ylabel: str, styles: list[tuple[str, dict[str, Any]]]
) -> bool:
    """Plot each (metric, line style) of ``styles`` for every run; write ``path`` if any data."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    drawn = False
    for index, run in enumerate(runs):
        color = f"C{index % 10}"
        for key, style in styles:
            steps, values = run.series(key)
            if steps:
                ax.plot(steps, values, color=color, label=f"{run.label}: {key}", **style)
                drawn = True
    if not drawn:
        return False
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return True


def _timing_plot(runs: list[Run], path: Path) -> bool:
    """Stacked bars of seconds per stage (every ``timing_s/*`` but ``timing_s/step``), one subplot per run."""
    timed_runs = []
    for run in runs:
        stages = sorted(k for k in run.keys() if k.startswith("timing_s/") and k != "timing_s/step")
        rows = [row for row in run.rows if any(row.get(k) is not None for k in stages)]
        if rows:
            timed_runs.append((run, stages, rows))
    if not timed_runs:
        return False
    fig = Figure(figsize=(8, 3.5 * len(timed_runs)))
    axes = fig.subplots(len(timed_runs), 1, squeeze=False)[:, 0]
    for ax, (run, stages, rows) in zip(axes, timed_runs):
        steps = [row["step"] for row in rows]
        bottom = [0.0] * len(rows)
        for key in stages:
            seconds = [row.get(key) or 0.0 for row in rows]
            ax.bar(steps, seconds, bottom=bottom, width=0.8, label=key.removeprefix("timing_s/"))
            bottom = [b + s for b, s in zip(bottom, seconds)]
        ax.set(title=f"time per stage: {run.label}", xlabel="step", ylabel="seconds")
        ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return True


def _write_plots(runs: list[Run], out_dir: Path) -> list[str]:
    """Write every plot that has data; return the file names written."""
    pass_at_k = sorted({k for run in runs for k in run.keys() if _PASS_AT_K.match(k)})
    plots = {
        "reward.png": ("reward (critic/score/mean)", "score", [("critic/score/mean", {})]),
        "accuracy.png": (
            "accuracy (held-out val; dashed: greedy, dotted: pass@k, faint: train)",
            "accuracy",
            [("val/acc", {"marker": "o", "markersize": 3}), ("val/acc_greedy", {"linestyle": "--"})]
            + [(k, {"linestyle": ":"}) for k in pass_at_k]
            + [("train/acc", {"alpha": 0.3, "linewidth": 1})],
        ),
        "response_length.png": ("response length (tokens)", "tokens", [("response_length/mean", {})]),
        "entropy.png": ("policy entropy", "nats / token", [("actor/entropy", {})]),
        "clipfrac.png": (
            "PPO clip fraction (dashed: lower clip)",
            "fraction of tokens",
            [("actor/pg_clipfrac", {}), ("actor/pg_clipfrac_lower", {"linestyle": "--"})],
        ),
    }
    written = [
        name for name, (title, ylabel, styles) in plots.items() if _line_plot(runs, out_dir / name, title, ylabel, styles)
    ]
    if _timing_plot(runs, out_dir / "timing.png"):
        written.append("timing.png")
    if _line_plot(runs, out_dir / "ettr.png", "effective training time ratio", "ETTR", [("ettr", {})]):
        written.append("ettr.png")
    recovery = [("time_lost_s", {}), ("mttr_s", {"linestyle": "--"})]
    if _line_plot(runs, out_dir / "recovery.png", "time lost to faults (dashed: mean time to recover)", "seconds", recovery):
        written.append("recovery.png")
    return written


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return _fmt(seconds)
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def summary(run: Run) -> dict[str, str]:
    """The summary-table row of a run, formatted for display."""
    _, val = run.series("val/acc")
    _, greedy = run.series("val/acc_greedy")
    _, score = run.series("critic/score/mean")
    _, wall = run.series("time")
    finite_val = [v for v in val if math.isfinite(v)]
    figures = run.figures
    return {
        "run": run.label,
        "steps": str(run.rows[-1]["step"]),
        "val/acc first": _fmt(val[0] if val else None),
        "val/acc last": _fmt(val[-1] if val else None),
        "val/acc best": _fmt(max(finite_val) if finite_val else None),
        "val/acc_greedy first": _fmt(greedy[0] if greedy else None),
        "val/acc_greedy last": _fmt(greedy[-1] if greedy else None),
        "final critic/score/mean": _fmt(score[-1] if score else None),
        "ETTR": _fmt(figures["ettr"] if figures else run.rows[-1].get("ettr")),
        "time lost (s)": _fmt(figures["lost_s"] if figures else run.rows[-1].get("time_lost_s")),
        "MTTR (s)": _fmt(figures["mttr_s"] if figures else run.rows[-1].get("mttr_s")),
        "wall time (h:mm:ss)": _fmt_duration(run.rows[-1].get("time")),
    }


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #bbb; padding: 0.3em 0.7em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
img {{ max-width: 100%; display: block; margin-bottom: 1.5em; }}
</style>
</head>
<body>
<h1>{title}</h1>
<table>
{table}
</table>
{images}
</body>
</html>
"""


def _html(runs: list[Run], images: list[str]) -> str:
    rows = [summary(run) for run in runs]
    header = "<tr>" + "".join(f"<th>{html.escape(k)}</th>" for k in rows[0]) + "</tr>"
    body = ["<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row.values()) + "</tr>" for row in rows]
    pictures = "\n".join(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">' for name in images)
    title = "reasonrl report: " + ", ".join(run.label for run in runs)
    return _PAGE.format(title=html.escape(title), table="\n".join([header, *body]), images=pictures)


def write_report(run_dirs: list[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write the PNG plots and ``report.html`` for ``run_dirs``; return the HTML path.

    ``out_dir`` defaults to the run directory for one run and to ``<first run dir>/../report``
    for several. Raises FileNotFoundError for a missing run directory or metrics.jsonl and
    ValueError for a metrics.jsonl without rows.
    """
    if not run_dirs:
        raise InputError("write_report: expected at least one run directory, got none")
    runs = [load_run(d) for d in run_dirs]
    if out_dir is None:
        first = Path(run_dirs[0])
        out_dir = first if len(run_dirs) == 1 else first.resolve().parent / "report"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images = _write_plots(runs, out_dir)
    path = out_dir / "report.html"
    path.write_text(_html(runs, images), encoding="utf-8")
    return path
