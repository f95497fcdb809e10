"""Reward scoring in worker processes (or Ray actors) with a timeout per sample.

    with RewardPool(cfg.reward, workers=start) as pool:   # start: reasonrl.runtime.pool.PoolStart
        grades = pool.score(texts, ground_truths, rows)   # Grades: scores, acc, failed, errors, ...

A sample whose reward function raises, returns something malformed or runs past the timeout
is scored as failed (the low end of ``reward.range``, ``acc`` False) and the batch goes on; a worker stuck
past the timeout, or one that died, is replaced by the runtime's pool
(:class:`~reasonrl.runtime.pool.WorkerPool`, under its restart policy) and the samples it had
not graded yet go to the workers again. Too many failed samples in a row (across calls) raise
``RewardFailureError``: at that point the reward function is broken, not one sample. Without
workers (``workers=None``) samples are scored in this process, without timeouts.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from reasonrl.config import RewardConfig
from reasonrl.errors import LimitError, error_line
from reasonrl.reward.base import Grade, Grader, GraderWorker, Grades, failed_grade


class RewardFailureError(LimitError, RuntimeError):
    """More consecutive reward samples failed than the pool allows (the reward function is
    broken: a restart would fail the same way)."""


class RewardPool:
    """Grades batches with ``reward`` (a RewardConfig: ``reward.fn``, ``reward.by_source``,
    ``reward.format``; a string is ``RewardConfig(fn=string)``), each sample in a worker with
    the workers' timeout to finish.

    ``workers``: how the workers start, a :class:`~reasonrl.runtime.pool.PoolStart` (its
    ``count`` workers, its ``timeout_s`` per sample, where they run), started by the first
    call that needs them (a pool that never grades, such as validation's in a run without
    validation, starts none); None scores in this process: no timeouts, no process overhead,
    exceptions still caught. Raises
    ``RewardFailureError`` once more than ``max_consecutive_failures`` samples in a row have
    failed. Use as a context manager, or call ``close()``.
    """

    def __init__(self, reward: RewardConfig | str, workers: Callable[..., Any] | None = None,
                 max_consecutive_failures: int = 50):
        self.reward = RewardConfig(fn=reward) if isinstance(reward, str) else reward
        self.max_consecutive_failures = max_consecutive_failures
        self.consecutive_failures = 0
        # With workers the functions are imported there only: an import that hangs is theirs
        self._grader = Grader.from_config(self.reward) if workers is None else None
        self._start = workers
        self._pool = None

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids, the workers started if they were not (none when grading
        in this process)."""
        return [] if self._start is None else self._workers().pids

    def _workers(self):
        """The workers' :class:`~reasonrl.runtime.pool.WorkerPool`, started at the first call."""
        if self._pool is None:
            self._pool = self._start(GraderWorker, [self._worker_args()] * self._start.count)
        return self._pool

    def _worker_args(self) -> tuple:
        """A GraderWorker's: the reward settings and the pool's torch threads."""
        return self.reward, self._start.threads

    def score(self, texts: list[str], ground_truths: list[str], rows: list[dict[str, Any]] | None = None) -> Grades:
        """The grades of each (text, ground truth, row) as ``score_batch`` gives them;
        ``rows`` (``data_source`` and the row's other fields, by sample) may be omitted."""
        if len(texts) != len(ground_truths) or (rows is not None and len(rows) != len(texts)):
            raise ValueError(f"RewardPool.score: {len(texts)} texts but {len(ground_truths)} ground truths"
                             + (f" and {len(rows)} rows" if rows is not None else ""))
        rows = rows if rows is not None else [{} for _ in texts]
        if self._start is not None:
            results = self._score_in_workers(texts, ground_truths, rows)
        else:
            results = [self._grader.grade(text, truth, row) for text, truth, row in zip(texts, ground_truths, rows)]
        return self._collect(results)

    def resize(self, count: int) -> None:
        """Grade with ``count`` workers from the next batch on (between batches; a pool
        grading in this process has none to resize)."""
        if self._start is None:
            raise ValueError("RewardPool.resize: this pool grades in its own process (runtime.roles.reward.count=0); "
                             "a count of workers takes effect when the run next starts")
        if type(count) is not int or count < 1:
            raise ValueError(f"RewardPool.resize: count = {count!r}, expected an integer >= 1")
        pool = self._workers()
        while pool.size < count:
            pool.grow(self._worker_args())
        while pool.size > count:
            pool.shrink()

    def close(self) -> None:
        """Stop the workers, none started after (idempotent)."""
        pool, self._pool, self._start = self._pool, None, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _score_in_workers(self, texts: list[str], truths: list[str], rows: list[dict[str, Any]]) -> list[Grade]:
        """Split the samples into one run of consecutive samples per worker and grade each
        sample as a call of its own, so that each has its own deadline; a failed sample's error
        names the worker (``reward[i]: ...``). A sample lost with a
        replaced worker goes to the worker with the fewest calls left."""
        pool = self._workers()
        per_worker = math.ceil(len(texts) / pool.size) if texts else 0
        for i in range(len(texts)):
            pool.submit(i // per_worker, "grade", texts[i], truths[i], rows[i], key=i)
        results: list[Grade | None] = [None] * len(texts)
        while pool.busy:
            for done in pool.wait():
                i = done.key
                if done.outcome == "lost":
                    pool.submit(min(range(pool.size), key=pool.queued), "grade", texts[i], truths[i], rows[i], key=i)
                elif done.outcome == "ok":
                    grade = done.value
                    results[i] = replace(grade, error=f"reward[{done.index}]: {grade.error}") if grade.failed else grade
                else:
                    results[i] = self._failed(done, pool.timeout_s)
        return results

    def _failed(self, done, timeout_s: float) -> Grade:
        """The failed grade of a sample whose call did not answer ``ok``, the worker named:
        ``reward[i]: timeout after Ts`` (counted as a timeout), ``reward worker died (reward[i]:
        ...)`` or ``reward[i]: <the error>``."""
        low, worker = self.reward.range[0], f"reward[{done.index}]"
        if done.outcome == "timeout":
            return failed_grade(low, f"{worker}: timeout after {timeout_s:g}s", timed_out=True)
        if done.outcome == "died":
            return failed_grade(low, f"reward worker died ({done.value})")
        return failed_grade(low, f"{worker}: {error_line(done.value)}")

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
