"""How the controller calls workers: a WorkerGroup of one role, methods called by name.

    group = LocalGroup([PolicyWorker(cfg, model_dir)])
    [metrics] = group.call("update", batch, lr)              # wait for every worker
    futures = group.submit("logprobs", rollout)              # or go on and wait later
    results = gather(futures, timeout_s=60, what="policy.logprobs")

Every call returns one :class:`~concurrent.futures.Future` per worker, so one controller
drives workers in its own process (:class:`LocalGroup`: the call runs at once and the
future is already done), in processes of their own (:class:`~reasonrl.runtime.process.ProcessGroup`)
or, later, as Ray actors. A worker never imports this module.
"""

from __future__ import annotations

from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Protocol


class WorkerTimeout(TimeoutError):
    """A worker did not answer a call within its timeout; the message names the call."""


class WorkerDied(RuntimeError):
    """A worker's process ended while calls to it were pending."""


class WorkerGroup(Protocol):
    """Workers of one role. ``submit`` calls ``method`` on every worker with the same
    arguments and returns their futures in worker order; ``call`` also waits for them."""

    size: int

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]: ...

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def close(self) -> None: ...


def gather(futures: list[Future], timeout_s: float | None, what: str) -> list[Any]:
    """The futures' results, waiting at most ``timeout_s`` seconds in all (None: no limit, for
    in-process calls); a worker's exception is raised here. WorkerTimeout names ``what``."""
    try:
        return [f.result(timeout=timeout_s) for f in futures]
    except FutureTimeout:
        raise WorkerTimeout(f"{what}: no answer within {timeout_s} s") from None


class LocalGroup:
    """Workers in this process: each call runs at once, in the caller's thread, and returns
    finished futures (an exception the method raised is in its future)."""

    def __init__(self, workers: list[Any]) -> None:
        if not workers:
            raise ValueError("LocalGroup: expected at least one worker")
        self.workers = list(workers)
        self.size = len(self.workers)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        futures = []
        for worker in self.workers:
            future: Future = Future()
            try:
                future.set_result(getattr(worker, method)(*args, **kwargs))
            except Exception as err:  # noqa: BLE001 - delivered through the future
                future.set_exception(err)
            futures.append(future)
        return futures

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return gather(self.submit(method, *args, **kwargs), None, f"{type(self.workers[0]).__name__}.{method}")

    def close(self) -> None:
        for worker in self.workers:
            close = getattr(worker, "close", None)
            if close is not None:
                close()
