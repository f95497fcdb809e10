"""Run-directory logging: the ``metrics.jsonl`` sink with its loggers, a progress bar and a
console line, and events.

    with MetricsSink(run_dir, total_steps=100, log_every=10, loggers=open_loggers(cfg, run_dir)) as sink:
        sink.truncate_after(resumed_step)          # when resuming from a checkpoint
        timings = {}
        with timed(timings, "gen"):
            ...
        sink.log(step, {"critic/score/mean": 0.4, **timings})
        sink.log_samples(step, [Sample(prompt, response, score, acc)])

The loggers (TensorBoard, W&B) are :class:`Logger` backends in :mod:`reasonrl.loggers`.

Each line of ``metrics.jsonl`` and ``events.jsonl`` is one JSON object with sorted keys.
Non-finite floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"`` so every
line stays valid JSON; ``read_jsonl`` turns them back into floats. Lines are flushed and
fsynced as they are written, so a killed process loses at most the line being written,
and that partial line is dropped by ``read_jsonl`` and by the next ``MetricsSink``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

from tqdm import tqdm

from reasonrl.errors import InputError, WriteError

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (also inside dicts and lists) replaced by its string."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _dumps(obj: dict[str, Any]) -> str:
    """One JSONL line (with its newline): sorted keys, non-finite floats as strings."""
    return json.dumps(_json_safe(obj), sort_keys=True, allow_nan=False, default=str) + "\n"


def validation_summary(values: dict[str, Any]) -> dict[str, Any]:
    """The held-out metrics (``val/*``) and the forecast (``forecast/*``) of ``values``, each
    rounded to 4 decimals, non-finite ones as strings: what a run that validated prints at its end."""
    return _json_safe({k: round(v, 4) for k, v in values.items() if k.startswith(("val/", "forecast/"))})


def _decode_non_finite(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in obj.items()}


def _parse_lines(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """Rows of a JSONL file and whether the file ends cleanly (a newline after the last row).

    An unterminated last line that does not parse is a write cut short and is dropped; any
    other unparsable line is an error naming the file and line number.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line, object_hook=_decode_non_finite))
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: line {number} is not valid JSON ({err.msg})") from err
    if not tail.strip():
        return rows, True
    try:
        rows.append(json.loads(tail, object_hook=_decode_non_finite))
    except json.JSONDecodeError:
        pass
    return rows, False


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL file, dropping a trailing partial line and decoding "nan"/"inf"/"-inf"."""
    return _parse_lines(Path(path))[0]


def _fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file beside it, fsync, rename, fsync the
    directory. A crash leaves either the old file or the new one, never a mix; a failed write
    (a full disk) leaves the old one and is a WriteError naming ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    except OSError as err:
        raise WriteError.of(path, err) from err
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise WriteError.of(path, err) from err
        raise
    _fsync_dir(path.parent)


def _rewrite_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Atomically replace ``path`` with ``rows``."""
    write_atomic(path, "".join(_dumps(row) for row in rows))


def _drop_partial_line(path: Path) -> None:
    """If ``path`` does not end with a newline, rewrite it without a trailing partial line."""
    if path.exists():
        rows, clean = _parse_lines(path)
        if not clean:
            _rewrite_jsonl(path, rows)


def _append_line(f, obj: dict[str, Any]) -> None:
    f.write(_dumps(obj))
    f.flush()
    os.fsync(f.fileno())


def _scalar(key: str, value: Any) -> int | float:
    """A metric value as an int or float (numpy and 0-d torch scalars included)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"metric {key!r}: expected a number, got {value!r}") from err


class StepLog:
    """A JSONL file of one row per step (``{"step": N, ...}``), appended durably, that a resume
    cuts back to the checkpoint's step (rows of steps that will be redone go).

    Opening a file that ends in a partial line (a kill mid-write) drops that line. A write
    that fails (a full disk) is a WriteError naming the file, which is closed then: what it had
    buffered is dropped, and a partial last line goes when it is opened again.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _drop_partial_line(self.path)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as err:
            raise WriteError.of(self.path, err) from err

    def log(self, step: int, row: dict[str, Any]) -> None:
        """Append ``{"step": step, **row}``, flushed and fsynced."""
        self._append(_dumps({"step": step, **row}))

    def log_rows(self, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` (each with its ``step``), flushed and fsynced once."""
        if rows:
            self._append("".join(_dumps(row) for row in rows))

    def _append(self, text: str) -> None:
        try:
            self._file.write(text)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as err:
            try:
                self._file.close()  # flushes what failed once more, then closes whatever it says
            except OSError:
                pass
            raise WriteError.of(self.path, err) from err

    def truncate_after(self, step: int) -> tuple[list[dict[str, Any]], int]:
        """Keep only rows with ``row["step"] <= step`` (atomic rewrite); return the kept rows and
        the last step the file held before (-1: none)."""
        rows = read_jsonl(self.path)
        kept = [row for row in rows if row["step"] <= step]
        if len(kept) < len(rows):
            self._file.close()
            _rewrite_jsonl(self.path, kept)
            try:
                self._file = open(self.path, "a", encoding="utf-8")
            except OSError as err:
                raise WriteError.of(self.path, err) from err
        return kept, max((row["step"] for row in rows), default=-1)

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class Sample:
    """One generated sample for the loggers: prompt and response as text, reward, correctness."""

    prompt: str
    response: str
    score: float
    acc: bool


class Logger(Protocol):
    """A backend the sink sends each row to (:mod:`reasonrl.loggers`: TensorBoard, W&B)."""

    def rewind(self, step: int, last_logged: int) -> None:
        """The steps after ``step`` will be logged again; ``last_logged`` is the last step
        logged before (-1: none)."""

    def log_metrics(self, step: int, values: dict[str, int | float]) -> None:
        """The metrics of one step."""

    def log_samples(self, step: int, samples: Sequence[Sample], tag: str = "samples") -> None:
        """Generated samples of one step, under ``tag`` (``samples``: training, ``val_samples``:
        validation)."""

    def close(self) -> None:
        """Flush and release the backend."""


def logging_step(step: int, every: int) -> bool:
    """Whether ``step`` gets the console line and samples: every ``every`` steps (0: never)."""
    return every > 0 and step > 0 and step % every == 0


STEP_STAGES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "publish", "testing")
"""The controller's stages in data-flow order: their ``timing_s/<stage>`` are consecutive parts
of a step (``testing``, a validation, follows the step), so they add up. Every other
``timing_s/*`` overlaps them or each other (``trainer_idle`` is spent inside ``gen``,
``rollout_gen``, ``rollout_idle`` and ``reward`` on the rollout side, ``weight_sync`` inside
``publish``, ``group_queued`` and ``group_in_flight`` are a group's mean waits)."""

CONSOLE_FIELDS = (
    ("reward", "critic/score/mean"),
    ("acc", "train/acc"),
    ("val", "val/acc"),
    ("pg_loss", "actor/pg_loss"),
    ("grad_norm", "actor/grad_norm"),
    ("kl", "actor/ppo_kl"),
    ("len", "response_length/mean"),
    ("tok/s", "perf/throughput"),
)
"""(label, metric) of the console line, in order."""

ASYNC_CONSOLE_FIELDS = (
    ("stale", "staleness/mean"),
    ("queue", "rollout/queue_length"),
    ("trainer_idle_s", "timing_s/trainer_idle"),
    ("rollout_idle_s", "timing_s/rollout_idle"),
)
"""(label, metric) added to the console line in ``async`` and ``lockstep`` modes: the mean
staleness of the batch's groups, the groups collected and not yet trained, and the seconds the
trainer waited for the batch and the rollout side waited for work."""


def console_fields(mode: str) -> tuple[tuple[str, str], ...]:
    """The console line's (label, metric) for ``rollout.mode``: :data:`CONSOLE_FIELDS`, then
    :data:`ASYNC_CONSOLE_FIELDS` in ``async`` and ``lockstep`` modes (in ``sync`` mode the
    staleness is 0 and nothing waits in a queue)."""
    return CONSOLE_FIELDS + ASYNC_CONSOLE_FIELDS if mode in ("async", "lockstep") else CONSOLE_FIELDS


def final_summary(values: dict[str, Any], fields: Sequence[tuple[str, str]] = CONSOLE_FIELDS) -> dict[str, Any]:
    """What a run prints at its end (and ``reasonrl.train`` returns): with a validation among
    ``values``, its :func:`validation_summary`; without one, the training metrics of the
    console line (``fields``, default :data:`CONSOLE_FIELDS`) that ``values`` has, each rounded
    to 4 decimals under its metric name, non-finite ones as strings."""
    if any(k.startswith("val/") for k in values):
        return validation_summary(values)
    shown = [key for _, key in fields if values.get(key) is not None]
    return _json_safe({key: round(values[key], 4) for key in shown})


def _short(value: int | float) -> str:
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _step_text(step: float) -> str:
    return "never" if math.isinf(step) else f"{step:.0f}"


def forecast_text(values: dict[str, int | float]) -> list[str]:
    """The forecast of a run's row (``forecast/*``, :mod:`reasonrl.experiments.forecast`) for
    the console: ``plateau=0.846 [0.609, 1.000]`` and, with a target,
    ``0.8@step=163 [87, never]``; [] without one."""
    if values.get("forecast/plateau") is None:
        return []
    shown = [f"plateau={values['forecast/plateau']:.3f} [{values['forecast/plateau_lo']:.3f}, "
             f"{values['forecast/plateau_hi']:.3f}]"]
    if values.get("forecast/target_step") is not None:
        shown.append(f"{values['forecast/target']:g}@step={_step_text(values['forecast/target_step'])} "
                     f"[{_step_text(values['forecast/target_step_lo'])}, {_step_text(values['forecast/target_step_hi'])}]")
    return shown


def console_line(step: int, total_steps: int, values: dict[str, int | float],
                 fields: Sequence[tuple[str, str]] = CONSOLE_FIELDS) -> str:
    """``step 10/150 reward=0.4125 acc=0.375 val=0.55 plateau=0.846 [0.609, 1.000] ...``: the
    metrics of ``fields`` (:func:`console_fields`) that the step has, the forecast after ``val``."""
    shown = []
    for label, key in fields:
        if values.get(key) is not None:
            shown.append(f"{label}={_short(values[key])}")
        if key == "val/acc":
            shown += forecast_text(values)
    return " ".join([f"step {step}/{total_steps}", *shown])


class MetricsSink:
    """Writes one row per step to ``metrics.jsonl``, the loggers and a progress bar, and every
    ``log_every`` steps a console line of the main metrics with the latest validation and its
    forecast (beside the bar, or on stderr).

    ``fields`` are the console line's (label, metric) pairs (:func:`console_fields`).
    ``step`` is the number of completed training steps (the first step logs 1). Opening a
    run directory whose ``metrics.jsonl`` ends in a partial line (a kill mid-write) drops
    that line. On resume call ``truncate_after(step)`` with the checkpoint's step so rows
    from steps that will be redone disappear from the file and the loggers are told
    (TensorBoard purges them, W&B skips them: :mod:`reasonrl.loggers`). The sink closes the
    loggers it is given.
    """

    def __init__(
        self,
        run_dir: str | Path,
        total_steps: int,
        progress: bool = True,
        log_every: int = 0,
        loggers: Sequence[Logger] = (),
        fields: Sequence[tuple[str, str]] = CONSOLE_FIELDS,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.fields = tuple(fields)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rows = StepLog(self.run_dir / "metrics.jsonl")
        self.path = self.rows.path
        self.total_steps = total_steps
        self.log_every = log_every
        self.loggers = list(loggers)
        self._latest_val: float | None = None
        self._latest_forecast: dict[str, int | float] = {}
        self._bar = tqdm(total=total_steps, file=sys.stderr, unit="step", dynamic_ncols=True) if progress else None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append ``{"step": step, **metrics}`` durably, then send it to the loggers, the bar
        and, on a logging step, the console."""
        values = {key: _scalar(key, value) for key, value in metrics.items() if key != "step"}
        self.rows.log(step, values)
        self._latest_val = values.get("val/acc", self._latest_val)
        if "val/acc" in values:
            self._latest_forecast = {k: v for k, v in values.items() if k.startswith("forecast/")}
        for logger in self.loggers:
            logger.log_metrics(step, values)
        if self._bar is not None:
            self._update_bar(step, values)
        if logging_step(step, self.log_every):
            self._print(console_line(step, self.total_steps,
                                     {**values, "val/acc": self._latest_val, **self._latest_forecast}, self.fields))

    def log_samples(self, step: int, samples: Sequence[Sample], tag: str = "samples") -> None:
        """Send generated samples of ``step`` to the loggers, under ``tag``."""
        for logger in self.loggers:
            logger.log_samples(step, samples, tag)

    def truncate_after(self, step: int) -> None:
        """Keep only rows with ``row["step"] <= step`` (atomic rewrite; a no-op on the file when
        no row is past ``step``) and rewind the loggers to ``step``."""
        kept, logged = self.rows.truncate_after(step)
        for logger in self.loggers:
            logger.rewind(step, logged)
        vals = [row for row in kept if "val/acc" in row]
        self._latest_val = vals[-1]["val/acc"] if vals else None
        self._latest_forecast = {k: v for k, v in vals[-1].items() if k.startswith("forecast/")} if vals else {}
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def close(self) -> None:
        """Close the file, the progress bar and the loggers (after the bar: W&B prints a summary)."""
        self.rows.close()
        if self._bar is not None:
            self._bar.close()
        for logger in self.loggers:
            logger.close()

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _update_bar(self, step: int, values: dict[str, int | float]) -> None:
        shown = {
            "reward": values.get("critic/score/mean"),
            "acc": values.get("train/acc"),
            "val": self._latest_val,
        }
        self._bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if v is not None}, refresh=False)
        self._bar.update(step - self._bar.n)

    def _print(self, line: str) -> None:
        """A line beside the progress bar (above it), or on stderr without one."""
        if self._bar is not None:
            tqdm.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)


class EventLog:
    """Appends faults, restarts and warnings to ``run_dir/events.jsonl``, one durable line each.

    A partial last line left by a kill mid-write is dropped when the log is opened.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "events.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_line(self.path)

    def emit(self, kind: str, step: int | None, **fields: Any) -> None:
        """Append ``{"time": unix time, "kind": kind, "step": step, **fields}``; WriteError
        naming the log when it cannot be written."""
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                _append_line(f, {"time": time.time(), "kind": kind, "step": step, **fields})
        except OSError as err:
            raise WriteError.of(self.path, err) from err


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the seconds spent in the block to ``timings[f"timing_s/{name}"]`` (accumulating)."""
    key = f"timing_s/{name}"
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - start
