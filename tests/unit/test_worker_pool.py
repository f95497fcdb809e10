"""runtime.pool: calls with deadlines over real worker processes, one restart policy, its events."""

from __future__ import annotations

import os
import time

import pytest

from reasonrl.errors import InputError, LimitError
from reasonrl.restarts import RestartPolicy
from reasonrl.runtime.group import WorkerDied
from reasonrl.runtime.pool import Done, PoolStart, RestartsExhausted, WorkerPool
from reasonrl.runtime.process import ProcessGroup
from tests.worker_fixtures import Counter


def drain(pool: WorkerPool) -> list[Done]:
    out = []
    while pool.busy:
        out += pool.wait()
    return out


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


@pytest.fixture
def events():
    return []


def start(count: int, timeout_s: float, events: list, restarts: RestartPolicy = RestartPolicy()) -> WorkerPool:
    return PoolStart("grader", count, timeout_s, restarts=restarts,
                     emit=lambda kind, **fields: events.append((kind, fields)))(Counter, [(0,)] * count)


def test_results_errors_and_order(events):
    pool = start(2, 5.0, events)
    try:
        for i in range(3):
            pool.submit(i % 2, "add", 1, key=i)
        pool.submit(1, "fail", "bad", key="f")
        done = drain(pool)
        assert [d.key for d in done if d.index == 0] == [0, 2]  # each worker's calls in the order sent
        assert sorted((d.key, d.value) for d in done if d.outcome == "ok") == [(0, 1), (1, 1), (2, 2)]
        [error] = [d for d in done if d.outcome == "error"]
        assert error.key == "f" and isinstance(error.value, ValueError) and str(error.value) == "bad"
        assert pool.restarts_done == 0 and events == [] and not pool.busy and pool.wait() == []
    finally:
        pool.close()


def test_a_deadline_fails_the_running_call_restarts_the_worker_and_reports_the_queued_ones(events):
    pool = start(2, 0.5, events)
    try:
        old = pool.pids
        pool.submit(0, "add", 1, key="before")
        pool.submit(0, "sleep", 30, key="stuck")
        pool.submit(0, "add", 1, key="queued")
        pool.submit(1, "sleep", 0.2, key="other")
        done = {d.key: d for d in drain(pool)}
        assert done["before"].outcome == "ok" and done["other"].outcome == "ok"
        assert done["stuck"].outcome == "timeout" and done["stuck"].value == "grader[0]: no answer within 0.5 s"
        assert done["queued"].outcome == "lost" and "grader[0] was restarted (timeout)" in done["queued"].value
        new = pool.pids
        assert new[1] == old[1] and new[0] != old[0] and not alive(old[0])
        assert events == [("worker_restarted", {"role": "grader", "index": 0, "pid": old[0], "new_pid": new[0],
                                                "reason": "timeout: no answer within 0.5 s"})]
        pool.submit(0, "add", 5, key="fresh")  # the new worker was built from the same arguments
        assert [(d.key, d.value) for d in drain(pool)] == [("fresh", 5)]
    finally:
        pool.close()


def test_the_deadline_counts_from_when_a_call_starts_running(events):
    pool = start(1, 1.0, events)
    try:
        for i in range(4):  # 2.4 s of calls queued at once, each well within its own second
            pool.submit(0, "sleep", 0.6, key=i)
        assert [d.outcome for d in drain(pool)] == ["ok"] * 4 and pool.restarts_done == 0
    finally:
        pool.close()


def test_a_dead_worker_fails_its_running_call_and_is_restarted(events):
    pool = start(1, 5.0, events)
    try:
        old = pool.pids[0]
        pool.submit(0, "die", key="d")
        pool.submit(0, "add", 2, key="q")
        done = drain(pool)
        assert [(d.key, d.outcome) for d in done] == [("d", "died"), ("q", "lost")]
        assert "exit code 3" in done[0].value and pool.pids[0] != old
        assert events[0][1]["reason"].startswith("died: WorkerDied: grader")
    finally:
        pool.close()


def test_backoff_between_restarts_of_the_same_worker_and_the_budget():
    policy = RestartPolicy(budget=2, backoff_s=0.4, max_backoff_s=1.0)
    assert [policy.pause_s(n) for n in (1, 2, 3, 4, 5)] == [0.0, 0.4, 0.8, 1.0, 1.0]
    restarted = []
    pool = PoolStart("grader", 1, 0.1, restarts=policy, emit=lambda kind, **f: restarted.append(time.monotonic()))(
        Counter, [(0,)])
    try:
        for key in (1, 2):
            pool.submit(0, "sleep", 30, key=key)
            assert [d.outcome for d in drain(pool)] == ["timeout"]
        assert restarted[1] - restarted[0] >= 0.4  # the deadline came sooner: restart 2 waited for its backoff
        pool.submit(0, "sleep", 30, key=3)
        with pytest.raises(RestartsExhausted, match=r"grader\[0\]: 2 restarts in a row did not help") as err:
            drain(pool)
        assert isinstance(err.value, LimitError) and isinstance(err.value, WorkerDied)
        assert len(restarted) == 2
    finally:
        pool.close()


def test_an_answered_call_resets_the_budget(events):
    pool = start(1, 0.3, events, RestartPolicy(budget=1, backoff_s=0.0))
    try:
        for _ in range(3):
            pool.submit(0, "sleep", 30)
            pool.submit(0, "add", 1)  # lost with the worker: submitted again below
            drain(pool)
            pool.submit(0, "add", 1)
            assert [d.outcome for d in drain(pool)] == ["ok"]
        assert pool.restarts_done == 3
    finally:
        pool.close()


def test_a_pool_over_any_group_and_bad_settings():
    group = ProcessGroup(Counter, [(10,)], name="counter")
    pool = WorkerPool(group, role="counter", timeout_s=5.0)
    try:
        pool.submit(0, "add", 1, key="k")
        assert drain(pool) == [Done("k", 0, "ok", 11)]
    finally:
        pool.close()
    with pytest.raises(InputError, match=r"runtime.roles.reward.count = 0"):
        PoolStart("reward", 0, 5.0)
    with pytest.raises(InputError, match=r"runtime.roles.env.timeout_s = -1"):
        PoolStart("env", 1, -1)
    with pytest.raises(ValueError, match="budget"):
        RestartPolicy(budget=-1)
