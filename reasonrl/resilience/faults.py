"""Deterministic fault injection for drills: ``kind@step[:key=value...]`` specs.

    plan = parse_faults(["crash@5", "slow@8:factor=3:worker=1", "nan@12"]).bind(run_dir)
    plan.fire("crash", step, stage="update")        # at the start of each stage
    time.sleep((plan.rank_factor(rank, step) - 1) * compute_s)  # before a rank's gradient all-reduce
    if plan.poison_loss(step): ...                  # this step's update gets a NaN loss
    time.sleep((plan.slow_factor("gen", worker, step) - 1) * gen_seconds)

The plan only decides what is due; :mod:`reasonrl.resilience.injection` wraps the workers,
the heartbeat and the checkpoint writer so that the faults act where they would in a real
run, and no production code path knows about them.

Kinds and keys (defaults in brackets; the grammar is :mod:`reasonrl.config.faults`, and the
config rules refuse a fault that could not fire in the run before anything loads). Any set of
faults may be combined in one run, ckpt_kill and disk_full on the checkpoint writer included:

    crash           stage [any]     raise RuntimeError("injected crash ...")
    sigkill         stage [any]     SIGKILL the process
    hang            stage [gen]     sleep forever (the StageWatchdog catches it)
    nan             -               the policy update's loss is NaN
    slow            factor [3], worker [0], stage [gen], steps [8]
                                    that stage of that worker takes ``factor`` times longer
                                    for ``steps`` steps from ``step`` on
    ckpt_kill       -               SIGKILL in the middle of writing that step's checkpoint
    disk_full       count [1]       the first ``count`` checkpoints from that step on find the
                                    disk full (ENOSPC while torch.save writes state.pt)
    reward_timeout  count [1]       the reward of the first ``count`` samples sleeps past its timeout
    reward_error    count [1]       the reward of the first ``count`` samples raises
    slow_rank       rank [1], factor [3], steps [8]
                                    that trainer rank's update computes ``factor`` times longer
                                    for ``steps`` steps from ``step`` on (it sleeps for the
                                    difference before its gradient all-reduce)
    hang_rank       rank [1]        that trainer rank sleeps forever before its first collective
                                    of that step's update (the others wait in it; the call times out)

A fault fires once per run: it is recorded in ``run_dir/faults_fired.json`` (atomic write)
before it acts, so a process restarted from a checkpoint does not fire it again, nor does a
standby trainer that bound the run directory before the fault fired (the plan reads the file
again before each check).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from reasonrl.config.faults import KINDS, Fault, parse_specs
from reasonrl.metrics import EventLog, write_atomic

FIRED_FILE = "faults_fired.json"

_ACTIONS = ("crash", "sigkill", "hang")


def parse_faults(specs: list[str]) -> FaultPlan:
    """A FaultPlan from spec strings (:func:`reasonrl.config.faults.parse_specs`); InputError
    names the spec, the bad part and what is allowed, and two specs of the same fault."""
    return FaultPlan(parse_specs(specs))


def _hang_forever() -> None:
    """An injected hang: sleeps until the watchdog (or a signal) ends the process."""
    while True:
        time.sleep(60)


class FaultPlan:
    """The faults of a run and which of them have fired.

    Rule: each fault fires at most once per run. ``mark`` records it as fired (in memory,
    and in ``run_dir/faults_fired.json`` plus a ``fault_injected`` event once bound) before
    the fault acts, so a restarted process that binds the same run directory skips it.
    """

    def __init__(self, faults: list[Fault]) -> None:
        self.faults = list(faults)
        self.fired: set[str] = set()
        self._path: Path | None = None
        self._events: EventLog | None = None
        self._slowing: set[str] = set()

    def bind(self, run_dir: str | Path) -> FaultPlan:
        """Load the faults already fired in ``run_dir`` and record new firings there; returns self."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._path = run_dir / FIRED_FILE
        self._events = EventLog(run_dir)
        self.refresh()
        return self

    def refresh(self) -> None:
        """Take in the faults other processes of the run fired (a drill's file of a few lines,
        read at every check: no modification time is fine-grained enough to skip it)."""
        if self._path is None or not self.faults:
            return
        try:
            self.fired |= set(json.loads(self._path.read_text(encoding="utf-8"))["fired"])
        except FileNotFoundError:
            pass

    def at(self, kind: str, step: int) -> Fault | None:
        """The first not yet fired fault of ``kind`` scheduled at ``step``, or None."""
        if kind not in KINDS:
            raise ValueError(f"FaultPlan.at: unknown kind {kind!r}; allowed kinds: {', '.join(KINDS)}")
        self.refresh()
        return next((f for f in self.faults if f.kind == kind and f.step == step and f.spec not in self.fired), None)

    def mark(self, fault: Fault, **ctx: Any) -> None:
        """Record ``fault`` as fired (durably once bound) and emit ``fault_injected`` with
        ``fault`` = its canonical spec (never the bare kind: ``read_jsonl`` would read "nan"
        back as a float) and ``ctx``."""
        self.fired.add(fault.spec)
        if self._path is not None:
            self.refresh()  # another process of the run may have fired some meanwhile
            write_atomic(self._path, json.dumps({"fired": sorted(self.fired)}, indent=1, sort_keys=True))
        if self._events is not None:
            self._events.emit("fault_injected", fault.step, fault=fault.spec, **ctx)

    def fire(self, kind: str, step: int, stage: str | None = None, **ctx: Any) -> None:
        """Perform a due crash, sigkill or hang fault; a no-op when none is due.

        A fault with a ``stage`` fires only when called with that stage; one without fires
        at the first call for its step. ``ctx`` goes into the ``fault_injected`` event.
        """
        if kind not in _ACTIONS:
            raise ValueError(
                f"FaultPlan.fire: kind {kind!r} has no action here; fire performs {', '.join(_ACTIONS)}"
            )
        self.refresh()
        fault = next(
            (
                f
                for f in self.faults
                if f.kind == kind
                and f.step == step
                and f.spec not in self.fired
                and f.get("stage") in (None, stage)
            ),
            None,
        )
        if fault is None:
            return
        self.mark(fault, stage=stage, **ctx)
        if kind == "crash":
            raise RuntimeError(f"injected crash at step {step} (fault {fault.spec})")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        _hang_forever()

    def slow_factor(self, stage: str, worker: int, step: int) -> float:
        """How many times longer ``stage`` of ``worker`` takes at ``step``: 1.0 normally.

        A slow fault fires at the first matching call inside its window
        ``[step, step + steps)`` and then applies to that window in the process it fired in
        (once per run: a replacement of a slowed worker reads the faults already fired).
        """
        factor = 1.0
        for f in self.faults:
            if f.kind != "slow" or f.get("stage") != stage or f.get("worker") != worker:
                continue
            if not f.step <= step < f.step + f.get("steps"):
                continue
            if f.spec not in self.fired:
                self.refresh()
            if f.spec not in self.fired:
                self.mark(f, stage=stage, worker=worker)
                self._slowing.add(f.spec)
            if f.spec in self._slowing:
                factor *= f.get("factor")
        return factor

    def rank_factor(self, rank: int, step: int) -> float:
        """How many times longer trainer rank ``rank``'s update computes at ``step``: 1.0
        normally; a slow_rank fault's ``factor`` in its window ``[step, step + steps)`` (fired at
        the first call in it, then applied to that window in this process, as :meth:`slow_factor`)."""
        factor = 1.0
        for f in self.faults:
            if f.kind != "slow_rank" or f.get("rank") != rank or not f.step <= step < f.step + f.get("steps"):
                continue
            if f.spec not in self.fired:
                self.mark(f, rank=rank)
                self._slowing.add(f.spec)
            if f.spec in self._slowing:
                factor *= f.get("factor")
        return factor

    def stall_rank(self, rank: int, step: int) -> None:
        """Perform a hang_rank fault due for trainer rank ``rank`` at ``step``: sleep forever
        (the caller is about to enter a collective, which the other ranks then wait in); a
        no-op when none is due."""
        fault = next((f for f in self.faults if f.kind == "hang_rank" and f.step == step and f.get("rank") == rank
                      and f.spec not in self.fired), None)
        if fault is not None:
            self.mark(fault, rank=rank)
            _hang_forever()

    def poison_loss(self, step: int) -> bool:
        """True once when a nan fault is due at ``step`` (the caller makes the loss NaN)."""
        fault = self.at("nan", step)
        if fault is None:
            return False
        self.mark(fault)
        return True

    def reward_fault(self, step: int) -> tuple[str, int] | None:
        """``(kind, count)`` once for a due reward_timeout or reward_error fault: the reward of
        the first ``count`` samples of the step must time out or raise. None otherwise."""
        for kind in ("reward_timeout", "reward_error"):
            fault = self.at(kind, step)
            if fault is not None:
                self.mark(fault)
                return kind, fault.get("count")
        return None
