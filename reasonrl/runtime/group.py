"""How the controller calls workers: a WorkerGroup of one role, methods called by name.

    group = LocalGroup([PolicyWorker(cfg, model_dir)])
    [metrics] = group.call("update", batch, lr)              # wait for every worker
    futures = group.submit("logprobs", rollout)              # or go on and wait later
    results = gather(futures, timeout_s=60, what="policy.logprobs")

Every call returns one :class:`~concurrent.futures.Future` per worker, so one controller
drives workers in its own process (:class:`LocalGroup`: the call runs at once and the
future is already done; :class:`ThreadGroup`: each worker serves its calls on a thread of
its own), in processes of their own (:class:`~reasonrl.runtime.process.ProcessGroup`) or as
Ray actors (:class:`~reasonrl.runtime.ray.RayGroup`). A worker never imports this module.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Protocol


class WorkerTimeout(TimeoutError):
    """A worker did not answer a call within its timeout; the message names the call."""


class WorkerDied(RuntimeError):
    """A worker's process ended while calls to it were pending."""


class WorkerGroup(Protocol):
    """Workers of one role. ``submit`` calls ``method`` on every worker with the same
    arguments and returns their futures in worker order; ``submit_to`` calls one worker;
    ``call`` also waits for them. ``pids`` are the workers' process ids; ``restart(i)``
    replaces worker ``i`` by a new one built from the same arguments (its calls in flight
    fail); ``kill`` ends every worker at once. A group whose size can change (threads,
    processes, Ray actors) also has ``grow(args)`` (one more worker, the next index) and
    ``shrink()`` (the last one finishes its calls and goes)."""

    size: int

    @property
    def pids(self) -> list[int]: ...

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]: ...

    def submit_to(self, index: int, method: str, *args: Any, **kwargs: Any) -> Future: ...

    def restart(self, index: int) -> None: ...

    def kill(self) -> None: ...

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def close(self) -> None: ...


def gather(futures: list[Future], timeout_s: float | None, what: str) -> list[Any]:
    """The futures' results, waiting at most ``timeout_s`` seconds in all (None: no limit, for
    in-process calls); a worker's exception is raised here. WorkerTimeout names ``what``."""
    try:
        return [f.result(timeout=timeout_s) for f in futures]
    except FutureTimeout:
        raise WorkerTimeout(f"{what}: no answer within {timeout_s} s") from None


def _run(worker: Any, method: str, args: tuple, kwargs: dict) -> Future:
    """A finished future holding ``worker.method(*args, **kwargs)`` or its exception."""
    future: Future = Future()
    try:
        future.set_result(getattr(worker, method)(*args, **kwargs))
    except Exception as err:  # noqa: BLE001 - delivered through the future
        future.set_exception(err)
    return future


class LocalGroup:
    """Workers in this process: each call runs at once, in the caller's thread, and returns
    finished futures (an exception the method raised is in its future). Workers cannot be
    restarted (``restart`` and ``kill`` raise: a worker in the caller's own process has no
    process to replace)."""

    def __init__(self, workers: list[Any]) -> None:
        if not workers:
            raise ValueError("LocalGroup: expected at least one worker")
        self.workers = list(workers)
        self.size = len(self.workers)

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] * self.size

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        return [_run(worker, method, args, kwargs) for worker in self.workers]

    def submit_to(self, index: int, method: str, *args: Any, **kwargs: Any) -> Future:
        return _run(self.workers[index], method, args, kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return gather(self.submit(method, *args, **kwargs), None, f"{type(self.workers[0]).__name__}.{method}")

    def restart(self, index: int) -> None:
        raise WorkerDied(f"{type(self.workers[index]).__name__}[{index}]: a worker in this process cannot be restarted")

    def kill(self) -> None:
        raise WorkerDied(f"{type(self.workers[0]).__name__}: workers in this process cannot be killed")

    def close(self) -> None:
        for worker in self.workers:
            close = getattr(worker, "close", None)
            if close is not None:
                close()


class _Serial:
    """One daemon thread running submitted calls one after another (a thread that never
    holds up the interpreter's exit, unlike ``ThreadPoolExecutor``'s).

    It keeps no reference to a call once it has run, and :meth:`stop` can wait for it to end:
    a daemon thread still running when the interpreter finalizes is ended by Python in
    whatever C++ code it is in, and freeing a tensor is such code, which aborts the process
    (``terminate called without an active exception``)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args, kwargs = call
            del call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # noqa: BLE001 - delivered through the future
                    future.set_exception(err)
            del future, fn, args, kwargs  # the worker's objects are freed by their owner, not at this thread's end

    def submit(self, fn, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args, kwargs))
        return future

    def stop(self, timeout_s: float | None = None) -> None:
        """Take no more calls: the thread ends after those queued; with ``timeout_s``, wait that
        long at most for it to end."""
        self._calls.put(None)
        if timeout_s is not None:
            self._thread.join(max(0.0, timeout_s))


class ThreadGroup:
    """Workers in this process, each serving its calls on a thread of its own, one at a time
    in the order submitted (as a worker process would), built there by ``factory(*args)``,
    one entry of ``args_per_worker`` each. A method named in ``concurrent`` runs at once in
    the caller's thread instead, beside a running call (it must be thread-safe). Used where a
    worker shares this process's memory (a rollout worker sampling from the policy's own
    module) but must answer beside a long call. A thread cannot be killed: ``restart`` and
    ``kill`` raise WorkerDied."""

    def __init__(self, factory, args_per_worker: list[tuple], *, name: str, timeout_s: float,
                 concurrent: tuple[str, ...] = ()) -> None:
        if not args_per_worker:
            raise ValueError(f"ThreadGroup {name}: expected at least one worker")
        self.name, self.size, self.timeout_s = name, len(args_per_worker), timeout_s
        self.concurrent = frozenset(concurrent)
        self._factory = factory
        self._threads = [_Serial(f"reasonrl-{name}{i}") for i in range(self.size)]
        try:
            self.workers = gather([t.submit(factory, *args) for t, args in zip(self._threads, args_per_worker)],
                                  timeout_s, f"{name}: building the workers")
        except BaseException:
            for t in self._threads:
                t.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] * self.size

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        return [self.submit_to(i, method, *args, **kwargs) for i in range(self.size)]

    def submit_to(self, index: int, method: str, *args: Any, **kwargs: Any) -> Future:
        if method in self.concurrent:
            return _run(self.workers[index], method, args, kwargs)
        return self._threads[index].submit(getattr(self.workers[index], method), *args, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return gather(self.submit(method, *args, **kwargs), self.timeout_s, f"{self.name}.{method}")

    def restart(self, index: int) -> None:
        raise WorkerDied(f"{self.name}[{index}]: a worker thread in this process cannot be restarted")

    def grow(self, args: tuple) -> None:
        """One more worker, ``factory(*args)``, built and serving on a thread of its own, as index ``size``."""
        thread = _Serial(f"reasonrl-{self.name}{self.size}")
        try:
            [worker] = gather([thread.submit(self._factory, *args)], self.timeout_s, f"{self.name}: building a worker")
        except BaseException:
            thread.stop()
            raise
        self._threads.append(thread)
        self.workers.append(worker)
        self.size += 1

    def shrink(self, timeout_s: float = 10.0) -> None:
        """Close the last worker on its thread after its running calls (waiting at most
        ``timeout_s``) and drop it."""
        if self.size <= 1:
            raise ValueError(f"ThreadGroup {self.name}: cannot shrink below one worker")
        thread, worker = self._threads.pop(), self.workers.pop()
        self.size -= 1
        deadline = time.monotonic() + timeout_s
        try:
            thread.submit(getattr(worker, "close", lambda: None)).result(timeout=timeout_s)
        except FutureTimeout:
            pass
        del worker
        thread.stop(deadline - time.monotonic())

    def kill(self) -> None:
        raise WorkerDied(f"{self.name}: worker threads in this process cannot be killed")

    def close(self, timeout_s: float = 10.0) -> None:
        """Close each worker on its own thread after its running calls, then end the threads,
        waiting at most ``timeout_s`` in all."""
        deadline = time.monotonic() + timeout_s
        closing = [t.submit(getattr(w, "close", lambda: None)) for t, w in zip(self._threads, self.workers)]
        for future in closing:
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                pass
        for t in self._threads:
            t.stop(deadline - time.monotonic())
