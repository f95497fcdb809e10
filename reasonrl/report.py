"""A run report: plots, config differences and events of one or several runs, in ``report.html``.

    write_report(["runs/dapo", "runs/grpo"])   # -> runs/report/report.html

Each run directory needs ``metrics.jsonl``; its ``config.yaml`` (the resolved config the
trainer writes) and ``events.jsonl`` (faults, restarts, guards) are shown when present, and
their absence is said in the page. ``report.html`` holds, in this order:

- a summary table, one row per run: steps, held-out accuracy (first, last, best, greedy),
  final reward, ETTR, time lost to faults, MTTR, the forecast plateau and step to eval.target
  (:func:`run_forecast`), wall time;
- with two or more configs, their differences: one row per dotted key (``algo.eps_high``)
  whose values differ, one column per run. Keys that only change where and how a run logs
  (``run.dir``, ``run.loggers``, ... :data:`reasonrl.config.LOGGING_KEYS`) are in a separate, folded table;
- the plots, PNG files beside the HTML referenced by relative path: reward, accuracy
  (sampled, greedy, pass@k, train), accuracy per data source (``val/acc/<source>``, one panel
  each), the forecast (``forecast.png``: :func:`forecast_figure`), the adaptive data mix
  (``data/mix/<source>``: each source's sampling weight over the steps, its accuracy average
  ``data/mix_acc/<source>`` dashed, one panel a source) and the curriculum
  (``data/curriculum/*``: prompts retired and returned per step, prompts out of the pool),
  response length and its clip ratio, entropy, PPO clip fractions, policy loss, KL
  (``actor/ppo_kl``, and ``actor/kl_loss`` with the KL loss on), the sampler/trainer log-prob gap
  (``rollout/logprob_diff_mean``, ``rollout/logprob_kl``: bf16 or vLLM sampling), gradient norm, learning
  rate, dynamic sampling counters (``batch/*``), throughput, tokens and peak memory (``perf/throughput``,
  ``perf/total_num_tokens``, ``perf/max_memory_gb``), ETTR, time lost to faults, and the seconds of each stage;
- each run's forecast in words (the fitted curve, the plateau, val/acc at the last step, the
  step to eval.target, with their intervals), or why it has none (too few validations);
- each run's events: step, kind and a short detail of every line of ``events.jsonl``;
- a few validation samples per validation step (``samples.jsonl``, when the run kept them):
  prompt, response, extracted answer, ground truth and score, the wrong ones first, folded;
- each run's ``config.yaml``, folded.

Every line plot puts all runs on the same axes (x = step, integer ticks; one colour per run),
the stage timings are a chart per run (:func:`timing_figure`: the stages' seconds stacked, the
waits and in-flight seconds as lines, the legend beside the axes), and a plot whose metrics
appear in no run is not written. Validation metrics exist only on
evaluation steps, so each series is drawn through the steps that have it. On the line plots
the incidents of a run (:data:`MARKED_KINDS`) are dashed vertical lines in its colour at
their step, with their kinds written beside the line. Every text from the run directories
is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from reasonrl.config import LOGGING_KEYS, flatten
from reasonrl.errors import InputError, InputNotFound, WriteError
from reasonrl.experiments.forecast import Forecast, evaluations, forecast, format_step
from reasonrl.metrics import STEP_STAGES, read_jsonl, write_atomic
from reasonrl.resilience.ettr import INCIDENT_KINDS, effective_time, step_seconds

_PASS_AT_K = re.compile(r"^val/pass@\d+$")

MARKED_KINDS = INCIDENT_KINDS | {"fatal", "recovered", "slowdown_recovered", "fault_injected"}
"""Event kinds drawn on the plots: the incidents (:data:`~reasonrl.resilience.ettr.INCIDENT_KINDS`:
the supervisor's failures, each followed by a restart unless it ``gave_up``, guard verdicts,
fail-slow workers and ranks, failed checkpoints, rewards and rollout workers), a ``fatal``
stop, the ``recovered`` restarts and slowdowns, and injected faults; not the run's course
(starts, checkpoints, ``rollout_started``, resizes)."""

_DETAIL_CHARS = 200


@dataclass
class Run:
    """One run directory: its label, metric rows, config and events.

    ``config`` maps the dotted keys of config.yaml to their values and ``config_text`` is the
    file's text (both None without one); ``events`` is None without an events.jsonl.
    ``figures`` are the ETTR figures of :func:`~reasonrl.resilience.ettr.effective_time` when
    there are events, as ``summary.json`` has them."""

    label: str
    rows: list[dict[str, Any]]
    figures: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    config_text: str | None = None
    events: list[dict[str, Any]] | None = None
    samples: dict[int, list[dict[str, Any]]] | None = None
    """{validation step: up to SAMPLES_SHOWN of its sample records}; None without samples.jsonl."""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The steps that have ``key`` and its values there."""
        points = [(row["step"], row[key]) for row in self.rows if row.get(key) is not None]
        return [s for s, _ in points], [v for _, v in points]

    def keys(self) -> set[str]:
        """Every metric name appearing in some row."""
        return {key for row in self.rows for key in row}

    def marked_steps(self) -> dict[int, list[str]]:
        """{step: the distinct kinds, in log order} of the events in :data:`MARKED_KINDS`."""
        marked: dict[int, list[str]] = {}
        for event in self.events or []:
            if event["kind"] in MARKED_KINDS and event["step"] is not None:
                kinds = marked.setdefault(event["step"], [])
                if event["kind"] not in kinds:
                    kinds.append(event["kind"])
        return marked


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory: ``metrics.jsonl`` (required), ``config.yaml`` and ``events.jsonl``
    (each when present). The label is ``"<dir name> (<algo.adv_estimator>)"``, just the
    directory name without the key."""
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
    config_path, events_path = run_dir / "config.yaml", run_dir / "events.jsonl"
    config_text = config_path.read_text(encoding="utf-8") if config_path.is_file() else None
    config = read_config(config_path, config_text) if config_text is not None else None
    events = read_events(events_path) if events_path.is_file() else None
    label = run_dir.resolve().name
    if config and config.get("algo.adv_estimator"):
        label = f"{label} ({config['algo.adv_estimator']})"
    figures = effective_time(events, step_seconds(rows)) if events is not None else None
    samples_path = run_dir / "samples.jsonl"
    samples = validation_samples(read_jsonl(samples_path)) if samples_path.is_file() else None
    return Run(label, rows, figures, config, config_text, events, samples)


SAMPLES_SHOWN = 3
"""Validation samples shown per validation step."""


def validation_samples(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """{step: up to SAMPLES_SHOWN validation records}: each prompt's first sampled (not greedy)
    one, the wrong ones before the right ones, in file order otherwise."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("split") == "val" and r.get("sample") == 0 and not r.get("greedy"):
            by_step.setdefault(r["step"], []).append(r)
    return {step: sorted(rs, key=lambda r: bool(r["correct"]))[:SAMPLES_SHOWN] for step, rs in sorted(by_step.items())}


def read_config(path: Path, text: str) -> dict[str, Any]:
    """The YAML mapping ``text`` of ``path`` as {dotted key: value}, in file order; an
    InputError naming the file and line when it is not valid YAML or not a mapping."""
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark else str(path)
        raise InputError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from err
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise InputError(f"{path}, line 1: expected a mapping of config sections, got {type(tree).__name__}")
    return flatten(tree)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of ``path``; an InputError naming the file and line for an event without a
    string ``kind``, a numeric ``time`` or an integer (or null) ``step``."""
    events = read_jsonl(path)
    lines = [n for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1) if line.strip()]
    for line, event in zip(lines, events):
        if not isinstance(event, dict):
            raise InputError(f"{path}, line {line}: expected a JSON object, got {type(event).__name__}")
        kind, time, step = event.get("kind"), event.get("time"), event.get("step")
        problems = [
            f"{name}={value!r} (expected {expected})"
            for name, value, expected, ok in [
                ("kind", kind, "a string", isinstance(kind, str)),
                ("time", time, "a number", type(time) in (int, float)),
                ("step", step, "an integer or null", step is None or type(step) is int),
            ]
            if not ok
        ]
        if problems:
            raise InputError(f"{path}, line {line}: not an event: " + ", ".join(problems))
    return events


# --- plots ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """One axes of a plot: its title, y label and the (metric, line style) drawn for every run."""

    title: str
    ylabel: str
    lines: list[tuple[str, dict[str, Any]]]


def plot_specs(runs: list[Run]) -> dict[str, list[Panel]]:
    """{PNG file name: its panels} of the line plots, in report order."""
    keys = set().union(*(run.keys() for run in runs))
    pass_at_k = sorted(k for k in keys if _PASS_AT_K.match(k))
    sources = sorted(k for k in keys if k.startswith("val/acc/"))
    mixed = sorted(k.removeprefix("data/mix/") for k in keys if k.startswith("data/mix/"))
    dashed, dotted, dots = {"linestyle": "--"}, {"linestyle": ":"}, {"marker": "o", "markersize": 3}
    return {
        "reward.png": [Panel("reward (critic/score/mean)", "score", [("critic/score/mean", {})])],
        "accuracy.png": [Panel(
            "accuracy (held-out val; dashed: greedy, dotted: pass@k, faint: train)",
            "accuracy",
            [("val/acc", dots), ("val/acc_greedy", dashed)] + [(k, dotted) for k in pass_at_k]
            + [("train/acc", {"alpha": 0.3, "linewidth": 1})],
        )],
        "accuracy_by_source.png": [
            Panel(f"held-out accuracy: {k.removeprefix('val/acc/')}", "accuracy", [(k, dots)]) for k in sources
        ],
        "data_mix.png": [
            Panel(f"sampling weight: {source} (data/mix; dashed: its accuracy average, data/mix_acc)", "weight",
                  [(f"data/mix/{source}", {}), (f"data/mix_acc/{source}", dashed)]) for source in mixed
        ],
        "curriculum.png": [
            Panel("curriculum: prompts retired per step (dashed: returned)", "prompts",
                  [("data/curriculum/retired", {}), ("data/curriculum/returned", dashed)]),
            Panel("prompts out of the pool (data/curriculum/out_of_pool)", "prompts", [("data/curriculum/out_of_pool", {})]),
        ],
        "response_length.png": [
            Panel("response length (response_length/mean)", "tokens", [("response_length/mean", {})]),
            Panel("responses cut at max_new_tokens (response_length/clip_ratio)", "fraction",
                  [("response_length/clip_ratio", {})]),
        ],
        "entropy.png": [Panel("policy entropy", "nats / token", [("actor/entropy", {})])],
        "clipfrac.png": [Panel(
            "PPO clip fraction (dashed: lower clip)",
            "fraction of tokens",
            [("actor/pg_clipfrac", {}), ("actor/pg_clipfrac_lower", dashed)],
        )],
        "policy_loss.png": [Panel("policy loss (actor/pg_loss)", "loss", [("actor/pg_loss", {})])],
        "kl.png": [Panel(
            "KL to the old policy (actor/ppo_kl); dashed: KL loss to the reference",
            "nats / token",
            [("actor/ppo_kl", {}), ("actor/kl_loss", dashed)],
        ), Panel(
            "sampler vs trainer log-probs, same weights (rollout/logprob_diff_mean; dashed: rollout/logprob_kl)",
            "nats / token",
            [("rollout/logprob_diff_mean", {}), ("rollout/logprob_kl", dashed)],
        )],
        "grad_norm.png": [Panel("gradient norm before clipping (actor/grad_norm)", "norm", [("actor/grad_norm", {})])],
        "lr.png": [Panel("learning rate (actor/lr)", "learning rate", [("actor/lr", {})])],
        "dynamic_sampling.png": [
            Panel(
                "dynamic sampling groups: kept; dropped all correct (dashed), all wrong (dotted)",
                "groups per step",
                [("batch/kept_groups", {}), ("batch/dropped_all_correct", dashed), ("batch/dropped_all_wrong", dotted)],
            ),
            Panel("samples generated per kept group", "samples", [("batch/samples_per_kept_group", {})]),
        ],
        "throughput.png": [
            Panel("throughput (perf/throughput)", "tokens / s", [("perf/throughput", {})]),
            Panel("tokens per step (perf/total_num_tokens)", "tokens", [("perf/total_num_tokens", {})]),
            Panel("peak memory of the training process (perf/max_memory_gb)", "GB", [("perf/max_memory_gb", {})]),
        ],
        "ettr.png": [Panel("effective training time ratio", "ETTR", [("ettr", {})])],
        "recovery.png": [Panel(
            "time lost to faults (dashed: mean time to recover)", "seconds", [("time_lost_s", {}), ("mttr_s", dashed)]
        )],
    }


def _colour(index: int) -> str:
    return f"C{index % 10}"


def line_figure(runs: list[Run], panels: list[Panel]) -> Figure | None:
    """The panels that have data in some run, stacked (two columns beyond two panels), every
    run in its colour with its incidents marked (those of the runs it shows); None when no
    panel has data."""
    drawn = [p for p in panels if any(run.series(key)[0] for run in runs for key, _ in p.lines)]
    if not drawn:
        return None
    cols = 1 if len(drawn) <= 2 else 2
    rows = math.ceil(len(drawn) / cols)
    fig = Figure(figsize=(8 if cols == 1 else 12, 1 + 3.5 * rows))
    grid = fig.subplots(rows, cols, squeeze=False, sharex=True)
    axes = list(grid.flat)
    for ax in axes[len(drawn):]:
        ax.remove()
    for ax, panel in zip(axes, drawn):
        for index, run in enumerate(runs):
            for key, style in panel.lines:
                steps, values = run.series(key)
                if steps:
                    ax.plot(steps, values, color=_colour(index), label=f"{run.label}: {key}", **style)
        ax.set(title=panel.title, xlabel="step", ylabel=panel.ylabel)
        ax.grid(alpha=0.3)
        _legend_beside(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.xaxis.set_tick_params(labelbottom=True)  # sharex hides them above the last row
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 5))
    for index, run in enumerate(runs):
        if any(run.series(key)[0] for panel in drawn for key, _ in panel.lines):
            _mark_events(axes[: len(drawn)], run, _colour(index))
    _fit_beside(fig, axes[: len(drawn)], rows, cols)
    return fig


def _fit_beside(fig: Figure, axes: list[Axes], rows: int, cols: int) -> None:
    """:func:`_fit` with room for a legend beside each of ``axes``, the figure widened by it: the
    legend's handle and padding, and its longest label at about 0.07 inches a character
    (matplotlib's small font)."""
    longest = max((len(label) for ax in axes for label in ax.get_legend_handles_labels()[1]), default=0)
    legend = 0.7 + 0.07 * longest
    width, height = fig.get_size_inches()
    fig.set_size_inches(width + cols * legend, height)
    _fit(fig, rows, cols, legend=legend)


def _legend_beside(ax: Axes, **kwargs) -> None:
    """The axes' legend outside them, on their right, its top at theirs (:func:`_fit` leaves
    room there)."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def _fit(fig: Figure, rows: int, cols: int, legend: float = 0.0) -> None:
    """Margins and gaps in inches that hold the tick labels, axis labels and titles of a grid of
    axes, and ``legend`` inches right of each axes (a legend outside them); ``tight_layout``
    measures them instead, at the cost of drawing the figure once more."""
    width, height = fig.get_size_inches()
    left, bottom, top, gap = 0.9, 0.6, 0.45, 1.0
    right = max(0.25, legend)
    axes_w = (width - left - right - (cols - 1) * (gap + legend)) / cols
    axes_h = (height - bottom - top - (rows - 1) * gap) / rows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=(gap + legend) / axes_w, hspace=gap / axes_h)


def _mark_events(axes: list[Axes], run: Run, colour: str) -> None:
    """A dashed vertical line on every axes at each step of ``run`` with marked events, their
    kinds written along it at the top of the first axes."""
    for step, kinds in run.marked_steps().items():
        for ax in axes:
            ax.axvline(step, color=colour, linestyle="--", linewidth=1, alpha=0.6)
        axes[0].annotate(", ".join(kinds), xy=(step, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                         fontsize=7, color=colour, ha="right", va="top")


@dataclass(frozen=True)
class StageSeries:
    """What the stage-time plot draws for one run."""

    steps: list[int]
    """The steps of the rows that have any ``timing_s/*`` but ``timing_s/step``."""
    stacked: dict[str, list[float]]
    """{``timing_s/<stage>``: its seconds at each of ``steps`` (0 where a row lacks it)} of the
    controller's stages (:data:`~reasonrl.metrics.STEP_STAGES`) in data-flow order: stacked bars,
    whose height is the step's time."""
    lines: dict[str, tuple[list[int], list[float]]]
    """{``timing_s/<name>``: (the steps that have it, its seconds)} of every other timing: idle,
    in-flight, queued and rollout-side seconds, which overlap the stages or each other (stacked,
    they would count time twice), drawn as lines."""


def stage_series(run: Run) -> StageSeries | None:
    """The :class:`StageSeries` of ``run``; None when it has no timings but ``timing_s/step``."""
    keys = run.keys()
    timed = {k for k in keys if k.startswith("timing_s/") and k != "timing_s/step"}
    rows = [row for row in run.rows if any(row.get(k) is not None for k in timed)]
    if not rows:
        return None
    stages = [f"timing_s/{stage}" for stage in STEP_STAGES if f"timing_s/{stage}" in timed]
    return StageSeries([row["step"] for row in rows], {k: [row.get(k) or 0.0 for row in rows] for k in stages},
                       {k: run.series(k) for k in sorted(timed - set(stages))})


_LEGEND_IN = 2.4
"""Inches to the right of the stage-time axes that hold their legend."""


def timing_figure(runs: list[Run]) -> Figure | None:
    """One subplot per run with timings (:func:`stage_series`): the stages' seconds as stacked
    bars (tab10 colours), the other timings as dashed lines with markers (Dark2 colours, none
    of tab10's), each series in a colour of its own, and the legend outside the axes, on their
    right; None when no run has timings."""
    series = [(run, s) for run in runs if (s := stage_series(run)) is not None]
    if not series:
        return None
    fig = Figure(figsize=(8 + _LEGEND_IN, 1 + 3.5 * len(series)))
    axes = fig.subplots(len(series), 1, squeeze=False)[:, 0]
    bars, marks = matplotlib.colormaps["tab10"].colors, matplotlib.colormaps["Dark2"].colors
    for ax, (run, s) in zip(axes, series):
        handles, bottom = [], [0.0] * len(s.steps)
        for index, (key, seconds) in enumerate(s.stacked.items()):
            handles.append(ax.bar(s.steps, seconds, bottom=bottom, width=0.8, color=bars[index % len(bars)],
                                  label=key.removeprefix("timing_s/")))
            bottom = [b + x for b, x in zip(bottom, seconds)]
        for index, (key, (steps, seconds)) in enumerate(s.lines.items()):
            handles += ax.plot(steps, seconds, color=marks[index % len(marks)], linestyle="--", marker="o",
                               markersize=3, label=f"{key.removeprefix('timing_s/')} (line)")
        ax.set(title=f"time per stage (bars, stacked) and waits (lines): {run.label}", xlabel="step", ylabel="seconds")
        _legend_beside(ax, handles=handles)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _fit(fig, len(series), 1, legend=_LEGEND_IN)
    return fig


def run_forecast(run: Run) -> Forecast | str:
    """The forecast of ``run``'s held-out accuracy from all its validations
    (:mod:`reasonrl.experiments.forecast`), to its train.total_steps (its last step without a
    config) and its eval.target, with the band of the fitted curves; or why there is none."""
    steps, samples, acc = evaluations(run.rows)
    last = run.rows[-1]["step"]
    horizon = max(last, run.config.get("train.total_steps") or last) if run.config else last
    try:
        return forecast(steps, samples, acc, horizon, run.config.get("eval.target") if run.config else None,
                        band_points=101)
    except ValueError as err:
        return str(err)


def forecast_figure(runs: list[Run], forecasts: list[Forecast | str]) -> Figure | None:
    """Two panels: each run's validations with the fitted curve, its 95% band (the
    replicates' curves) and the plateau with its interval; and, when the runs logged
    forecasts (``forecast/*``), how the forecast of the plateau and of val/acc at the last
    step moved with each validation, beside the val/acc measured there. None when no run has a
    forecast."""
    if not any(isinstance(fc, Forecast) for fc in forecasts):
        return None
    logged = any(run.series("forecast/plateau")[0] for run in runs)
    fig = Figure(figsize=(9, 10 if logged else 5.5))
    axes = fig.subplots(2 if logged else 1, 1, squeeze=False)[:, 0]
    ax = axes[0]
    for index, (run, fc) in enumerate(zip(runs, forecasts)):
        colour = _colour(index)
        steps, values = run.series("val/acc")
        ax.plot(steps, values, "o", color=colour, markersize=3, label=f"{run.label}: val/acc")
        if not isinstance(fc, Forecast):
            continue
        at, lo, hi = fc.band
        ax.plot(at, fc.curve([fc.clock.samples_at(s) for s in at]), color=colour,
                label=f"fit: plateau {fc.plateau:.3f} [{fc.plateau_lo:.3f}, {fc.plateau_hi:.3f}]")
        ax.fill_between(at, lo, hi, color=colour, alpha=0.15, linewidth=0)
        ax.axhline(fc.plateau, color=colour, linestyle="--", linewidth=1)
        ax.axhspan(fc.plateau_lo, fc.plateau_hi, color=colour, alpha=0.06, linewidth=0)
        if fc.target is not None:
            ax.axhline(fc.target, color="grey", linestyle=":", linewidth=1)
    ax.set(title="val/acc, the fitted curve (band: 95%) and its plateau (dashed; shaded: 95%)", xlabel="step",
           ylabel="val/acc", ylim=(-0.02, 1.02))
    if logged:
        ax2 = axes[1]
        for index, run in enumerate(runs):
            colour = _colour(index)
            for key, style in (("forecast/plateau", {}), ("forecast/final", {"linestyle": "--"})):
                steps, values = run.series(key)
                if not steps:
                    continue
                _, lo = run.series(f"{key}_lo")
                _, hi = run.series(f"{key}_hi")
                ax2.plot(steps, values, color=colour, marker="o", markersize=3, label=f"{run.label}: {key}", **style)
                ax2.fill_between(steps, lo, hi, color=colour, alpha=0.1, linewidth=0)
            steps, values = run.series("val/acc")
            if steps:
                ax2.axhline(values[-1], color=colour, linestyle=":", linewidth=1,
                            label=f"{run.label}: val/acc at step {steps[-1]}")
        ax2.set(title="the forecast at each validation: plateau; dashed: val/acc at the last step (95% bands)",
                xlabel="step of the forecast", ylabel="val/acc", ylim=(-0.02, 1.02))
    for a in axes:
        a.grid(alpha=0.3)
        _legend_beside(a)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    _fit_beside(fig, list(axes), len(axes), 1)
    return fig


def _write_plots(runs: list[Run], out_dir: Path, forecasts: list[Forecast | str]) -> list[str]:
    """Write every plot that has data; return the file names written, in report order."""
    written = []
    for name, panels in plot_specs(runs).items():
        written += _save(line_figure(runs, panels), out_dir / name)
        if name == "accuracy_by_source.png":
            written += _save(forecast_figure(runs, forecasts), out_dir / "forecast.png")
    return written + _save(timing_figure(runs), out_dir / "timing.png")


def _save(fig: Figure | None, path: Path) -> list[str]:
    """Write ``fig`` (if any) to the PNG ``path``; ``[path.name]`` when written, else ``[]``."""
    if fig is None:
        return []
    fig.savefig(path, format="png", dpi=100)
    return [path.name]


# --- tables --------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return _fmt(seconds)
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _forecast_cells(fc: Forecast | str | None) -> dict[str, str]:
    """The summary table's forecast columns: the plateau and the step at which eval.target is
    reached, each with its 95% interval."""
    if not isinstance(fc, Forecast):
        return {"forecast plateau [95%]": "–", "forecast step to eval.target [95%]": "–"}
    steps = "–" if fc.target is None else (f"{fc.target:g}: {format_step(fc.target_step)} "
                                          f"[{format_step(fc.target_step_lo)}, {format_step(fc.target_step_hi)}]")
    return {"forecast plateau [95%]": f"{fc.plateau:.3f} [{fc.plateau_lo:.3f}, {fc.plateau_hi:.3f}]",
            "forecast step to eval.target [95%]": steps}


def summary(run: Run, fc: Forecast | str | None = None) -> dict[str, str]:
    """The summary-table row of a run, formatted for display (``fc``: its forecast)."""
    _, val = run.series("val/acc")
    _, greedy = run.series("val/acc_greedy")
    _, score = run.series("critic/score/mean")
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
        **_forecast_cells(fc),
        "wall time (h:mm:ss)": _fmt_duration(run.rows[-1].get("time")),
    }


_ABSENT = object()


def config_diff(configs: list[dict[str, Any]]) -> list[str]:
    """The dotted keys whose values are not the same in all ``configs`` (a key some lack
    included), in the order they first appear."""
    keys = dict.fromkeys(key for config in configs for key in config)
    return [key for key in keys if any(c.get(key, _ABSENT) != configs[0].get(key, _ABSENT) for c in configs[1:])]


def _fmt_config_value(value: Any) -> str:
    """A config value as YAML writes it inline: null, true, 0.28, [add, mul]; "(absent)"."""
    if value is _ABSENT:
        return "(absent)"
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).removesuffix("\n...\n").strip()


def _short(value: Any) -> str:
    """An event field for the detail column: floats to 4 digits, a multi-line text by its last line."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        lines = [line.strip() for line in value.strip().splitlines() if line.strip()]
        return lines[-1] if lines else "''"
    return json.dumps(value, default=str)


def event_detail(event: dict[str, Any]) -> str:
    """``key=value`` of an event's fields but time, kind and step, cut at 200 characters."""
    text = ", ".join(f"{k}={_short(v)}" for k, v in event.items() if k not in ("time", "kind", "step"))
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


def _table(header: list[str], rows: list[list[str]], css: str = "") -> str:
    """An HTML table of escaped cells."""
    cls = f' class="{css}"' if css else ""
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    body = ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    return f"<table{cls}>\n" + "\n".join([head, *body]) + "\n</table>"


def _config_section(runs: list[Run]) -> str:
    """The config differences between the runs that have a config (two or more)."""
    have = [run for run in runs if run.config is not None]
    missing = [run.label for run in runs if run.config is None]
    parts = ["<h2>Config differences</h2>"]
    if len(have) >= 2:
        keys = config_diff([run.config for run in have])
        header = ["key", *(run.label for run in have)]
        rows = {key: [key, *(_fmt_config_value(run.config.get(key, _ABSENT)) for run in have)] for key in keys}
        training = [row for key, row in rows.items() if key not in LOGGING_KEYS]
        logging = [row for key, row in rows.items() if key in LOGGING_KEYS]
        agree = "<p>The configs agree on every key that changes training.</p>"
        parts.append(_table(header, training, "left") if training else agree)
        if logging:
            parts.append(f"<details><summary>Keys that differ but change only where and how a run logs ({len(logging)})"
                         f"</summary>\n{_table(header, logging, 'left')}\n</details>")
    else:
        parts.append("<p>Fewer than two runs have a config.yaml: nothing to compare.</p>")
    if missing:
        parts.append(f"<p>No config.yaml in: {html.escape(', '.join(missing))}.</p>")
    return "\n".join(parts)


def _events_section(runs: list[Run]) -> str:
    """The events table of each run (or why there is none)."""
    parts = ["<h2>Events</h2>"]
    for run in runs:
        parts.append(f"<h3>{html.escape(run.label)}</h3>")
        if run.events is None:
            parts.append("<p>No events.jsonl.</p>")
        elif not run.events:
            parts.append("<p>No events.</p>")
        else:
            rows = [["–" if e["step"] is None else str(e["step"]), e["kind"], event_detail(e)] for e in run.events]
            parts.append(_table(["step", "kind", "detail"], rows, "left"))
    return "\n".join(parts)


def _samples_section(runs: list[Run]) -> str:
    """A few validation samples of each validation step, folded per step ('' when no run kept any)."""
    if not any(run.samples for run in runs):
        return ""
    parts = ["<h2>Validation samples</h2>"]
    for run in runs:
        if not run.samples:
            continue
        parts.append(f"<h3>{html.escape(run.label)}</h3>")
        for step, records in run.samples.items():
            rows = [[r["prompt_id"], r["prompt"], r["response"], str(r["pred"]), str(r["ground_truth"]),
                     f"{r['score']:+.3f}", "right" if r["correct"] else "wrong"] for r in records]
            parts.append(f"<details><summary>step {step}</summary>\n"
                         + _table(["id", "prompt", "response", "answer", "truth", "score", ""], rows, "left samples")
                         + "</details>")
    return "\n".join(parts)


def _configs_section(runs: list[Run]) -> str:
    """Each run's config.yaml, folded."""
    parts = ["<h2>Configs</h2>"]
    for run in runs:
        if run.config is None:
            parts.append(f"<p>{html.escape(run.label)}: no config.yaml.</p>")
        else:
            parts.append(f"<details><summary>config.yaml of {html.escape(run.label)}</summary>\n"
                         f"<pre>{html.escape(run.config_text)}</pre>\n</details>")
    return "\n".join(parts)


_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #bbb; padding: 0.3em 0.7em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
table.left td {{ text-align: left; font-family: monospace; }}
table.samples td {{ white-space: pre-wrap; vertical-align: top; max-width: 40em; }}
img {{ max-width: 100%; display: block; margin-bottom: 1.5em; }}
pre {{ background: #f6f6f6; padding: 1em; }}
details {{ margin-bottom: 1.5em; }}
</style>
</head>
"""
"""The page head of the run report and of the sweep summary (one style for both)."""

_PAGE = _HEAD + """<body>
<h1>{title}</h1>
{summary}
{configs}
<h2>Plots</h2>
{images}
{forecasts}
{events}
{samples}
{config_files}
</body>
</html>
"""


def _forecast_section(runs: list[Run], forecasts: list[Forecast | str]) -> str:
    """Each run's forecast in words (or why there is none)."""
    parts = ["<h2>Forecast of held-out accuracy</h2>",
             "<p>ScaleRL's curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) of val/acc against samples generated, "
             "R0 the first validation, fitted to every validation; 95% intervals from a residual bootstrap "
             "(docs/evaluation.md).</p>"]
    for run, fc in zip(runs, forecasts):
        text = fc.describe() if isinstance(fc, Forecast) else f"no forecast: {fc}"
        parts.append(f"<h3>{html.escape(run.label)}</h3>\n<pre>{html.escape(text)}</pre>")
    return "\n".join(parts)


def _html(runs: list[Run], images: list[str], forecasts: list[Forecast | str]) -> str:
    rows = [summary(run, fc) for run, fc in zip(runs, forecasts)]
    title = "reasonrl report: " + ", ".join(run.label for run in runs)
    return _PAGE.format(
        title=html.escape(title),
        summary=_table(list(rows[0]), [list(row.values()) for row in rows]),
        configs=_config_section(runs) if len(runs) >= 2 else "",
        images="\n".join(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">' for name in images),
        forecasts=_forecast_section(runs, forecasts),
        events=_events_section(runs),
        samples=_samples_section(runs),
        config_files=_configs_section(runs),
    )


def write_report(run_dirs: list[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write the PNG plots and ``report.html`` for ``run_dirs``; return the HTML path.

    ``out_dir`` defaults to the run directory for one run and to ``<first run dir>/../report``
    for several. Raises FileNotFoundError for a missing run directory or metrics.jsonl and
    ValueError (InputError) for a metrics.jsonl without rows or a malformed config.yaml or
    events.jsonl, naming the file and line; WriteError naming the file (or ``out_dir``) when a
    plot or the page cannot be written (a full disk).
    """
    if not run_dirs:
        raise InputError("write_report: expected at least one run directory, got none")
    runs = [load_run(d) for d in run_dirs]
    if out_dir is None:
        first = Path(run_dirs[0])
        out_dir = first if len(run_dirs) == 1 else first.resolve().parent / "report"
    out_dir = Path(out_dir)
    forecasts = [run_forecast(run) for run in runs]
    path = out_dir / "report.html"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        images = _write_plots(runs, out_dir, forecasts)
        write_atomic(path, _html(runs, images, forecasts))
    except OSError as err:
        raise WriteError.of(err.filename or out_dir, err) from err
    return path
