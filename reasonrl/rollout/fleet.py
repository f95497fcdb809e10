"""The rollout fleet: N rollout workers behind the one generator the rollout scheduler samples with.

    fleet = RolloutFleet(group, n_tokens=..., ...)     # group: a WorkerGroup of RolloutWorkers
    batch = fleet.generate(prompts, n, params, seeds)   # groups dispatched, rows back in prompt order
    fleet.generate_stream(prompts, n, params, seeds, on_groups_done)   # early stop across workers

Dispatch is per group: each prompt group goes to the worker with the fewest outstanding
tokens (``n * (prompt length + max_new_tokens)`` of the groups it holds, divided by its
share of the fleet's speed once the fail-slow detector has found it slow; ties to the lowest
index), so a fixed count of workers gets a fixed assignment and a lockstep run stays
deterministic. A group's sampling randomness comes from its own seed
(:mod:`reasonrl.rollout.seeds`), so which worker serves it does not change its draws.

Streaming (dynamic sampling with early stop): every worker decodes its share and reports
each group at the decode step where it completes (:class:`StreamOutbox`, read with
``poll_stream``). The fleet hands groups to the scheduler's callback in (decode step, prompt
index) order, the order one worker over the whole batch would report them, and only once
every worker still decoding has passed that step; when the callback stops, the workers are
told to stop and every group not handed over is aborted with its rows' lengths as of that
step. The scheduler's batch is therefore the one a single worker would give it.

A worker that dies or stops answering within ``timeout_s`` is replaced (``restart``, then
the current weights) and the groups it had not delivered are dispatched again, whole (the
same seeds give the same draws), at most ``max_restarts`` times in a run; every replacement
is a ``rollout_worker_died`` or ``rollout_worker_hung`` event naming the index, the pid and
the groups moved. Per-worker counts (groups, tokens, busy seconds) accumulate until
:meth:`take_stats` as ``rollout/worker<i>/*``.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from reasonrl.types import RolloutBatch, SamplingParams, WeightsUpdate

GroupsDone = Callable[[list[int], RolloutBatch], bool]

POLL_WAIT_S = 0.02
"""How long one ``poll_stream`` waits in the worker for news before answering."""

FLEET_CONCURRENT = ("offer_weights", "stage_weights", "poll_stream", "stop_stream")
"""The rollout worker's methods that run beside a running generation call."""


class StreamOutbox:
    """A worker's side of a streamed generation: the groups completed so far, waiting to be
    polled, and the stop request. Thread-safe: the decode loop fills it, polls drain it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: list[tuple[int, list[int], RolloutBatch]] = []
        self._stop = False
        self._finished = True

    def open(self) -> None:
        with self._cond:
            self._entries, self._stop, self._finished = [], False, False

    def put(self, groups: list[int], rows: RolloutBatch) -> bool:
        """Record ``groups`` (completed at the decode step their longest row ends); True when
        a stop was requested."""
        step = int(rows.lengths.max()) - 1 if rows.size else -1
        with self._cond:
            self._entries.append((step, groups, rows))
            self._cond.notify_all()
            return self._stop

    def close(self) -> list[tuple[int, list[int], RolloutBatch]]:
        """End the stream; the entries not polled yet."""
        with self._cond:
            self._finished = True
            entries, self._entries = self._entries, []
            self._cond.notify_all()
            return entries

    def poll(self, wait_s: float) -> list[tuple[int, list[int], RolloutBatch]]:
        """The entries since the last poll, waiting up to ``wait_s`` for one."""
        with self._cond:
            if not self._entries and not self._finished:
                self._cond.wait(wait_s)
            entries, self._entries = self._entries, []
            return entries

    def stop(self) -> None:
        with self._cond:
            self._stop = True

    @property
    def stopping(self) -> bool:
        with self._cond:
            return self._stop


@dataclass
class _Task:
    """Groups (global prompt indices, ascending) on one worker, and what it reported of them."""

    worker: int
    groups: list[int]
    future: Future
    pid: int = 0  # the worker's process when the task was sent (a replaced worker has another)
    started: float = field(default_factory=time.perf_counter)
    step: int = -2  # the last decode step it reported a completion at
    done: bool = False
    reported: set[int] = field(default_factory=set)
    tokens: float = 0.0


class FleetError(RuntimeError):
    """The fleet ran out of restarts, or has no worker left to serve a group."""


class RolloutFleet:
    """N rollout workers (a WorkerGroup whose workers are RolloutWorkers) as one generator.

    ``max_new_tokens`` sizes the dispatch estimate; ``timeout_s`` bounds every wait for a
    worker; ``max_restarts`` is the fleet's budget of worker replacements; ``detector`` (a
    :class:`~reasonrl.resilience.guards.SlowdownDetector`, or None) is fed each worker's
    seconds per generated token at ``clock()``'s step and shrinks a slow worker's share;
    ``emit(kind, **fields)`` writes events; ``streams`` and ``episodic`` are the workers';
    ``failures`` are the exception types of a dead or hung worker (the runtime's).
    """

    def __init__(self, group, *, pad_id: int, streams: bool, episodic: bool, timeout_s: float, max_restarts: int,
                 failures: tuple[type[BaseException], ...], detector=None, clock: Callable[[], int] = lambda: 0,
                 emit: Callable[..., None] = lambda kind, **f: None) -> None:
        self.group, self.pad_id, self.timeout_s, self.max_restarts = group, pad_id, timeout_s, max_restarts
        self.failures = (*failures, FutureTimeout, TimeoutError)
        self.streams, self.episodic = streams, episodic
        self.detector, self.clock, self.emit = detector, clock, emit
        self.restarts = 0
        self._lock = threading.Lock()  # generation and weight delivery run on different threads
        self.current: WeightsUpdate | None = None
        """The weights the workers sample with (a replacement loads them)."""
        self.staged: WeightsUpdate | None = None
        """Lockstep: the weights staged for the next :meth:`load_staged`."""
        self.weight_sync_s = 0.0
        """Seconds the last weight delivery took until the slowest worker held them."""
        self._stats = self._zero_stats()

    @property
    def size(self) -> int:
        return self.group.size

    # ------------------------------------------------------------ dispatch
    def assign(self, prompts: Sequence[Sequence[int]], n: int, max_new_tokens: int) -> list[int]:
        """The worker of each group: fewest outstanding tokens, scaled by speed shares."""
        workers = list(range(self.size))
        share = [1.0 / self.size] * self.size
        if self.detector is not None and any(self.detector.is_slow("gen", w) for w in workers):
            weights = self.detector.weights("gen", workers)
            share = [weights[w] for w in workers]
        load = [0.0] * self.size
        out = []
        for ids in prompts:
            cost = n * (len(ids) + max_new_tokens)
            w = min(workers, key=lambda i: ((load[i] + cost) / share[i], i))
            load[w] += cost
            out.append(w)
        return out

    def _launch(self, worker: int, groups: list[int], method: str, prompts, n, params, seeds, states) -> _Task:
        kwargs = {} if states is None else {"states": [states[g] for g in groups]}
        pid = self.group.pids[worker]
        future = self.group.submit_to(worker, method, [prompts[g] for g in groups], n, params,
                                      [seeds[g] for g in groups], **kwargs)
        self._stats[worker]["groups"] += len(groups)
        return _Task(worker, groups, future, pid)

    def _tasks(self, method: str, prompts, n: int, params: SamplingParams, seeds, states) -> list[_Task]:
        if len(seeds) != len(prompts):
            raise ValueError(f"seeds: {len(seeds)} for {len(prompts)} prompts; expected one per prompt group")
        owner = self.assign(prompts, n, params.max_new_tokens)
        tasks = []
        for w in range(self.size):
            groups = [g for g, o in enumerate(owner) if o == w]
            if groups:
                tasks.append(self._launch(w, groups, method, prompts, n, params, seeds, states))
        return tasks

    # ------------------------------------------------------------ failures
    def _replace(self, task: _Task, error: BaseException) -> None:
        """Replace the task's worker after ``error`` (loaded with the current weights), unless
        another thread already replaced that process."""
        with self._lock:
            if self.group.pids[task.worker] == task.pid:
                self._restart(task, error)

    def _restart(self, task: _Task, error: BaseException) -> None:
        hung = isinstance(error, (TimeoutError, FutureTimeout))
        pid = task.pid
        if hung:
            error = TimeoutError(f"rollout[{task.worker}]: no answer within {self.timeout_s:g} s "
                                 f"(runtime.roles.rollout.timeout_s)")
        if self.restarts >= self.max_restarts:
            raise FleetError(f"rollout worker {task.worker} (pid {pid}): {error}; gave up after {self.restarts} "
                             f"replacements (resilience.rollout_restarts={self.max_restarts})") from error
        self.restarts += 1
        began = time.perf_counter()
        self.group.restart(task.worker)
        if self.current is not None:
            self.group.submit_to(task.worker, "load_weights", self.current).result(timeout=self.timeout_s)
        if self.staged is not None and self.staged is not self.current:
            self.group.submit_to(task.worker, "stage_weights", self.staged).result(timeout=self.timeout_s)
        moved = [g for g in task.groups if g not in task.reported]
        self.emit("rollout_worker_hung" if hung else "rollout_worker_died", worker=task.worker, pid=pid,
                  new_pid=self.group.pids[task.worker], groups_moved=len(moved), error=str(error)[:300],
                  restarts=self.restarts, seconds_lost=time.perf_counter() - began)

    def _result(self, task: _Task) -> Any:
        return task.future.result(timeout=self.timeout_s)

    # ------------------------------------------------------------ the generator protocol
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int],
                 states: list | None = None) -> RolloutBatch:
        """``n`` samples of every prompt, dispatched by group; rows in prompt order, group ids
        the prompt indices, each token tagged with the version that sampled it."""
        pending = self._tasks("generate", prompts, n, params, seeds, states)
        parts: dict[int, RolloutBatch] = {}
        while pending:
            task = pending.pop(0)
            try:
                batch = self._result(task)
            except self.failures as err:
                self._replace(task, err)
                pending.append(self._launch(task.worker, task.groups, "generate", prompts, n, params, seeds, states))
                continue
            task.tokens = float(batch.lengths.sum())
            self._account(task)
            for i, g in enumerate(task.groups):
                parts[g] = batch.select(torch.arange(i * n, (i + 1) * n))
        return _in_order(parts, n, self.pad_id)

    def generate_stream(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int],
                        on_groups_done: GroupsDone) -> "FleetStreamResult":
        """:meth:`generate` reporting groups to ``on_groups_done`` in (decode step, prompt index)
        order as the workers complete them, stopping every worker once it returns True (see
        the module docstring)."""
        tasks = self._tasks("stream", prompts, n, params, seeds, None)
        waiting: list[tuple[int, int, RolloutBatch]] = []  # (step, group, its rows) not handed over yet
        handed: set[int] = set()
        rows_of: dict[int, RolloutBatch] = {}
        aborted_lengths: dict[int, list[int]] = {}
        stop_step: int | None = None
        while any(not t.done for t in tasks) and stop_step is None:
            for task in [t for t in tasks if not t.done]:
                try:
                    if task.future.done():
                        final = self._result(task)
                        entries, task.done = final["entries"], True
                        self._aborted(task, final, n, aborted_lengths)
                    else:
                        entries = self.group.submit_to(task.worker, "poll_stream", POLL_WAIT_S).result(timeout=self.timeout_s)
                except self.failures as err:
                    self._replace(task, err)
                    task.done = True
                    rest = [g for g in task.groups if g not in task.reported]
                    if rest:
                        tasks.append(self._launch(task.worker, rest, "stream", prompts, n, params, seeds, None))
                    continue
                for step, local, rows in entries:
                    task.step = max(task.step, step)
                    for i, g in enumerate(local):
                        group = task.groups[g]
                        task.reported.add(group)
                        mine = rows.select(torch.arange(i * n, (i + 1) * n))
                        waiting.append((step, group, mine))
                        rows_of[group] = mine
                        task.tokens += float(mine.lengths.sum())
                if task.done:
                    self._account(task)
            frontier = min((t.step for t in tasks if not t.done), default=math.inf)
            waiting.sort(key=lambda e: (e[0], e[1]))
            while waiting and waiting[0][0] <= frontier and stop_step is None:
                step = waiting[0][0]
                now = [e for e in waiting if e[0] == step]
                waiting = waiting[len(now):]
                groups = [g for _, g, _ in now]
                handed.update(groups)
                batch = _in_order({g: r for _, g, r in now}, n, self.pad_id)
                if on_groups_done(groups, batch):
                    stop_step = step
        if stop_step is not None:
            for task in tasks:
                if not task.done:
                    self.group.submit_to(task.worker, "stop_stream")
            for task in tasks:
                if task.done:
                    continue
                try:
                    final = self._result(task)
                except self.failures as err:  # its groups are aborted anyway; the worker is replaced
                    self._replace(task, err)
                    continue
                task.done = True
                for step, local, rows in final["entries"]:
                    for i, g in enumerate(local):
                        rows_of[task.groups[g]] = rows.select(torch.arange(i * n, (i + 1) * n))
                        task.tokens += float(rows_of[task.groups[g]].lengths.sum())
                self._aborted(task, final, n, aborted_lengths)
                self._account(task)
        aborted = [g for g in range(len(prompts)) if g not in handed]
        cap = math.inf if stop_step is None else stop_step + 1
        lengths = []
        for g in aborted:
            known = rows_of[g].lengths.tolist() if g in rows_of else aborted_lengths.get(g, [0] * n)
            lengths += [int(min(length, cap)) for length in known]
        return FleetStreamResult(aborted, lengths, stop_step is not None)

    # ------------------------------------------------------------ weights
    def load_weights(self, update: WeightsUpdate) -> None:
        """Every worker samples with ``update`` from now on (each waited for)."""
        self.current = update
        self._deliver("load_weights", update)

    def offer_weights(self, update: WeightsUpdate) -> None:
        """Every worker takes ``update`` up before its next generation call."""
        self.current = update
        self._deliver("offer_weights", update)

    def stage_weights(self, update: WeightsUpdate) -> None:
        """Every worker keeps ``update`` for :meth:`load_staged` (the transfer happens now)."""
        self.staged = update
        self._deliver("stage_weights", update)

    def load_staged(self, version: int) -> None:
        """Every worker samples with its staged weights, which must be ``version``; a worker
        replaced meanwhile loads them at its restart."""
        self.current = self.staged
        self._on_every_worker("load_staged", version)

    def _deliver(self, method: str, update: WeightsUpdate) -> None:
        began = time.perf_counter()
        self._on_every_worker(method, update)
        self.weight_sync_s = time.perf_counter() - began

    def _on_every_worker(self, method: str, arg) -> None:
        """``method(arg)`` on every worker, each waited for; a worker that fails is replaced
        (its replacement starts from the current and staged weights)."""
        pids = self.group.pids
        for i, future in enumerate(self.group.submit(method, arg)):
            try:
                future.result(timeout=self.timeout_s)
            except self.failures as err:
                self._replace(_Task(i, [], future, pids[i]), err)

    # ------------------------------------------------------------ per-worker figures
    def _zero_stats(self) -> list[dict[str, float]]:
        return [{"groups": 0.0, "tokens": 0.0, "busy_s": 0.0} for _ in range(self.group.size)]

    @staticmethod
    def _aborted(task: _Task, final: dict, n: int, lengths: dict[int, list[int]]) -> None:
        """Record the row lengths of the groups a finished stream task aborted (its own indices)."""
        for i, g in enumerate(final["aborted"]):
            lengths[task.groups[g]] = final["aborted_lengths"][i * n : (i + 1) * n]
            task.tokens += sum(lengths[task.groups[g]])

    def _account(self, task: _Task) -> None:
        """A task ended: its worker's busy seconds and tokens, and its speed for the fail-slow detector."""
        s, seconds = self._stats[task.worker], time.perf_counter() - task.started
        s["tokens"] += task.tokens
        s["busy_s"] += seconds
        if self.detector is not None:
            self.detector.update("gen", task.worker, self.clock(), seconds, work=max(task.tokens, 1.0))

    def take_stats(self) -> dict[str, float]:
        """``rollout/worker<i>/groups``, ``/tokens``, ``/busy_s`` since the last call."""
        out = {f"rollout/worker{i}/{k}": v for i, s in enumerate(self._stats) for k, v in s.items()}
        self._stats = self._zero_stats()
        return out

    def close(self) -> None:
        self.group.close()


@dataclass
class FleetStreamResult:
    """What :meth:`RolloutFleet.generate_stream` returns: the groups never handed to the
    callback (ascending prompt indices), each row's length at the stop, and whether the
    callback stopped it (the scheduler's view of a
    :class:`~reasonrl.rollout.fast.StreamResult`)."""

    aborted: list[int]
    aborted_lengths: list[int]
    stopped: bool


def _in_order(parts: dict[int, RolloutBatch], n: int, pad_id: int) -> RolloutBatch:
    """The groups of ``parts`` as one batch, ascending group index, ``group_ids`` = the index."""
    order = sorted(parts)
    batch = RolloutBatch.concat([parts[g] for g in order], pad_id)
    batch.group_ids = torch.tensor(order, dtype=torch.long).repeat_interleave(n)
    return batch
