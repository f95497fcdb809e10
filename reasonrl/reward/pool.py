"""Reward scoring in worker processes with a timeout per sample.

    with RewardPool(cfg.reward, workers=2, timeout_s=5.0) as pool:
        grades = pool.score(texts, ground_truths, rows)   # Grades: scores, acc, failed, errors, ...

A sample whose reward function raises, returns something malformed or runs past the timeout
is scored as failed (``FAILURE_SCORE``, ``acc`` False) and the batch goes on; a worker stuck
past the timeout is killed and replaced. Too many failed samples in a row (across calls)
raise ``RewardFailureError``: at that point the reward function is broken, not one sample.
With ``workers=0`` samples are scored in this process, without timeouts.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
import time
from collections import deque
from multiprocessing.connection import wait

from typing import Any

from reasonrl.config import RewardConfig
from reasonrl.errors import InputError, LimitError
from reasonrl.reward.base import Grade, Grader, Grades, failed_grade

_START_TIMEOUT_S = 120.0


class RewardFailureError(LimitError, RuntimeError):
    """More consecutive reward samples failed than the pool allows (the reward function is
    broken: a restart would fail the same way)."""


def _worker_main(conn, reward: RewardConfig) -> None:
    """Worker loop: build the grader and send ``""`` (or the error), then receive lists of
    ``(index, text, truth, row)`` and send one ``(index, Grade)`` per sample as it is scored;
    ``None`` or a closed pipe ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    try:
        grader = Grader.from_config(reward)
    except Exception as e:
        conn.send(f"{type(e).__name__}: {e}")
        return
    try:
        conn.send("")
        while (chunk := conn.recv()) is not None:
            for index, text, truth, row in chunk:
                conn.send((index, grader.grade(text, truth, row)))
    except (EOFError, OSError):
        pass


class _Worker:
    """One worker process, the indices it was sent and not yet answered, and when the one it
    is scoring now times out."""

    def __init__(self, ctx, reward: RewardConfig) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, reward), name="reasonrl-reward",
                                daemon=True)
        self.proc.start()
        child_conn.close()
        error = self._startup_error()
        if error:
            self.stop(kill=True)
            raise InputError(f"reward.fn: the reward worker could not load {reward.fn!r}: {error}")
        self.pending: deque[int] = deque()
        self.deadline = math.inf

    def _startup_error(self) -> str:
        """``""`` once the worker has loaded the function, else why it could not."""
        if not self.conn.poll(_START_TIMEOUT_S):
            return f"no answer in {_START_TIMEOUT_S}s"
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(timeout=1.0)
            return f"it exited with code {self.proc.exitcode}"

    def stop(self, kill: bool) -> None:
        """End the process (asking first unless ``kill``), reap it and close the pipe."""
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(timeout=1.0)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def _start_method() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class RewardPool:
    """Grades batches with ``reward`` (a RewardConfig: ``reward.fn``, ``reward.by_source``,
    ``reward.format``; a string is ``RewardConfig(fn=string)``), each sample in a worker
    process with ``timeout_s`` to finish.

    ``workers=0`` scores in this process: no timeouts, no process overhead, exceptions still
    caught. Raises ``RewardFailureError`` once more than ``max_consecutive_failures`` samples
    in a row have failed. Use as a context manager, or call ``close()``.
    """

    def __init__(self, reward: RewardConfig | str, workers: int = 1, timeout_s: float = 5.0,
                 max_consecutive_failures: int = 50):
        if workers < 0:
            raise ValueError(f"RewardPool workers: got {workers}, expected >= 0")
        if not timeout_s > 0:
            raise ValueError(f"RewardPool timeout_s: got {timeout_s}, expected > 0")
        self.reward = RewardConfig(fn=reward) if isinstance(reward, str) else reward
        self.timeout_s = timeout_s
        self.max_consecutive_failures = max_consecutive_failures
        self.consecutive_failures = 0
        self._grader = Grader.from_config(self.reward)
        self._ctx = multiprocessing.get_context(_start_method())
        self._workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._workers.append(self._new_worker())
        except BaseException:
            self.close()
            raise

    def score(self, texts: list[str], ground_truths: list[str], rows: list[dict[str, Any]] | None = None) -> Grades:
        """The grades of each (text, ground truth, row) as ``score_batch`` gives them;
        ``rows`` (``data_source`` and the row's other fields, by sample) may be omitted."""
        if len(texts) != len(ground_truths) or (rows is not None and len(rows) != len(texts)):
            raise ValueError(f"RewardPool.score: {len(texts)} texts but {len(ground_truths)} ground truths"
                             + (f" and {len(rows)} rows" if rows is not None else ""))
        rows = rows if rows is not None else [{} for _ in texts]
        if self._workers:
            results = self._score_in_workers(texts, ground_truths, rows)
        else:
            results = [self._grader.grade(text, truth, row) for text, truth, row in zip(texts, ground_truths, rows)]
        return self._collect(results)

    def close(self) -> None:
        """Stop and reap every worker process (idempotent)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop(kill=False)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self.reward)

    def _timeout_error(self) -> str:
        return f"timeout after {self.timeout_s}s"

    def _score_in_workers(self, texts: list[str], truths: list[str], rows: list[dict[str, Any]]) -> list[Grade]:
        """Hand out chunks of samples to idle workers until every sample has a result,
        failing (and replacing the worker of) any sample that runs past the timeout."""
        results: list[Grade | None] = [None] * len(texts)
        todo = deque(range(len(texts)))
        while todo or any(w.pending for w in self._workers):
            self._dispatch(todo, texts, truths, rows)
            busy = [w for w in self._workers if w.pending]
            if not busy:
                continue
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = wait([w.conn for w in busy], timeout)
            for worker in busy:
                if worker.conn in ready:
                    self._receive(worker, results, todo)
                elif worker.deadline <= time.monotonic():
                    self._replace(worker, results, todo, self._timeout_error())
        return results

    def _dispatch(self, todo: deque[int], texts: list[str], truths: list[str], rows: list[dict[str, Any]]) -> None:
        """Split what is left evenly over the idle workers; a worker that cannot be sent to
        is replaced and its samples stay in ``todo``."""
        idle = [w for w in self._workers if not w.pending]
        for k, worker in enumerate(idle):
            if not todo:
                return
            chunk = [todo.popleft() for _ in range(math.ceil(len(todo) / (len(idle) - k)))]
            try:
                worker.conn.send([(i, texts[i], truths[i], rows[i]) for i in chunk])
            except OSError:
                todo.extendleft(reversed(chunk))
                self._swap(worker)
                continue
            worker.pending.extend(chunk)
            worker.deadline = time.monotonic() + self.timeout_s

    def _receive(self, worker: _Worker, results: list[Grade | None], todo: deque[int]) -> None:
        """Store every result the worker has sent; a worker that died fails its current sample."""
        try:
            while worker.pending and worker.conn.poll():
                index, grade = worker.conn.recv()
                results[index] = grade
                worker.pending.popleft()
                worker.deadline = time.monotonic() + self.timeout_s
        except (EOFError, OSError):
            worker.proc.join(timeout=1.0)
            self._replace(worker, results, todo, f"reward worker died (exit code {worker.proc.exitcode})")

    def _replace(self, worker: _Worker, results: list[Grade | None], todo: deque[int], error: str) -> None:
        """Fail the sample ``worker`` is on with ``error``, requeue the rest of its chunk and
        put a new worker in its place."""
        results[worker.pending.popleft()] = failed_grade(error)
        todo.extendleft(reversed(worker.pending))
        self._swap(worker)

    def _swap(self, worker: _Worker) -> None:
        worker.stop(kill=True)
        self._workers[self._workers.index(worker)] = self._new_worker()

    def _collect(self, results: list[Grade]) -> Grades:
        """The batch of grades; counts failures in a row."""
        for grade in results:
            if not grade.failed:
                self.consecutive_failures = 0
                continue
            self.consecutive_failures += 1
            if self.consecutive_failures > self.max_consecutive_failures:
                raise RewardFailureError(
                    f"reward function {self.reward.fn!r}: {self.consecutive_failures} samples in a row failed "
                    f"(more than max_consecutive_failures={self.max_consecutive_failures}); last error: {grade.error}"
                )
        return Grades.of(results)
