"""Data-parallel trainer ranks as one WorkerGroup: every call goes to every rank at once.

    group = RankGroup(launch, world=2, timeout_s=cfg.runtime.collective_timeout_s + 600)
    metrics = group.call("update", batch, lr, step=step)[0]    # every rank, the whole batch
    weights = group.first("weights")                             # rank 0's answer

``launch(rank)`` builds the WorkerGroup of one rank (a worker with ``connect(init_method,
incarnation)``, such as :class:`~reasonrl.workers.trainer_rank.TrainerRank`): a
:class:`~reasonrl.runtime.group.LocalGroup` for a rank in this process (rank 0 beside the
controller, so the synchronous rollout can share its module), a
:class:`~reasonrl.runtime.process.ProcessGroup` for a rank in a child process, or a Ray actor
group with the same ``submit``/``close``. The ranks are launched concurrently, then joined
into one process group (``connect`` on all of them, a rendezvous at
:func:`~reasonrl.trainer.distributed.loopback_init_method` unless another ``init_method`` is given).

Collectives only complete when every rank is in them, so :meth:`submit` starts the calls of
the ranks that run elsewhere before it runs those of the ranks in this process (which run at
once, in the caller's thread, bounded by the process group's own collective timeout).
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from reasonrl.runtime.group import LocalGroup, WorkerDied, WorkerGroup, WorkerTimeout
from reasonrl.trainer.distributed import CollectiveError, CollectiveTimeout, loopback_init_method

GRACE_S = 2.0
"""After one rank's call failed, how long the others are given to answer before the call
fails (they are usually stuck in a collective with the failed rank)."""


class RankGroup:
    """``world`` trainer ranks, rank ``r`` in the one-worker group ``launch(r)``.

    ``timeout_s`` bounds every call (all ranks together): a rank that has not answered by
    then makes it a :class:`~reasonrl.runtime.group.WorkerTimeout`, and so does a rank whose
    collective timed out (:class:`~reasonrl.trainer.distributed.CollectiveTimeout`); a rank whose
    process died makes it a :class:`~reasonrl.runtime.group.WorkerDied`. After such a failure
    the ranks' process group is unusable: :meth:`close` then kills the rank processes, and a
    new RankGroup (the restarted run) starts fresh. ``incarnation`` names this group in the trace.
    """

    def __init__(self, launch: Callable[[int], WorkerGroup], world: int, *, timeout_s: float,
                 init_method: str | None = None, name: str = "policy") -> None:
        if world < 1:
            raise ValueError(f"RankGroup {name}: world={world}; expected >= 1")
        self.name, self.size, self.timeout_s = name, world, timeout_s
        self.incarnation = uuid.uuid4().hex[:12]
        self.broken = False
        with ThreadPoolExecutor(world, thread_name_prefix=f"reasonrl-{name}-launch") as pool:
            launched = [pool.submit(launch, rank) for rank in range(world)]
            wait(launched)
        failed = next((f.exception() for f in launched if f.exception() is not None), None)
        self.groups: list[WorkerGroup] = [f.result() for f in launched if f.exception() is None]
        if failed is not None:
            self.broken = True
            self.close()
            raise failed
        try:
            self.pids = self.call("connect", init_method or loopback_init_method(), self.incarnation)
        except BaseException:
            self.close()
            raise

    @property
    def local(self) -> Any | None:
        """Rank 0's worker when it runs in this process (a LocalGroup), else None."""
        group = self.groups[0]
        return group.workers[0] if isinstance(group, LocalGroup) else None

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        """``method(*args, **kwargs)`` on every rank; the futures in rank order. The ranks
        elsewhere are started first, then those in this process run."""
        futures: list[Future | None] = [None] * self.size
        order = sorted(range(self.size), key=lambda r: isinstance(self.groups[r], LocalGroup))
        for rank in order:
            [futures[rank]] = self.groups[rank].submit(method, *args, **kwargs)
        return futures

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Every rank's result, in rank order, within ``timeout_s``; see the class for the failures."""
        futures = self.submit(method, *args, **kwargs)
        what = f"{self.name}.{method}"
        done, pending = wait(futures, timeout=self.timeout_s, return_when=FIRST_EXCEPTION)
        if pending and any(f.exception() is not None for f in done):
            done, pending = wait(futures, timeout=GRACE_S)
        errors = {rank: f.exception() for rank, f in enumerate(futures) if f in done and f.exception() is not None}
        if not pending and not errors:
            return [f.result() for f in futures]
        self.broken = True
        # a rank that failed by itself (or whose process died) is the cause; the others' collectives failed for it
        causes = [e for e in errors.values() if not isinstance(e, CollectiveError)]
        causes.sort(key=lambda e: not isinstance(e, WorkerDied))
        if causes:
            raise causes[0]
        late = [rank for rank, f in enumerate(futures) if f in pending]
        timed_out = [e for e in errors.values() if isinstance(e, CollectiveTimeout)]
        if late or timed_out:
            detail = "".join(f"; {e}" for e in timed_out)
            raise WorkerTimeout(f"{what}: ranks {late} did not answer within {self.timeout_s} s{detail}") from (
                timed_out[0] if timed_out else None)
        raise next(iter(errors.values()))

    def first(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` on every rank (so any collective in it meets), rank 0's result."""
        return self.call(method, *args, **kwargs)[0]

    def close(self) -> None:
        """Close every rank (each leaves the process group); after a failed call, kill the rank
        processes instead of waiting for calls that may never end (a rank in this process is
        closed: it cannot be killed, and its collectives have already timed out)."""
        here = os.getpid()
        for group in reversed(self.groups):
            if self.broken and here not in group.pids:
                group.kill()
            else:
                group.close()
        self.groups = []
