"""The one process pool: calls to the workers of a group, each with a deadline, and one way to
replace a worker that hangs or dies.

    start = PoolStart("reward", count=2, timeout_s=5.0)         # picklable: how the workers start
    pool = start(GraderWorker, [(reward_cfg,)] * 2)               # a WorkerPool over a ProcessGroup
    pool.submit(0, "grade", text, truth, row, key=7)              # returns at once
    while pool.busy:
        for done in pool.wait():                                  # Done(key=7, index=0, outcome="ok", value=grade)
            ...
    pool.close()

A :class:`WorkerPool` drives any :class:`~reasonrl.runtime.group.WorkerGroup` whose workers run
their calls one at a time, in the order submitted (a
:class:`~reasonrl.runtime.process.ProcessGroup`, a :class:`~reasonrl.runtime.ray.RayGroup`).
Each call has ``timeout_s`` from when it starts running: when it was sent or when the call
before it on the same worker finished, whichever is later. A call past its deadline, or a
worker that dies, gets its worker replaced (:meth:`WorkerGroup.restart`) under the pool's
:class:`RestartPolicy`, and :meth:`WorkerPool.wait` reports what became of every call the
worker had: the running one ``timeout`` (or ``died``), the ones queued behind it ``lost`` (not
run, or run by a worker that is gone: the caller decides whether to submit them again).

The pools of reward grading and environments (``reasonrl.reward.pool``, ``reasonrl.env.pool``)
use it through a :class:`PoolStart` they are given, so they never import this package; which
samples or slots go to which worker, and what a failure means, stays theirs.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from reasonrl.errors import InputError, LimitError, error_line
from reasonrl.restarts import RestartPolicy
from reasonrl.runtime.group import WorkerDied, WorkerGroup
from reasonrl.runtime.process import ProcessGroup


class RestartsExhausted(LimitError, WorkerDied):
    """A worker needed more restarts in a row than its :class:`RestartPolicy` allows: it fails
    however often it is replaced. The message names the role and the worker's index."""


Outcome = Literal["ok", "error", "timeout", "died", "lost"]
"""What became of a call (:class:`Done`)."""


@dataclass(frozen=True)
class Done:
    """What became of one call: ``key`` is the caller's (from :meth:`WorkerPool.submit`),
    ``index`` the worker. ``outcome``: ``ok`` (``value`` is the result), ``error`` (the method
    raised ``value``; the worker goes on), ``timeout`` (it ran past the deadline), ``died``
    (its worker ended while running it) or ``lost`` (it was queued on, or being run by, a
    worker that was then replaced). For the last three ``value`` is a message naming the
    role, the worker and why, and the worker has been restarted."""

    key: Any
    index: int
    outcome: Outcome
    value: Any


@dataclass
class _Call:
    key: Any
    future: Future
    sent: float
    finished: float = 0.0


class WorkerPool:
    """Calls to the workers of ``group`` (see the module docstring), each bounded by
    ``timeout_s`` seconds of running; ``role`` names the workers in messages and events
    (``role[index]``). Workers that time out or die are restarted under ``restarts``; each
    restart emits ``emit("worker_restarted", role=, index=, pid=, new_pid=, reason=)`` (the old
    and the new process id). ``restarts_done`` counts the restarts so far. Not thread-safe:
    one caller drives a pool."""

    def __init__(self, group: WorkerGroup, *, role: str, timeout_s: float, restarts: RestartPolicy = RestartPolicy(),
                 emit: Callable[..., None] | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"WorkerPool {role}: timeout_s = {timeout_s!r}, expected a number > 0")
        self.group, self.role, self.timeout_s, self.restarts, self.emit = group, role, float(timeout_s), restarts, emit
        self.size = group.size
        self.restarts_done = 0
        self._calls: list[deque[_Call]] = [deque() for _ in range(self.size)]
        self._free_since = [0.0] * self.size  # when the worker's last answered call finished
        self._in_a_row = [0] * self.size
        self._restarted_at = [-float("inf")] * self.size
        self._gave_up = False  # a worker that failed past the restart budget is left as it was

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return self.group.pids

    @property
    def busy(self) -> bool:
        """Whether some call has not been reported by :meth:`wait` yet."""
        return any(self._calls)

    def queued(self, index: int) -> int:
        """Calls sent to worker ``index`` and not reported yet."""
        return len(self._calls[index])

    def submit(self, index: int, method: str, *args: Any, key: Any = None, **kwargs: Any) -> None:
        """Call ``method(*args, **kwargs)`` on worker ``index``; :meth:`wait` reports it under ``key``."""
        call = _Call(key, self.group.submit_to(index, method, *args, **kwargs), time.monotonic())
        call.future.add_done_callback(lambda _, call=call: setattr(call, "finished", time.monotonic()))
        self._calls[index].append(call)

    def wait(self) -> list[Done]:
        """Wait until some call finishes or a running call passes its deadline, and report every
        call settled by then, in each worker's order (none when nothing is in flight). Raises
        :class:`RestartsExhausted` when a worker is past its restart budget."""
        running = [i for i in range(self.size) if self._calls[i]]
        if not running:
            return []
        due = min(self._deadline(i) for i in running)
        wait([c.future for i in running for c in self._calls[i]], max(0.0, due - time.monotonic()), FIRST_COMPLETED)
        return [done for i in running for done in self._settle(i)]

    def grow(self, args: tuple) -> None:
        """One more worker, built from ``args`` (as the group's others), as index ``size``."""
        self.group.grow(args)
        self._calls.append(deque())
        self._free_since.append(time.monotonic())
        self._in_a_row.append(0)
        self._restarted_at.append(-float("inf"))
        self.size += 1

    def shrink(self) -> None:
        """Close the last worker, which must have no call in flight (grow and shrink between batches)."""
        if self._calls[-1]:
            raise RuntimeError(f"WorkerPool {self.role}: cannot remove worker {self.size - 1} with calls in flight")
        self.group.shrink()
        for kept in (self._calls, self._free_since, self._in_a_row, self._restarted_at):
            kept.pop()
        self.size -= 1

    def close(self) -> None:
        """Close the group: each worker finishes its running call and closes, then ends. Once
        the pool gave up on a worker (its restarts exhausted: it may hang in a call for ever),
        every worker is killed at once instead of waited for."""
        if self._gave_up:
            self.group.kill()
        self.group.close()

    def _deadline(self, index: int) -> float:
        head = self._calls[index][0]
        return max(head.sent, self._free_since[index]) + self.timeout_s

    def _settle(self, index: int) -> list[Done]:
        """The answered calls of worker ``index`` at the head of its queue; then, if the worker
        died or its running call is past the deadline, its restart and its other calls."""
        calls, out = self._calls[index], []
        while calls and calls[0].future.done():
            err = calls[0].future.exception()
            if isinstance(err, WorkerDied):
                return out + self._replace(index, "died", error_line(err))
            call = calls.popleft()
            self._free_since[index], self._in_a_row[index] = call.finished, 0
            out.append(Done(call.key, index, "error" if err else "ok", err or call.future.result()))
        if calls and time.monotonic() >= self._deadline(index):
            out += self._replace(index, "timeout", f"no answer within {self.timeout_s:g} s")
        return out

    def _replace(self, index: int, outcome: Outcome, why: str) -> list[Done]:
        """Restart worker ``index``; its running call gets ``outcome``, the others ``lost``."""
        label = f"{self.role}[{index}]"
        calls = list(self._calls[index])
        self._calls[index].clear()
        self._restart(index, f"{outcome}: {why}")
        lost = f"{label} was restarted ({outcome}) before answering this call"
        return [Done(calls[0].key, index, outcome, f"{label}: {why}"),
                *(Done(c.key, index, "lost", lost) for c in calls[1:])]

    def _restart(self, index: int, reason: str) -> None:
        label = f"{self.role}[{index}]"
        attempt = self._in_a_row[index] + 1
        if attempt > self.restarts.budget:
            self._gave_up = True
            raise RestartsExhausted(f"{label}: {self.restarts.budget} restarts in a row did not help (the restart "
                                    f"budget); it failed again ({reason})")
        pause = self._restarted_at[index] + self.restarts.pause_s(attempt) - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        old = self.group.pids[index]
        self.group.restart(index)
        self._in_a_row[index], self._restarted_at[index] = attempt, time.monotonic()
        self._free_since[index] = self._restarted_at[index]
        self.restarts_done += 1
        if self.emit is not None:
            self.emit("worker_restarted", role=self.role, index=index, pid=old, new_pid=self.group.pids[index],
                      reason=reason)


@dataclass(frozen=True)
class PoolStart:
    """How the workers of a pool start, picklable (a rollout worker in a process of its own
    receives one and starts its environment workers with it): ``count`` workers of ``role``,
    ``where`` they run (``process``: a :class:`~reasonrl.runtime.process.ProcessGroup`;
    ``ray``: a :class:`~reasonrl.runtime.ray.RayGroup`, placed by ``ray_options``, the
    ``resources`` and ``placement`` lists of
    :meth:`~reasonrl.runtime.ray.Reservation.options`, or Ray's defaults when None), each
    call bounded by ``timeout_s`` and starting a worker by ``start_timeout_s``, workers
    replaced under ``restarts``, restarts reported to ``emit``; each worker runs ``threads``
    torch threads (the worker sets them as it starts: ``GraderWorker``, ``EnvWorker``); the
    methods named in ``concurrent`` run beside a running call (the groups' ``concurrent``);
    ``preload_models=False``: the workers hold no model, and processes begin without the
    model modules (the :class:`~reasonrl.runtime.process.ProcessGroup` argument).

    ``start(factory, args_per_worker)`` builds one worker per entry, ``factory(*args)`` (a
    module-level callable: the processes import it), and returns their :class:`WorkerPool`.
    Raises InputError naming ``runtime.roles.<role>`` for a count or timeout no pool can use.
    """

    role: str
    count: int
    timeout_s: float
    where: Literal["process", "ray"] = "process"
    start_timeout_s: float = 120.0
    restarts: RestartPolicy = RestartPolicy()
    ray_options: dict[str, list] | None = field(default=None, compare=False)
    emit: Callable[..., None] | None = field(default=None, compare=False)
    threads: int = 1
    concurrent: tuple[str, ...] = ()
    preload_models: bool = True

    def __post_init__(self) -> None:
        key = f"runtime.roles.{self.role}"
        if type(self.count) is not int or self.count < 1:
            raise InputError(f"{key}.count = {self.count!r}: a pool of workers needs an integer >= 1")
        if not self.timeout_s > 0:
            raise InputError(f"{key}.timeout_s = {self.timeout_s!r}: expected a number > 0")
        if self.where not in ("process", "ray"):
            raise ValueError(f"PoolStart {self.role}: where = {self.where!r}, expected process or ray")

    def __call__(self, factory: Callable[..., Any], args_per_worker: list[tuple]) -> WorkerPool:
        if self.where == "process":
            group = ProcessGroup(factory, args_per_worker, name=self.role, timeout_s=self.timeout_s,
                                 start_timeout_s=self.start_timeout_s, concurrent=self.concurrent,
                                 preload_models=self.preload_models)
        else:
            from reasonrl.runtime.ray import RayGroup

            group = RayGroup(factory, args_per_worker, self.role, timeout_s=self.timeout_s,
                             start_timeout_s=self.start_timeout_s, concurrent=self.concurrent,
                             **(self.ray_options or {}))
        return WorkerPool(group, role=self.role, timeout_s=self.timeout_s, restarts=self.restarts, emit=self.emit)
