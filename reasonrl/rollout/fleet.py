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

Failover, within the step: a worker that dies, does not answer a call within ``timeout_s``,
or is quarantined (its seconds per generated token past ``quarantine_ratio`` times the median
of the others' for ``quarantine_steps`` steps in a row, or :data:`RAISES_TO_QUARANTINE` calls
in a row that raised) is taken out of service at once; the groups it had not delivered wait
for the other workers, which take them as they become free, and are generated again whole
(the same seeds give the same draws): a group is never trained from parts. Each group has a
budget of ``group_retries`` failed dispatches; past it the group fails as a whole (left out
of the batch, a ``rollout_groups_failed`` event, the scheduler's ``failed`` fate). A group
that a second call raises on is not a worker's fault: that error ends the call. The worker
is replaced in the background under the :class:`~reasonrl.restarts.RestartPolicy` (restarts
in a row, back-off); its replacement loads the current (and staged) weights before it serves.
Events: ``rollout_worker_died`` / ``rollout_worker_hung`` (index, pid, groups moved, seconds
lost: the time its unfinished task had run, and ``workers``: the fleet's size then), ``rollout_worker_quarantined`` (why),
``rollout_worker_joined`` (the new pid, the version it serves, seconds from the failure),
``rollout_worker_gone`` (out of restarts: the others serve on; with none left the fleet
raises :class:`FleetError`). Per-worker counts (groups, tokens, busy seconds) accumulate
until :meth:`take_stats` as ``rollout/worker<i>/*``.

Weights: every version is delivered to every live worker and waited for. With a
:class:`~reasonrl.rollout.weight_sync.WeightSender` (workers holding weights of their own) a
version is first made the sender's exact copy in the rollout dtype; a worker recorded as
holding the version before it is sent the delta, any other the whole version. A worker that
joins (a replacement, one added by :meth:`RolloutFleet.resize`, a leaving one asked back)
loads the whole current (and staged) version before it serves and is recorded as holding
it, so the next version reaches it as a delta. Without a sender the workers share the
policy's module and nothing is copied.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, TimeoutError as FutureTimeout, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from reasonrl.restarts import RestartPolicy
from reasonrl.rollout.weight_sync import WeightSender, weights_bytes
from reasonrl.types import RolloutBatch, SamplingParams, WeightsDelta, WeightsUpdate

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
    pid: int  # the worker's process when the task was sent (a replaced worker has another)
    started: float = field(default_factory=time.perf_counter)
    step: int = -2  # the last decode step it reported a completion at
    done: bool = False
    reported: set[int] = field(default_factory=set)
    tokens: float = 0.0
    seconds: float = 0.0  # from sending to its answer, once answered


@dataclass
class _Call:
    """One :meth:`RolloutFleet.generate` or :meth:`RolloutFleet.generate_stream`: its arguments,
    its tasks, and the groups waiting for a worker, retried, or failed."""

    method: str
    prompts: list
    n: int
    params: SamplingParams
    seeds: Sequence[int]
    states: list | None
    tasks: list[_Task] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    """Groups not on any worker: all of them at first, then those moved off a failed worker."""
    tries: dict[int, int] = field(default_factory=dict)
    """Failed dispatches per group."""
    raised: dict[int, int] = field(default_factory=dict)
    """Groups a worker raised an exception on, and that worker's pid (the group avoids it)."""
    failed: list[int] = field(default_factory=list)
    """Groups out of retries (``rollout.group_retries``): never generated, never trained."""

    def running(self) -> list[_Task]:
        return [t for t in self.tasks if not t.done]


@dataclass
class _Slot:
    """Worker ``i`` of the fleet: ``live`` (serving), ``joining`` (starting: a replacement, or
    added by :meth:`RolloutFleet.resize`), ``leaving`` (removed by a resize: it takes no new
    groups and goes once free) or ``gone`` (out of restarts in a row); whether a resize
    removes it once it has joined; its restarts in a row, the calls in a row that raised, and
    the steps in a row it was slow."""

    state: str = "live"
    leave: bool = False
    in_a_row: int = 0
    restarted_at: float = -math.inf
    raised_in_a_row: int = 0
    slow_steps: int = 0
    slow_step: int = -1
    fresh: bool = False  # quarantined: its replacement's speed is measured afresh


class FleetError(RuntimeError):
    """The fleet has no worker left, or every group of a batch ran out of retries."""


RAISES_TO_QUARANTINE = 2
"""Calls in a row that raise on a worker (each on groups another worker then generates)
before the worker is quarantined."""

JOIN_WAIT_S = 0.05
"""How long the dispatcher sleeps, with groups waiting and no worker free, before it looks again."""

CLOSE_WAIT_S = 30.0
"""How long :meth:`RolloutFleet.close` waits for a replacement that is starting."""


class RolloutFleet:
    """N rollout workers (a WorkerGroup whose workers are RolloutWorkers) as one generator.

    ``max_new_tokens`` sizes the dispatch estimate; ``timeout_s`` bounds every call to a
    worker; ``restarts`` (a :class:`~reasonrl.restarts.RestartPolicy`) replaces a worker that
    died, hung or was quarantined, in the background; ``group_retries`` is each group's
    budget of failed dispatches; a worker is quarantined once its seconds per generated token
    are past ``quarantine_ratio`` times the median of the others', costing at least
    ``quarantine_min_s`` seconds, for ``quarantine_steps`` steps in a row (0: never), or after :data:`RAISES_TO_QUARANTINE` calls in a row that
    raised (a group a worker raised on goes to another one where there is one).
    ``detector`` (a :class:`~reasonrl.resilience.guards.SlowdownDetector`, or None)
    is fed each worker's seconds per generated token at ``clock()``'s step and shrinks a slow
    worker's share; ``emit(kind, **fields)`` writes events; ``streams`` and ``episodic`` are
    the workers'; ``failures`` are the exception types of a dead or hung worker (the runtime's);
    ``new_worker(i)`` gives the arguments of the group's ``grow`` for worker ``i`` (None: the
    fleet's size is fixed); ``sender`` ships the weights to workers that hold their own (None:
    they share the policy's module; see the module docstring).
    """

    def __init__(self, group, *, pad_id: int, streams: bool, episodic: bool, timeout_s: float, restarts: RestartPolicy,
                 group_retries: int, failures: tuple[type[BaseException], ...], quarantine_ratio: float = 0.0,
                 quarantine_steps: int = 3, quarantine_min_s: float = 0.0, detector=None, clock: Callable[[], int] = lambda: 0,
                 emit: Callable[..., None] = lambda kind, **f: None,
                 new_worker: Callable[[int], tuple] | None = None, sender: WeightSender | None = None) -> None:
        self.group, self.pad_id, self.timeout_s = group, pad_id, timeout_s
        self.restarts, self.group_retries = restarts, group_retries
        self.quarantine_ratio, self.quarantine_steps, self.quarantine_min_s = quarantine_ratio, quarantine_steps, quarantine_min_s
        self.failures = (*failures, FutureTimeout, TimeoutError)
        self.streams, self.episodic = streams, episodic
        self.detector, self.clock, self.emit = detector, clock, emit
        self.replacements = 0
        """Workers replaced so far (died, hung or quarantined)."""
        self._cond = threading.Condition()  # the slots and the weights; generation, weights and replacements run on different threads
        self._slots = [_Slot() for _ in range(group.size)]
        self._busy: dict[int, int] = {}  # tasks running per worker
        self.new_worker = new_worker
        self._target = group.size
        self._scaler: threading.Thread | None = None
        self._replacing: list[threading.Thread] = []
        self._closing = False
        self.current: WeightsUpdate | None = None
        """The weights the workers sample with (a replacement loads them)."""
        self.staged: WeightsUpdate | None = None
        """Lockstep: the weights staged for the next :meth:`load_staged`."""
        self.weight_sync_s = 0.0
        """Seconds the last weight delivery took until the slowest worker held them."""
        self.sender = sender
        self._stats = self._zero_stats()

    @property
    def size(self) -> int:
        """The workers of the fleet, whatever their state (joining ones included)."""
        with self._cond:
            return len(self._slots)

    def live(self) -> list[int]:
        """The workers serving now (not being replaced, not given up)."""
        with self._cond:
            return [i for i, s in enumerate(self._slots) if s.state == "live"]

    # ------------------------------------------------------------ dispatch
    def assign(self, prompts: Sequence[Sequence[int]], n: int, max_new_tokens: int,
               workers: Sequence[int] | None = None) -> list[int]:
        """The worker (of ``workers``, default all) of each group: fewest outstanding tokens,
        scaled by speed shares."""
        workers = list(range(self.size)) if workers is None else list(workers)
        share = {w: 1.0 for w in workers}
        if self.detector is not None and any(self.detector.is_slow("gen", w) for w in workers):
            share = self.detector.weights("gen", workers)
        load = {w: 0.0 for w in workers}
        out = []
        for ids in prompts:
            cost = n * (len(ids) + max_new_tokens)
            w = min(workers, key=lambda i: ((load[i] + cost) / share[i], i))
            load[w] += cost
            out.append(w)
        return out

    def _call(self, method: str, prompts, n: int, params: SamplingParams, seeds, states) -> _Call:
        if len(seeds) != len(prompts):
            raise ValueError(f"seeds: {len(seeds)} for {len(prompts)} prompts; expected one per prompt group")
        return _Call(method, prompts, n, params, seeds, states, waiting=list(range(len(prompts))))

    def _dispatch(self, call: _Call) -> None:
        """Send the waiting groups of ``call`` to the live workers without a task of it: as
        many as their share of the live workers, assigned among them by :meth:`assign` (at the
        start: all groups among all workers; after a failure: the free workers take the moved
        groups, the busy ones take the rest when they are done). Raises FleetError when no
        worker is left at all."""
        if not call.waiting:
            return
        with self._cond:  # a resize waits: a worker it removes is never sent a group
            self._dispatch_locked(call)

    def _dispatch_locked(self, call: _Call) -> None:
        live = [i for i, s in enumerate(self._slots) if s.state == "live"]
        if not live and all(s.state == "gone" for s in self._slots):
            raise FleetError(f"no rollout worker left: each of the {len(self._slots)} failed "
                             f"{self.restarts.budget} restarts in a row (resilience.rollout_restarts)")
        busy = {t.worker for t in call.running()}
        free = [w for w in live if w not in busy]
        if not free:
            return
        take = call.waiting[: math.ceil(len(call.waiting) * len(free) / len(live))]
        call.waiting = call.waiting[len(take):]
        owner = self.assign([call.prompts[g] for g in take], call.n, call.params.max_new_tokens, free)
        pids = self.group.pids
        for i, (g, w) in enumerate(zip(take, owner)):
            if pids[w] != call.raised.get(g):
                continue
            others = [u for u in live if pids[u] != call.raised[g]]  # a group avoids the worker that raised on it
            if not others:
                continue
            if any(u in free for u in others):
                owner[i] = next(u for u in others if u in free)
            else:
                owner[i] = -1
                call.waiting.append(g)
        for w in free:
            groups = sorted(g for g, o in zip(take, owner) if o == w)
            if groups:
                self._launch(call, w, groups)

    def _launch(self, call: _Call, worker: int, groups: list[int]) -> None:
        kwargs = {} if call.states is None else {"states": [call.states[g] for g in groups]}
        pid = self.group.pids[worker]
        future = self.group.submit_to(worker, call.method, [call.prompts[g] for g in groups], call.n, call.params,
                                      [call.seeds[g] for g in groups], **kwargs)
        self._stat(worker)["groups"] += len(groups)
        self._busy[worker] = self._busy.get(worker, 0) + 1
        call.tasks.append(_Task(worker, groups, future, pid))

    def _settled(self, call: _Call) -> list[_Task]:
        """Wait until a running task of ``call`` answers or passes its deadline (``timeout_s``
        from when it was sent), and return those that did; with groups waiting, look again
        after :data:`JOIN_WAIT_S` (a worker may have joined)."""
        running = call.running()
        if not running:
            with self._cond:
                self._cond.wait(JOIN_WAIT_S)
            return []
        due = min(t.started for t in running) + self.timeout_s - time.perf_counter()
        wait([t.future for t in running], max(0.0, min(due, JOIN_WAIT_S) if call.waiting else due), FIRST_COMPLETED)
        now = time.perf_counter()
        return [t for t in running if t.future.done() or now >= t.started + self.timeout_s]

    def _answer(self, task: _Task) -> Any:
        """The task's result (its exception raised), or FutureTimeout past its deadline."""
        if not task.future.done():
            raise FutureTimeout()
        return task.future.result(timeout=0)

    # ------------------------------------------------------------ failures
    def _failed(self, call: _Call, task: _Task, error: BaseException) -> None:
        """``task`` ended without an answer: the groups it had not reported wait for another
        worker (or fail, out of retries), and its worker is replaced (died, hung) or, after
        :data:`RAISES_TO_QUARANTINE` raises in a row, quarantined. A group that a second call
        raises on is not a worker's fault: that error ends the call."""
        try:
            moved = [g for g in task.groups if g not in task.reported]
            raised = not isinstance(error, self.failures)
            if raised:
                if any(g in call.raised for g in moved):
                    raise error
                call.raised.update((g, task.pid) for g in moved)
            for g in moved:
                call.tries[g] = call.tries.get(g, 0) + 1
                (call.failed if call.tries[g] > self.group_retries else call.waiting).append(g)
            out = [g for g in moved if call.tries[g] > self.group_retries]
            if out:
                self.emit("rollout_groups_failed", worker=task.worker, groups=len(out), retries=self.group_retries,
                          error=str(error)[:300])
            if raised:
                with self._cond:
                    slot = self._slots[task.worker]
                    slot.raised_in_a_row += 1
                    count = slot.raised_in_a_row
                if count >= RAISES_TO_QUARANTINE:
                    self._quarantine(task.worker, f"{count} calls in a row raised, the last: {str(error)[:200]}",
                                     groups_moved=len(moved))
            else:
                self._lost(task, error, len(moved))
        finally:
            self._free(task)  # last: a resize may remove the worker once it is free

    def _lost(self, task: _Task, error: BaseException, moved: int) -> None:
        """The worker of ``task`` died or hung: a ``rollout_worker_died`` or ``_hung`` event (its
        ``seconds_lost``: the time the task had run, whose work the survivors redo) and its
        replacement, unless another failure already took it out of service."""
        hung = isinstance(error, (TimeoutError, FutureTimeout))
        with self._cond:
            if task.worker >= len(self._slots):  # removed by a resize meanwhile
                return
            slot = self._slots[task.worker]
            if slot.state != "live" or self.group.pids[task.worker] != task.pid:
                return
            slot.state = "joining"
            workers = len(self._slots)
        if hung:
            error = TimeoutError(f"rollout[{task.worker}]: no answer within {self.timeout_s:g} s "
                                 f"(runtime.roles.rollout.timeout_s)")
        self.emit("rollout_worker_hung" if hung else "rollout_worker_died", worker=task.worker, pid=task.pid,
                  groups_moved=moved, seconds_lost=time.perf_counter() - task.started, workers=workers,
                  error=str(error)[:300])
        self._replace(task.worker, task.pid)

    def _quarantine(self, worker: int, reason: str, **fields: Any) -> None:
        """Take a live worker out of service (``rollout_worker_quarantined``) and replace it."""
        with self._cond:
            if worker >= len(self._slots) or self._slots[worker].state != "live":
                return
            slot = self._slots[worker]
            slot.state, slot.fresh = "joining", True
            pid = self.group.pids[worker]
        self.emit("rollout_worker_quarantined", worker=worker, pid=pid, reason=reason, **fields)
        self._replace(worker, pid)

    def _replace(self, worker: int, old_pid: int) -> None:
        self._start_tracked(threading.Thread(target=self._rejoin, args=(worker, old_pid),
                                             name=f"reasonrl-rollout{worker}-replace", daemon=True))

    def _start_tracked(self, thread: threading.Thread) -> None:
        """Start ``thread`` (a worker's replacement or return) as one that close() waits for;
        it starts under the lock, so close() never meets it unstarted."""
        with self._cond:
            self._replacing = [t for t in self._replacing if t.is_alive()] + [thread]
            thread.start()

    def _rejoin(self, worker: int, old_pid: int) -> None:
        """A replacement's thread: restart worker ``worker`` under the restart policy, load the
        current (and staged) weights, then put it back in service (``rollout_worker_joined``,
        its ``seconds`` from the failure to serving); out of restarts in a row, it is given up
        (``rollout_worker_gone``) and the others serve on."""
        slot, began, why = self._slots[worker], time.perf_counter(), ""
        while True:
            with self._cond:
                if self._closing:
                    return
                slot.in_a_row += 1
                attempt = slot.in_a_row
                if attempt > self.restarts.budget:
                    slot.state = "gone"
                    self._cond.notify_all()
                pause = slot.restarted_at + self.restarts.pause_s(attempt) - time.monotonic()
            if slot.state == "gone":
                self.emit("rollout_worker_gone", worker=worker, pid=old_pid, restarts=attempt - 1, error=why[:300],
                          live=len(self.live()))
                return
            if pause > 0:
                time.sleep(pause)
            try:
                self.group.restart(worker)
                slot.restarted_at = time.monotonic()
                self._bring_up(worker, began, replaced=old_pid, restarts=attempt)
                break
            except Exception as err:  # noqa: BLE001 - the next attempt, or give up
                slot.restarted_at, why = time.monotonic(), f"{type(err).__name__}: {err}"
        with self._cond:
            self.replacements += 1

    def _bring_up(self, worker: int, began: float, **fields: Any) -> None:
        """Load the current and staged weights into a started worker and put it in service
        once they are still the current ones (a delivery meanwhile goes round again), with a
        ``rollout_worker_joined`` event written in the same instant: its ``version`` is the one
        every worker serves then, ``seconds`` since ``began``, and ``fields``."""
        while True:
            with self._cond:
                current, staged = self.current, self.staged
            if current is not None:
                self.group.submit_to(worker, "load_weights", current).result(timeout=self.timeout_s)
            if staged is not None and staged is not current:
                self.group.submit_to(worker, "stage_weights", staged).result(timeout=self.timeout_s)
            with self._cond:
                if self.current is current and self.staged is staged:
                    slot = self._slots[worker]
                    slot.state = "leaving" if slot.leave else "live"
                    slot.raised_in_a_row = slot.slow_steps = 0
                    self._held_whole(worker, current, staged)
                    self.emit("rollout_worker_joined", worker=worker, pid=self.group.pids[worker],
                              version=None if current is None else current.version,
                              seconds=time.perf_counter() - began, **fields)
                    self._cond.notify_all()
                    return

    def _answered(self, task: _Task) -> None:
        """A task answered: its worker's restarts and raises in a row start again, and its
        figures count (:meth:`_account`); then its worker is free (a resize may remove it)."""
        with self._cond:
            if self.group.pids[task.worker] == task.pid:
                slot = self._slots[task.worker]
                slot.in_a_row = slot.raised_in_a_row = 0
        self._account(task)
        self._free(task)

    def _judge_speed(self, call: _Call) -> None:
        """Quarantine a worker whose seconds per generated token in ``call`` were more than
        ``quarantine_ratio`` times the median ``m`` of the other workers', and whose excess
        ``seconds - m * tokens`` was at least ``quarantine_min_s`` (a call of milliseconds is
        never slow for noise), for ``quarantine_steps`` steps in a row (steps by ``clock()``;
        several calls of one step count once)."""
        if not self.quarantine_ratio:
            return
        spent: dict[int, list[float]] = {}
        for t in call.tasks:
            if t.seconds and t.tokens:
                s = spent.setdefault(t.worker, [0.0, 0.0])
                s[0], s[1] = s[0] + t.seconds, s[1] + t.tokens
        speed = {w: s / tokens for w, (s, tokens) in spent.items()}
        if len(speed) < 2:
            return
        step = self.clock()
        for w, s in speed.items():
            others = statistics.median(v for u, v in speed.items() if u != w)
            ratio = s / others
            with self._cond:
                if w >= len(self._slots):  # removed by a resize since
                    continue
                slot = self._slots[w]
            if ratio <= self.quarantine_ratio or spent[w][0] - others * spent[w][1] < self.quarantine_min_s:
                slot.slow_steps = 0
                continue
            if slot.slow_step != step:
                slot.slow_steps, slot.slow_step = slot.slow_steps + 1, step
            if slot.slow_steps >= self.quarantine_steps:
                self._quarantine(w, f"{ratio:.1f}x the other workers' seconds per token for {slot.slow_steps} steps "
                                    f"(runtime.roles.rollout.quarantine_ratio={self.quarantine_ratio:g})",
                                 ratio=ratio, steps=slot.slow_steps)

    def _end(self, call: _Call, handed: int) -> None:
        """After a call: judge the workers' speeds; a FleetError when every group failed."""
        self._judge_speed(call)
        if call.failed and not handed:
            raise FleetError(f"every one of the {len(call.prompts)} groups of the batch failed on "
                             f"{self.group_retries + 1} dispatches (rollout.group_retries={self.group_retries})")

    def _free(self, task: _Task) -> None:
        """``task`` is over: its worker has one running task fewer."""
        if task.done:
            return
        task.done = True
        with self._cond:
            self._busy[task.worker] -= 1
            self._cond.notify_all()

    # ------------------------------------------------------------ size
    def resize(self, count: int) -> None:
        """Grow or shrink the fleet to ``count`` workers; thread-safe, returns at once. Added
        workers start on a thread of the fleet's, load the current (and staged) weights and
        then serve (``rollout_worker_joined`` with ``reason="scale"`` and the seconds it took);
        the workers past ``count`` (the highest indices) take no new group, finish the groups
        they hold and go (``rollout_worker_left``)."""
        if type(count) is not int or count < 1:
            raise ValueError(f"RolloutFleet.resize: count = {count!r}, expected an integer >= 1")
        if self.new_worker is None:
            raise FleetError("this rollout fleet cannot change its size: it was built without a way to start workers "
                             "(new_worker)")
        revived = []
        with self._cond:
            self._target = count
            for i, slot in enumerate(self._slots):
                slot.leave = i >= count
                if slot.state == "live" and slot.leave:
                    slot.state = "leaving"
                elif slot.state == "leaving" and not slot.leave:  # asked back before it went: weights first
                    slot.state = "joining"
                    revived.append(i)
            self._cond.notify_all()
        for i in revived:
            self._start_tracked(threading.Thread(target=self._rejoin_kept, args=(i,), name=f"reasonrl-rollout{i}-rejoin",
                                                 daemon=True))
        with self._cond:
            if self._scaler is None:
                self._scaler = threading.Thread(target=self._scale, name="reasonrl-rollout-scaler", daemon=True)
                self._scaler.start()

    @property
    def target(self) -> int:
        """The size last asked for (:meth:`resize`), or the size the fleet started with."""
        with self._cond:
            return self._target

    def wait_resized(self, timeout_s: float) -> None:
        """Wait until the fleet has the size last asked for with every worker of it serving (none
        joining or leaving; a worker given up stays given up): a lockstep run resizes between two
        collects, so each collect sees one size. FleetError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._scaler is not None or len(self._slots) != self._target or any(
                    s.state in ("joining", "leaving") for s in self._slots):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FleetError(f"the rollout fleet did not reach {self._target} serving workers within "
                                     f"{timeout_s} s (runtime.roles.rollout.timeout_s)")
                self._cond.wait(min(left, JOIN_WAIT_S))

    def _rejoin_kept(self, index: int) -> None:
        """A leaving worker asked back: the current weights, then service again."""
        try:
            self._bring_up(index, time.perf_counter(), replaced=None, reason="scale", workers=index + 1)
        except self.failures as err:  # dead or hung meanwhile: replaced as any other
            with self._cond:
                self._slots[index].state = "live"
            self._lost(_Task(index, [], Future(), self.group.pids[index]), err, 0)

    def _scale(self) -> None:
        """The scaler's thread: one worker at a time, add (the next index) or remove (the last,
        once it is free) until the fleet has the size last asked for."""
        while True:
            with self._cond:
                n = len(self._slots)
                if self._closing or n == self._target:
                    self._scaler = None
                    return
                if n < self._target:
                    index, action = n, "grow"
                    self._slots.append(_Slot(state="joining"))
                elif self._slots[-1].state in ("leaving", "gone") and not self._busy.get(n - 1):
                    index, action = n - 1, "shrink"
                    self._slots.pop()
                    self._busy.pop(index, None)
                else:  # the last worker is busy, or a replacement is starting: wait for it
                    self._cond.wait(JOIN_WAIT_S)
                    continue
            if action == "grow":
                self._add(index)
            else:
                pid = self.group.pids[index]
                self.group.shrink()
                self.emit("rollout_worker_left", worker=index, pid=pid, workers=index)

    def _add(self, index: int) -> None:
        """Start worker ``index`` and bring it up; on failure the fleet keeps the size it has
        (``rollout_scale_failed``)."""
        began = time.perf_counter()
        try:
            self.group.grow(self.new_worker(index))
            self._bring_up(index, began, replaced=None, reason="scale", workers=index + 1)
        except Exception as err:  # noqa: BLE001 - the fleet keeps the size it has
            with self._cond:
                if len(self.group.pids) > index:  # started, but could not load the weights
                    self.group.shrink()
                del self._slots[index:]
                self._target = len(self._slots)
            self.emit("rollout_scale_failed", worker=index, error=f"{type(err).__name__}: {err}"[:300],
                      workers=self._target)

    # ------------------------------------------------------------ the generator protocol
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int],
                 states: list | None = None) -> RolloutBatch:
        """``n`` samples of every prompt, dispatched by group; rows in prompt order, group ids
        the prompt indices, each token tagged with the version that sampled it. A group that
        ran out of retries is left out (its prompt index is missing from ``group_ids``)."""
        call = self._call("generate", prompts, n, params, seeds, states)
        parts: dict[int, RolloutBatch] = {}
        while call.waiting or call.running():
            self._dispatch(call)
            for task in self._settled(call):
                try:
                    batch = self._answer(task)
                except Exception as err:  # noqa: BLE001 - died, hung or raised: _failed decides
                    self._failed(call, task, err)
                    continue
                task.tokens = float(batch.lengths.sum())
                self._answered(task)
                for i, g in enumerate(task.groups):
                    parts[g] = batch.select(torch.arange(i * n, (i + 1) * n))
        self._end(call, len(parts))
        return _in_order(parts, n, self.pad_id)

    def generate_stream(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int],
                        on_groups_done: GroupsDone) -> "FleetStreamResult":
        """:meth:`generate` reporting groups to ``on_groups_done`` in (decode step, prompt index)
        order as the workers complete them, stopping every worker once it returns True (see
        the module docstring)."""
        call = self._call("stream", prompts, n, params, seeds, None)
        ready: list[tuple[int, int, RolloutBatch]] = []  # (step, group, its rows) not handed over yet
        handed: set[int] = set()
        rows_of: dict[int, RolloutBatch] = {}
        aborted_lengths: dict[int, list[int]] = {}
        stop_step: int | None = None
        while (call.waiting or call.running()) and stop_step is None:
            self._dispatch(call)
            running = call.running()
            if not running:
                self._settled(call)
                continue
            polls = {id(t): self.group.submit_to(t.worker, "poll_stream", POLL_WAIT_S)
                     for t in running if not t.future.done()}
            for task in running:
                finished = False
                try:
                    if id(task) in polls and time.perf_counter() < task.started + self.timeout_s:
                        entries = polls[id(task)].result(timeout=self.timeout_s)
                    else:
                        final = self._answer(task)
                        entries = final["entries"]
                        self._aborted(task, final, n, aborted_lengths)
                        finished = True
                except Exception as err:  # noqa: BLE001 - died, hung or raised: _failed decides
                    self._failed(call, task, err)
                    continue
                for step, local, rows in entries:
                    task.step = max(task.step, step)
                    for i, g in enumerate(local):
                        group = task.groups[g]
                        task.reported.add(group)
                        mine = rows.select(torch.arange(i * n, (i + 1) * n))
                        ready.append((step, group, mine))
                        rows_of[group] = mine
                        task.tokens += float(mine.lengths.sum())
                if finished:
                    self._answered(task)
            # groups not handed over may still complete at any step until they are on a worker
            frontier = -math.inf if call.waiting else min((t.step for t in call.running()), default=math.inf)
            ready.sort(key=lambda e: (e[0], e[1]))
            while ready and ready[0][0] <= frontier and stop_step is None:
                step = ready[0][0]
                now = [e for e in ready if e[0] == step]
                ready = ready[len(now):]
                groups = [g for _, g, _ in now]
                handed.update(groups)
                batch = _in_order({g: r for _, g, r in now}, n, self.pad_id)
                if on_groups_done(groups, batch):
                    stop_step = step
        if stop_step is not None:
            self._stop(call, n, rows_of, aborted_lengths)
        self._end(call, len(handed))
        failed = set(call.failed)
        aborted = [g for g in range(len(prompts)) if g not in handed and g not in failed]
        cap = math.inf if stop_step is None else stop_step + 1
        lengths = []
        for g in aborted:
            known = rows_of[g].lengths.tolist() if g in rows_of else aborted_lengths.get(g, [0] * n)
            lengths += [int(min(length, cap)) for length in known]
        return FleetStreamResult(aborted, lengths, stop_step is not None, sorted(failed))

    def _stop(self, call: _Call, n: int, rows_of: dict[int, RolloutBatch], aborted_lengths: dict[int, list[int]]) -> None:
        """The callback stopped the stream: tell every running worker to stop, and record the
        rows of what they had; groups still waiting are aborted unstarted."""
        call.waiting = []
        running = call.running()
        for task in running:
            self.group.submit_to(task.worker, "stop_stream")
        for task in running:
            try:
                final = task.future.result(timeout=max(0.0, task.started + self.timeout_s - time.perf_counter()))
            except Exception as err:  # noqa: BLE001 - its groups are aborted anyway
                if isinstance(err, self.failures):
                    self._lost(task, err, 0)
                self._free(task)
                continue
            for step, local, rows in final["entries"]:
                for i, g in enumerate(local):
                    rows_of[task.groups[g]] = rows.select(torch.arange(i * n, (i + 1) * n))
                    task.tokens += float(rows_of[task.groups[g]].lengths.sum())
            self._aborted(task, final, n, aborted_lengths)
            self._answered(task)

    # ------------------------------------------------------------ weights
    def load_weights(self, update: WeightsUpdate) -> dict[str, float]:
        """Every worker samples with ``update`` from now on (each waited for); the
        :meth:`_deliver` figures."""
        version = self._version(update)
        return self._deliver("load_weights", version, current=version)

    def offer_weights(self, update: WeightsUpdate) -> dict[str, float]:
        """Every worker takes ``update`` up before its next generation call; the
        :meth:`_deliver` figures."""
        version = self._version(update)
        return self._deliver("offer_weights", version, current=version)

    def stage_weights(self, update: WeightsUpdate) -> dict[str, float]:
        """Every worker keeps ``update`` for :meth:`load_staged` (the transfer happens now);
        the :meth:`_deliver` figures."""
        version = self._version(update)
        return self._deliver("stage_weights", version, staged=version)

    def load_staged(self, version: int) -> None:
        """Every worker samples with its staged weights, which must be ``version``; a worker
        replaced meanwhile loads them when it joins."""
        with self._cond:
            self.current = self.staged
            workers = [i for i, s in enumerate(self._slots) if s.state == "live"]
        self._on_workers(workers, "load_staged", version)

    def _version(self, update: WeightsUpdate) -> WeightsUpdate:
        """The version the workers are to hold for the trainer's ``update``: the sender's copy
        (the base of the next delta), or ``update`` itself without a sender."""
        return update if self.sender is None else self.sender.version(update)

    def _held_whole(self, worker: int, current: WeightsUpdate | None, staged: WeightsUpdate | None) -> None:
        """Record what a joining worker holds once it has loaded ``current`` and then staged
        ``staged`` whole (the newer of the two), so the next version reaches it as a delta."""
        newest = staged if staged is not None and staged is not current else current
        if self.sender is not None and newest is not None:
            self.sender.held((worker, self.group.pids[worker]), newest)

    def _deliver(self, method: str, update: WeightsUpdate, *, current: WeightsUpdate | None = None,
                 staged: WeightsUpdate | None = None) -> dict[str, float]:
        """Record the weights (a replacement loads them), then ``method`` on every live worker
        with its message for ``update``: the delta or the whole version (see the module
        docstring). Returns ``weight_sync/bytes``, the tensor bytes sent to all of them, and
        ``weight_sync/delta_frac``, those bytes over their count times one whole version's
        (in the dtype versions ship in): the mean over the workers of the fraction each was
        sent. Both are 0 without a sender (nothing is copied). A LoRA run's versions add
        ``weight_sync/adapter_only``: 1 when they are the adapters alone, 0 when merged weights
        (:attr:`~reasonrl.types.WeightsUpdate.kind`)."""
        began = time.perf_counter()
        with self._cond:
            self.current = current or self.current
            self.staged = staged or self.staged
            workers = [i for i, s in enumerate(self._slots) if s.state == "live"]
            pids = self.group.pids
            messages: list[WeightsUpdate | WeightsDelta] = [update] * len(workers)
            if self.sender is not None:
                self.sender.keep(list(enumerate(pids)))
                messages = [self.sender.message((w, pids[w]), update) for w in workers]
        for w in self._wait_each(workers, self._submit_each(workers, method, messages), pids):
            if self.sender is not None:
                self.sender.held((w, pids[w]), update)
        self.weight_sync_s = time.perf_counter() - began
        lora = {} if update.kind == "full" else {"weight_sync/adapter_only": float(update.kind == "adapters")}
        if self.sender is None or not workers:
            return {"weight_sync/bytes": 0.0, "weight_sync/delta_frac": 0.0, **lora}
        sent = float(sum(weights_bytes(m) for m in messages))
        return {"weight_sync/bytes": sent, "weight_sync/delta_frac": sent / (len(workers) * weights_bytes(update)), **lora}

    def _on_workers(self, workers: list[int], method: str, arg) -> None:
        """``method(arg)`` on each of ``workers``, each waited for; a worker that dies or hangs
        is replaced (its replacement starts from the current and staged weights)."""
        pids = self.group.pids
        self._wait_each(workers, self._submit_each(workers, method, [arg] * len(workers)), pids)

    def _submit_each(self, workers: list[int], method: str, args: list) -> list[Future]:
        """``method(args[k])`` submitted to ``workers[k]``: as one call to the whole group when
        every worker gets the same object (a runtime that stores it once then does: Ray)."""
        if workers == list(range(len(self.group.pids))) and all(a is args[0] for a in args):
            return self.group.submit(method, args[0])
        return [self.group.submit_to(w, method, a) for w, a in zip(workers, args)]

    def _wait_each(self, workers: list[int], futures: list[Future], pids: list[int]) -> list[int]:
        """Wait for each of ``futures`` (``workers``' calls, chosen for the processes ``pids``);
        the workers that answered. A worker that dies or hangs is replaced (its replacement
        starts from the current and staged weights). A call that reached a replacement
        started meanwhile (a delta it cannot apply, say) is left to that replacement, which
        loads the whole current and staged weights before it serves."""
        answered = []
        for w, future in zip(workers, futures):
            try:
                future.result(timeout=self.timeout_s)
            except Exception as err:  # noqa: BLE001 - died, hung, or reached a replacement: below
                now = self.group.pids
                if w >= len(now) or now[w] != pids[w]:
                    continue
                if not isinstance(err, self.failures):
                    raise
                self._lost(_Task(w, [], future, pids[w]), err, 0)
            else:
                answered.append(w)
        return answered

    # ------------------------------------------------------------ per-worker figures
    def _zero_stats(self) -> list[dict[str, float]]:
        return [{"groups": 0.0, "tokens": 0.0, "busy_s": 0.0} for _ in range(len(self._slots))]

    def _stat(self, worker: int) -> dict[str, float]:
        while len(self._stats) <= worker:  # a worker added since the last take_stats
            self._stats.append({"groups": 0.0, "tokens": 0.0, "busy_s": 0.0})
        return self._stats[worker]

    @staticmethod
    def _aborted(task: _Task, final: dict, n: int, lengths: dict[int, list[int]]) -> None:
        """Record the row lengths of the groups a finished stream task aborted (its own indices)."""
        for i, g in enumerate(final["aborted"]):
            lengths[task.groups[g]] = final["aborted_lengths"][i * n : (i + 1) * n]
            task.tokens += sum(lengths[task.groups[g]])

    def _account(self, task: _Task) -> None:
        """A task answered: its worker's busy seconds and tokens, and its speed for the
        fail-slow detector (the record of a quarantined worker's replacement starts over; a
        worker replaced after a death or hang keeps its index's record)."""
        s, task.seconds = self._stat(task.worker), time.perf_counter() - task.started
        s["tokens"] += task.tokens
        s["busy_s"] += task.seconds
        if self.detector is not None:
            with self._cond:
                slot = self._slots[task.worker] if task.worker < len(self._slots) else _Slot()
            if slot.fresh:
                self.detector.forget("gen", task.worker)
                slot.fresh = False
            self.detector.update("gen", task.worker, self.clock(), task.seconds, work=max(task.tokens, 1.0))

    def take_stats(self) -> dict[str, float]:
        """``rollout/worker<i>/groups``, ``/tokens``, ``/busy_s`` since the last call, of every
        worker in the fleet now and of every one that left since and served meanwhile, and
        ``rollout/live_workers`` now."""
        with self._cond:
            out = {f"rollout/worker{i}/{k}": v for i, s in enumerate(self._stats)
                   if i < len(self._slots) or any(s.values()) for k, v in s.items()}
            out["rollout/live_workers"] = float(sum(s.state == "live" for s in self._slots))
            self._stats = self._zero_stats()
        return out

    def close(self) -> None:
        """Stop replacing and adding workers (one starting is waited for, up to
        :data:`CLOSE_WAIT_S`), then close the group."""
        with self._cond:
            self._closing = True
            replacing = [t for t in (*self._replacing, self._scaler) if t is not None]
            self._cond.notify_all()
        for thread in replacing:
            thread.join(timeout=CLOSE_WAIT_S)
        self.group.close()


@dataclass
class FleetStreamResult:
    """What :meth:`RolloutFleet.generate_stream` returns: the groups never handed to the
    callback (ascending prompt indices), each row's length at the stop, and whether the
    callback stopped it (the scheduler's view of a
    :class:`~reasonrl.rollout.fast.StreamResult`), and the groups that ran out of retries
    (never handed over, not aborted)."""

    aborted: list[int]
    aborted_lengths: list[int]
    stopped: bool
    failed: list[int] = field(default_factory=list)


def _in_order(parts: dict[int, RolloutBatch], n: int, pad_id: int) -> RolloutBatch:
    """The groups of ``parts`` as one batch, ascending group index, ``group_ids`` = the index."""
    order = sorted(parts)
    batch = RolloutBatch.concat([parts[g] for g in order], pad_id)
    batch.group_ids = torch.tensor(order, dtype=torch.long).repeat_interleave(n)
    return batch
