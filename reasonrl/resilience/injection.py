"""Fault injection by wrapping: a run's workers, stage heartbeat and checkpoint writer, with the
faults of its :class:`~reasonrl.resilience.faults.FaultPlan` acting where they would happen
for real. Production code never sees a fault: :class:`WorkerFaults` picks each worker's wrapper
and :func:`~reasonrl.runtime.topology.spawn` applies it where the worker runs.

    heartbeat = FaultyHeartbeat(watchdog, plan, clock)    crash, sigkill, hang at a stage's start
    policy = FaultyPolicy(policy_worker, plan, clock)     nan: that step's update has a NaN loss
    rollout = FaultyRollout(rollout_worker, plan, w, clock)  slow: worker w's generation drags
    reward = FaultyRewards(reward_worker, plan, clock)    reward_timeout, reward_error
    spawn(role, factory, args, wrap=WorkerFaults(plan, clock))  the above by role, where each
                                                          spawned worker runs
    writer = checkpoint_writer(root, keep, plan)          ckpt_kill: SIGKILL mid-write; disk_full: ENOSPC
    rank = FaultyRank(trainer_rank, plan)                 slow_rank, hang_rank (and nan on rank 0), in
                                                          the rank's own process

``clock()`` returns the training step being run (1-based); a trainer rank is told its step
by each call (``update(batch, lr, step=...)``).
"""

from __future__ import annotations

import errno
import math
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from reasonrl.checkpoint import CheckpointWriter
from reasonrl.resilience.faults import FaultPlan
from reasonrl.reward.base import Grades
from reasonrl.reward.pool import RewardPool
from reasonrl.runtime.pool import PoolStart
from reasonrl.trainer.distributed import Recorder

Clock = Callable[[], int]


class _Wrapper:
    """Delegates every attribute it does not define to the wrapped worker."""

    def __init__(self, inner: Any, plan: FaultPlan, clock: Clock) -> None:
        self.inner, self.plan, self.clock = inner, plan, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def unwrapped(worker: Any) -> Any:
    """The worker inside any fault wrappers around it."""
    while isinstance(worker, _Wrapper):
        worker = worker.inner
    return worker


class FaultyHeartbeat(_Wrapper):
    """The stage heartbeat (a StageWatchdog, or None without one): after the beat, a due crash,
    sigkill or hang fault of that stage fires."""

    def beat(self, stage: str) -> None:
        if self.inner is not None:
            self.inner.beat(stage)
        for kind in ("crash", "sigkill", "hang"):
            self.plan.fire(kind, self.clock(), stage=stage)

    def stop(self) -> None:
        if self.inner is not None:
            self.inner.stop()


class FaultyPolicy(_Wrapper):
    """A PolicyWorker whose update, at a nan fault's step, runs on NaN advantages: the loss and
    the gradients are NaN, as a numerical blow-up would make them."""

    def update(self, batch, lr: float) -> dict[str, float]:
        if self.plan.poison_loss(self.clock()):
            batch = replace(batch, advantages=batch.advantages * math.nan)
        return self.inner.update(batch, lr)


class _FaultyRecorder(Recorder):
    """Trainer rank ``rank``'s collective recorder, with the rank's faults acting just before it
    enters a collective of an update: hang_rank never enters the first one of its step, and
    slow_rank sleeps ``(factor - 1)`` times the compute since the rank's last collective (or
    the call's start) before the gradient all-reduce."""

    def __init__(self, inner: Recorder, plan: FaultPlan, rank: int) -> None:
        self.inner, self.plan, self.rank = inner, plan, rank
        self.step, self.call = 0, ""
        self.since = time.perf_counter()

    def begin(self, step: int, call: str) -> None:
        self.step, self.call = step, call
        self.since = time.perf_counter()
        self.inner.begin(step, call)

    def enter(self, seq: int, op: str, what: str, nbytes: int) -> None:
        if self.call == "update":
            self.plan.stall_rank(self.rank, self.step)
            if what == "grads":
                factor = self.plan.rank_factor(self.rank, self.step)
                if factor > 1:
                    time.sleep((factor - 1) * (time.perf_counter() - self.since))
        self.inner.enter(seq, op, what, nbytes)

    def exit(self, seq: int, error: str | None = None) -> None:
        self.since = time.perf_counter()
        self.inner.exit(seq, error)

    def close(self) -> None:
        self.inner.close()


class FaultyRank(_Wrapper):
    """A :class:`~reasonrl.workers.trainer_rank.TrainerRank` in its own process, with the
    plan's faults for it: slow_rank and hang_rank of its rank act before its collectives
    (its recorder is wrapped once it joined the group), and rank 0's update at a nan fault's
    step runs on NaN advantages (the all-reduce spreads the NaN gradients to every rank, as
    a blow-up on one rank would)."""

    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        super().__init__(inner, plan, lambda: inner.version + 1)

    def connect(self, *args, **kwargs) -> int:
        pid = self.inner.connect(*args, **kwargs)
        self.inner.dp.recorder = _FaultyRecorder(self.inner.dp.recorder, self.plan, self.inner.rank)
        return pid

    def update(self, batch, lr: float, step: int | None = None) -> dict[str, float]:
        if self.inner.rank == 0 and self.plan.poison_loss(self.clock() if step is None else step):
            batch = replace(batch, advantages=batch.advantages * math.nan)
        return self.inner.update(batch, lr, step)


class FaultyRollout(_Wrapper):
    """Rollout worker ``index``: while a slow fault for it is due, each generation call takes
    ``factor`` times as long (it sleeps for the difference)."""

    def __init__(self, inner: Any, plan: FaultPlan, index: int, clock: Clock) -> None:
        super().__init__(inner, plan, clock)
        self.index = index

    def _drag(self, began: float) -> None:
        factor = self.plan.slow_factor("gen", self.index, self.clock())
        if factor > 1:
            time.sleep((factor - 1) * (time.perf_counter() - began))

    def generate(self, *args, **kwargs):
        began = time.perf_counter()
        out = self.inner.generate(*args, **kwargs)
        self._drag(began)
        return out

    def generate_stream(self, *args, **kwargs):
        began = time.perf_counter()
        out = self.inner.generate_stream(*args, **kwargs)
        self._drag(began)
        return out

    def stream(self, *args, **kwargs):
        began = time.perf_counter()
        out = self.inner.stream(*args, **kwargs)
        self._drag(began)
        return out


class WorkerFaults:
    """The plan's wrapper for each worker of a run: :func:`~reasonrl.runtime.topology.spawn`'s
    ``wrap``, applied where the worker runs, and what wraps the rollout producer's reward
    grader. By role: the policy's rank 0 gets :class:`FaultyPolicy` (nan faults), the reward
    grader :class:`FaultyRewards` (reward_timeout, reward_error), both on ``clock``, the step
    the controller runs; rollout worker ``index`` gets :class:`FaultyRollout` (slow faults),
    on its own clock, the step its weights' version trains next (in a process of its own too:
    ``clock`` stays in this process). A worker the plan has no fault for is returned as it is.
    """

    def __init__(self, plan: FaultPlan, clock: Clock | None = None) -> None:
        self.plan, self.clock = plan, clock
        self.kinds = {f.kind for f in plan.faults}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "clock": None}  # the controller's step clock does not cross a process

    def __call__(self, worker: Any, role: str, index: int) -> Any:
        if role == "rollout" and "slow" in self.kinds:
            return FaultyRollout(worker, self.plan, index, lambda: worker.version + 1)
        if role == "policy" and "nan" in self.kinds:
            return FaultyPolicy(worker, self.plan, self._clock(role))
        if role == "reward" and self.kinds & {"reward_timeout", "reward_error"}:
            return FaultyRewards(worker, self.plan, self._clock(role))
        return worker

    def _clock(self, role: str) -> Clock:
        if self.clock is None:
            raise RuntimeError(f"WorkerFaults: the {role} wrapper needs the controller's step clock, which stays "
                               "in the controller's process")
        return self.clock


def sleeping_reward(response: str, ground_truth: str) -> dict:
    """The reward function of a reward_timeout drill: it never returns."""
    while True:
        time.sleep(60)


def raising_reward(response: str, ground_truth: str) -> dict:
    """The reward function of a reward_error drill."""
    raise RuntimeError("injected reward error (fault drill)")


class FaultyRewards(_Wrapper):
    """A RewardWorker: at a reward_timeout or reward_error fault's step, the first ``count``
    samples of its first scoring are graded by a function that hangs (in a worker process,
    killed at ``runtime.roles.reward.timeout_s``) or raises; the others as usual."""

    def score(self, rollout, prompts):
        fault = self.plan.reward_fault(self.clock())
        if fault is None:
            return self.inner.score(rollout, prompts)
        kind, count = fault
        texts = self.inner.decode(rollout)
        k = min(count, len(texts))
        fn = sleeping_reward if kind == "reward_timeout" else raising_reward
        timeout = self.inner.cfg.runtime.roles.reward.timeout_s
        with RewardPool(f"{__name__}:{fn.__name__}", PoolStart("reward", 1, timeout), max_consecutive_failures=k) as drill:
            bad = drill.score(texts[:k], [p.ground_truth for p in prompts[:k]])
        good = self.inner.grade(texts[k:], prompts[k:])
        grades = Grades(torch.cat([bad.scores, good.scores]), torch.cat([bad.acc, good.acc]),
                        torch.cat([bad.failed, good.failed]), bad.errors + [_renumber(e, k) for e in good.errors],
                        bad.preds + good.preds, bad.extras + good.extras, torch.cat([bad.timed_out, good.timed_out]))
        return self.inner.assemble(rollout, prompts, texts, grades)


def _renumber(error: str, offset: int) -> str:
    """``"sample i: ..."`` -> ``"sample i+offset: ..."``."""
    head, _, rest = error.partition(": ")
    return f"sample {int(head.removeprefix('sample ')) + offset}: {rest}"


class _FullFile:
    """A file on a disk that fills up after ``room`` bytes: later writes raise ENOSPC, as the
    kernel's would."""

    def __init__(self, f, room: int) -> None:
        self._f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name: str):
        return getattr(self._f, name)


class _FaultyWriter(CheckpointWriter):
    """The checkpoint writer of a run with ckpt_kill or disk_full faults (or both, at any steps).

    ckpt_kill: at its step, SIGKILLs the process once the checkpoint's first file is written
    and fsynced (before its manifest and COMMITTED marker). disk_full: from its step on, the
    next ``count`` checkpoints meet a full disk: their ``state.pt`` (written by torch.save)
    runs out of space after 4 KiB."""

    def __init__(self, root: Path, keep: int, plan: FaultPlan) -> None:
        super().__init__(root, keep)
        self.plan = plan
        self.left = 0
        self._full = False
        self._kill = None

    def save(self, step: int, tensors, state) -> Path:
        self.plan.refresh()  # fired by another process of the run since this writer was built (a standby's)
        due = next((f for f in self.plan.faults if f.kind == "disk_full" and f.step <= step and f.spec not in self.plan.fired), None)
        if due is not None:
            self.plan.mark(due)
            self.left = due.get("count")
        self._full = self.left > 0
        self.left -= self._full
        self._kill = self.plan.at("ckpt_kill", step)
        return super().save(step, tensors, state)

    def open_file(self, path: Path):
        f = super().open_file(path)
        return _FullFile(f, 4096) if self._full and path.name == "state.pt" else f

    def write_file(self, path: Path, write) -> None:
        super().write_file(path, write)
        if self._kill is not None:
            self.plan.mark(self._kill, file=str(path))
            os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_writer(root: Path, keep: int, plan: FaultPlan) -> CheckpointWriter:
    """The run's checkpoint writer: one that dies mid-write (ckpt_kill) or meets a full disk
    (disk_full) where the plan has such faults."""
    if any(f.kind in ("ckpt_kill", "disk_full") for f in plan.faults):
        return _FaultyWriter(root, keep, plan)
    return CheckpointWriter(root, keep)
