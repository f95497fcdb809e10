"""In-process guards: non-finite steps, loss/grad spikes, sustained slowdowns and hangs.

The controller owns one of each and asks them, step by step, what to do:

    action = nonfinite.check(step, loss, grad_norm, policy.params_finite())  # "ok" | "skip" | "rollback"
    spiked = spikes.update("loss", step, float(loss))
    slow = slowdown.update("gen", worker, step, seconds, work=prompts)     # Slowdown | None
    watchdog.beat("gen")                                                    # at the start of each stage

Every detector that is given an ``EventLog`` writes one line to ``events.jsonl`` per
incident (kinds ``nonfinite``, ``spike``, ``slowdown``, ``slowdown_recovered``). A hang
cannot be logged from inside the stuck process: the watchdog leaves a stack dump that the
supervisor reads with ``read_hang_dump``. The module does not import torch, so the
supervisor can use that reader without it.
"""

from __future__ import annotations

import faulthandler
import math
import os
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reasonrl.config import ResilienceConfig
from reasonrl.errors import WriteError
from reasonrl.metrics import EventLog

if TYPE_CHECKING:
    import torch

# MAD of a normal sample times this estimates its standard deviation.
_MAD_TO_STD = 1.4826
# Spike scale never drops below this, even for a constant all-zero history.
_MIN_SCALE = 1e-8


def _is_finite(value: float | torch.Tensor) -> bool:
    """Whether a scalar (a Python number or a one-element tensor) is finite."""
    return math.isfinite(float(value))


class NonFiniteGuard:
    """Decides what to do with a step whose loss, gradient norm or parameters are not finite.

    Rule: a step is *bad* when ``loss`` or ``grad_norm`` is NaN/Inf or ``params_finite`` is
    False. A good step returns "ok" and resets the count of consecutive bad steps. A bad step
    returns "skip" (the caller zeroes the gradients and does not step the optimizer), unless
    it is the ``max_consecutive``-th bad step in a row or the parameters themselves are not
    finite (skipping cannot repair them): then it returns "rollback" (the caller restores
    the last good checkpoint and skips the offending batch) and the count restarts at 0.
    """

    def __init__(self, max_consecutive: int, events: EventLog | None = None) -> None:
        if max_consecutive < 1:
            raise ValueError(f"NonFiniteGuard: max_consecutive={max_consecutive}; expected an integer >= 1")
        self.max_consecutive = max_consecutive
        self.events = events
        self.consecutive = 0

    def check(
        self,
        step: int,
        loss: float | torch.Tensor,
        grad_norm: float | torch.Tensor,
        params_finite: bool,
    ) -> str:
        """"ok", "skip" or "rollback" for this step (see the class rule)."""
        loss_ok, grad_ok = _is_finite(loss), _is_finite(grad_norm)
        if loss_ok and grad_ok and params_finite:
            self.consecutive = 0
            return "ok"
        self.consecutive += 1
        rollback = not params_finite or self.consecutive >= self.max_consecutive
        action = "rollback" if rollback else "skip"
        if self.events is not None:
            self.events.emit(
                "nonfinite",
                step,
                action=action,
                loss=float(loss),
                grad_norm=float(grad_norm),
                params_finite=params_finite,
                consecutive=self.consecutive,
            )
        if rollback:
            self.consecutive = 0
        return action

    def state_dict(self) -> dict[str, int]:
        return {"consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consecutive = int(state["consecutive"])


class SpikeDetector:
    """Flags upward spikes in named series (``loss``, ``grad_norm``, ...) with a robust z-test.

    Rule: with ``h`` the last ``window`` accepted values of the series, ``m = median(h)``,
    ``scale = max(1.4826 * median(|h - m|), min_spread * |m|, 1e-8)`` and
    ``limit = m + max(threshold * scale, min_delta)``, a value ``v`` is a spike when
    ``len(h) >= min_history`` and ``v > limit``. The two floors keep healthy series quiet: a
    loss near 0 with a near-0 spread moves by less than ``min_delta``, and a heavy-tailed
    gradient norm stays within ``threshold * min_spread`` times its median. Values that are not
    spikes join the history; spikes do not, so a run of spikes cannot drag the baseline up.
    Non-finite values are left to ``NonFiniteGuard``: they are neither spikes nor history.
    """

    def __init__(
        self,
        window: int,
        threshold: float,
        min_history: int,
        min_spread: float = 0.5,
        min_delta: float = 0.5,
        events: EventLog | None = None,
    ) -> None:
        if not 1 <= min_history <= window:
            raise ValueError(
                f"SpikeDetector: min_history={min_history}, window={window}; expected 1 <= min_history <= window"
            )
        if threshold <= 0 or min_spread < 0 or min_delta < 0:
            raise ValueError(
                f"SpikeDetector: threshold={threshold}, min_spread={min_spread}, min_delta={min_delta}; "
                "expected threshold > 0, min_spread >= 0, min_delta >= 0"
            )
        self.window = window
        self.threshold = threshold
        self.min_history = min_history
        self.min_spread = min_spread
        self.min_delta = min_delta
        self.events = events
        self._history: dict[str, deque[float]] = {}

    def update(self, name: str, step: int, value: float) -> bool:
        """Whether ``value`` is a spike of series ``name``; records it when it is not."""
        value = float(value)
        if not math.isfinite(value):
            return False
        history = self._history.setdefault(name, deque(maxlen=self.window))
        if len(history) >= self.min_history:
            median = statistics.median(history)
            mad = statistics.median(abs(x - median) for x in history)
            scale = max(_MAD_TO_STD * mad, self.min_spread * abs(median), _MIN_SCALE)
            limit = median + max(self.threshold * scale, self.min_delta)
            if value > limit:
                if self.events is not None:
                    self.events.emit("spike", step, series=name, value=value, median=median, limit=limit)
                return True
        history.append(value)
        return False

    def state_dict(self) -> dict[str, dict[str, list[float]]]:
        return {"history": {name: list(values) for name, values in self._history.items()}}

    def load_state_dict(self, state: dict[str, dict[str, list[float]]]) -> None:
        self._history = {
            name: deque((float(v) for v in values), maxlen=self.window) for name, values in state["history"].items()
        }


@dataclass(frozen=True)
class Slowdown:
    """A sustained slowdown of one worker in one stage, reported once at its onset.

    ``factor = recent_s / baseline_s``; ``detected_after_steps`` counts the samples from the
    first slow one (above ``ratio * baseline_s``) in the recent window to the detection.
    """

    stage: str
    worker: int
    step: int
    baseline_s: float
    recent_s: float
    factor: float
    detected_after_steps: int


class _Series:
    """Durations of one (stage, worker): a baseline window, a recent window, a slow flag, and
    the seconds and work of the newest step so far (several calls in one step make one sample)."""

    def __init__(self, window: int, recent: int) -> None:
        self.baseline: deque[float] = deque(maxlen=window)
        self.recent: deque[float] = deque(maxlen=recent)
        self.slow = False
        self.step: int | None = None
        self.seconds = 0.0
        self.work = 0.0


class SlowdownDetector:
    """Two-window change-point test for fail-slow workers (stragglers), and the record of
    speeds whose :meth:`weights` are the shares of rollout workers (the fleet's dispatch) and
    of trainer ranks (:class:`~reasonrl.resilience.collectives.RankMonitor`).

    Each sample is a stage's time per unit of its work in one step (``seconds / work``: per
    prompt, per trained token; the calls of one step, such as dynamic sampling's refills, add
    up to one sample). Per (stage, worker) the last ``min_steps`` samples form the *recent*
    window and the ``window`` samples before them the *baseline*. Rule: an onset is reported
    when the baseline holds at least ``min_steps`` samples,
    ``median(recent) > ratio * median(baseline)`` and the slowdown costs at least ``min_s``
    seconds at this step's work, ``(median(recent) - median(baseline)) * work >= min_s``
    (a stage of milliseconds is never fail-slow for noise). Medians make one noisy step harmless:
    it cannot move the median of ``min_steps >= 3`` samples past the others. While slow,
    samples leaving the recent window are dropped instead of joining the baseline, so the
    baseline stays the pre-onset one; the detector re-arms (and logs ``slowdown_recovered``)
    once ``median(recent) <= (1 + ratio) / 2 * median(baseline)`` (halfway back, so noise
    at the threshold does not flap).
    """

    def __init__(
        self,
        window: int = 8,
        ratio: float = 1.5,
        min_steps: int = 4,
        min_s: float = 0.0,
        events: EventLog | None = None,
    ) -> None:
        if window < min_steps or min_steps < 1 or ratio <= 1 or min_s < 0:
            raise ValueError(
                f"SlowdownDetector: window={window}, ratio={ratio}, min_steps={min_steps}, min_s={min_s}; "
                "expected 1 <= min_steps <= window, ratio > 1 and min_s >= 0"
            )
        self.window = window
        self.ratio = ratio
        self.min_steps = min_steps
        self.min_s = min_s
        self.events = events
        self._series: dict[tuple[str, int], _Series] = {}

    def update(self, stage: str, worker: int, step: int, seconds: float, work: float = 1.0) -> Slowdown | None:
        """Record one stage's ``seconds`` for ``work`` units; return a Slowdown at the onset
        of a sustained slowdown."""
        series = self._series.setdefault((stage, worker), _Series(self.window, self.min_steps))
        if series.step == step and series.recent:
            series.seconds += float(seconds)
            series.work += float(work)
            series.recent[-1] = series.seconds / max(series.work, _MIN_SCALE)
        else:
            if len(series.recent) == self.min_steps and not series.slow:
                series.baseline.append(series.recent[0])
            series.step, series.seconds, series.work = step, float(seconds), float(work)
            series.recent.append(series.seconds / max(series.work, _MIN_SCALE))
        if len(series.baseline) < self.min_steps or len(series.recent) < self.min_steps:
            return None
        baseline = statistics.median(series.baseline)
        recent = statistics.median(series.recent)
        if series.slow:
            if recent <= (1 + self.ratio) / 2 * baseline:
                series.slow = False
                if self.events is not None:
                    self.events.emit("slowdown_recovered", step, stage=stage, worker=worker, recent_s=recent)
            return None
        if recent <= self.ratio * baseline or (recent - baseline) * series.work < self.min_s:
            return None
        series.slow = True
        first_slow = next(i for i, s in enumerate(series.recent) if s > self.ratio * baseline)
        found = Slowdown(
            stage=stage,
            worker=worker,
            step=step,
            baseline_s=baseline,
            recent_s=recent,
            factor=recent / baseline if baseline > 0 else math.inf,
            detected_after_steps=len(series.recent) - first_slow,
        )
        if self.events is not None:
            self.events.emit("slowdown", step, **{k: v for k, v in asdict(found).items() if k != "step"})
        return found

    def forget(self, stage: str, worker: int) -> None:
        """Drop the record of (stage, worker): a replaced worker is measured afresh."""
        self._series.pop((stage, worker), None)

    def is_slow(self, stage: str, worker: int) -> bool:
        """True between the onset of a slowdown of (stage, worker) and its recovery."""
        series = self._series.get((stage, worker))
        return series is not None and series.slow

    def state_dict(self) -> dict[str, Any]:
        return {
            f"{stage}|{worker}": {"baseline": list(s.baseline), "recent": list(s.recent), "slow": s.slow}
            for (stage, worker), s in self._series.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._series = {}
        for key, value in state.items():
            stage, worker = key.rsplit("|", 1)
            series = _Series(self.window, self.min_steps)
            series.baseline.extend(value["baseline"])
            series.recent.extend(value["recent"])
            series.slow = value["slow"]
            self._series[(stage, int(worker))] = series

    def weights(self, stage: str, workers: list[int]) -> dict[int, float]:
        """Work shares for ``workers`` in ``stage``, summing to 1.

        Rule: share_w ∝ 1 / median(recent durations of w). A worker without samples gets
        the mean speed of the others; with no samples at all the shares are equal.
        """
        speeds: dict[int, float | None] = {}
        for worker in workers:
            series = self._series.get((stage, worker))
            if series is None or not series.recent:
                speeds[worker] = None
            else:
                speeds[worker] = 1.0 / max(statistics.median(series.recent), _MIN_SCALE)
        known = [s for s in speeds.values() if s is not None]
        fill = sum(known) / len(known) if known else 1.0
        filled = {w: fill if s is None else s for w, s in speeds.items()}
        total = sum(filled.values())
        return {w: s / total for w, s in filled.items()}


SPIKE_MIN_HISTORY = 5
"""Values a series needs before the spike test applies."""


def run_detectors(r: ResilienceConfig, events: EventLog | None = None) -> tuple[SpikeDetector, SlowdownDetector]:
    """The spike and slowdown detectors of a run, as ``resilience.*`` configures them."""
    spikes = SpikeDetector(r.spike_window, r.spike_threshold, SPIKE_MIN_HISTORY, min_spread=r.spike_min_spread,
                           min_delta=r.spike_min_delta, events=events)
    return spikes, SlowdownDetector(r.slow_window, r.slow_ratio, min_s=r.slow_min_s, events=events)


def _stage_path(dump_path: Path) -> Path:
    return Path(dump_path).with_suffix(".stage")


class StageWatchdog:
    """Hang detection inside the training process, at the C level.

    ``beat(stage)`` re-arms ``faulthandler.dump_traceback_later(timeout_s, exit=True)``, so a
    stage that runs longer than ``timeout_s`` without the next beat (stuck in Python, in a
    C extension or in a collective) makes faulthandler's own thread write every thread's
    stack to ``dump_path`` and ``_exit(1)`` the process. Each beat also replaces
    ``dump_path.with_suffix(".stage")`` with the stage name: its mtime is the heartbeat the
    parent process watches, its text the stage a hang happened in.

    faulthandler needs the dump file open while armed, so it is created empty with its mtime
    set to 0: only a dump actually written looks newer than the process start. ``stop()``
    cancels the timer and removes both files. faulthandler has one timer per process, so use
    one watchdog per process.
    """

    def __init__(self, timeout_s: float, dump_path: Path) -> None:
        if timeout_s <= 0:
            raise ValueError(f"StageWatchdog: timeout_s={timeout_s}; expected a positive number of seconds")
        self.timeout_s = timeout_s
        self.dump_path = Path(dump_path)
        self.stage_path = _stage_path(self.dump_path)
        self.dump_path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.dump_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.utime(self.dump_path, (0, 0))

    def beat(self, stage: str) -> None:
        """Enter ``stage``: record it as the heartbeat and give it ``timeout_s`` to end."""
        if self._fd is None:
            raise RuntimeError(f"StageWatchdog for {self.dump_path} is stopped")
        tmp = self.stage_path.with_name(self.stage_path.name + ".tmp")
        try:
            tmp.write_text(stage + "\n", encoding="utf-8")
            os.replace(tmp, self.stage_path)
        except OSError as err:  # a full disk: one clear error, not a crash to restart
            raise WriteError.of(self.stage_path, err) from err
        faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self._fd, exit=True)

    def stop(self) -> None:
        """Cancel the timer and remove the dump and stage files (no hang happened)."""
        if self._fd is None:
            return
        faulthandler.cancel_dump_traceback_later()
        os.close(self._fd)
        self._fd = None
        self.dump_path.unlink(missing_ok=True)
        self.stage_path.unlink(missing_ok=True)

    def __enter__(self) -> StageWatchdog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def read_hang_dump(dump_path: Path) -> dict[str, Any] | None:
    """``{"stage", "stacks"}`` when an expired watchdog wrote a stack dump to ``dump_path``
    (``stage`` from the heartbeat file, None without one), else None."""
    try:
        stacks = Path(dump_path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    if "most recent call first" not in stacks:
        return None
    try:
        stage = _stage_path(dump_path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        stage = None
    return {"stage": stage, "stacks": stacks}
