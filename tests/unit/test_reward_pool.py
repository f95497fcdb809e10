"""RewardPool: scoring in worker processes with per-sample timeouts, fault drills, cleanup."""

from __future__ import annotations

import os

import pytest
import torch

from reasonrl.reward.base import load_reward_fn, score_batch
from reasonrl.reward.pool import RewardFailureError, RewardPool
from reasonrl.runtime.pool import PoolStart

FLAKY = '''
import time
from reasonrl.reward.math import dapo_score


def score(text, truth):
    if text == "sleep":
        time.sleep(30)
    if text == "raise":
        raise ValueError("bad input")
    return dapo_score(text, truth)
'''

TEXTS = ["so Answer: 1", "Answer: 5", "raise", "no answer", "Answer: 4"]
TRUTHS = ["1", "2", "3", "4", "4"]


@pytest.fixture
def flaky(tmp_path, monkeypatch) -> str:
    """The spec of a reward function that sleeps on "sleep" and raises on "raise"."""
    (tmp_path / "flaky_reward.py").write_text(FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "flaky_reward:score"


def workers(count: int, timeout_s: float = 5.0) -> PoolStart | None:
    """``count`` reward worker processes (None: grade in this process)."""
    return PoolStart("reward", count, timeout_s) if count else None


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def assert_same(got, expected, worker: int | None = None) -> None:
    """Equal grades; graded by reward worker ``worker``, the errors name it."""
    for name in ("scores", "acc", "failed"):
        assert torch.equal(getattr(got, name), getattr(expected, name))
    errors = expected.errors if worker is None else [e.replace(": ", f": reward[{worker}]: ", 1) for e in expected.errors]
    assert (got.errors, got.preds, got.extras) == (errors, expected.preds, expected.extras)


@pytest.mark.parametrize("count", [0, 1, 2])
def test_scores_equal_score_batch(flaky, count):
    expected = score_batch(load_reward_fn(flaky), TEXTS, TRUTHS)
    with RewardPool(flaky, workers(count)) as pool:
        got = pool.score(TEXTS, TRUTHS)
        worker = 0 if count else None  # sample 2 of 5: worker 0's run of consecutive samples, of one or of two
        assert_same(got, expected, worker)
        assert_same(pool.score(TEXTS, TRUTHS), expected, worker)
    assert got.errors == ["sample 2: " + ("reward[0]: " if count else "") + "ValueError: bad input"]
    assert got.failed.tolist() == [False, False, True, False, False]
    assert got.preds == ["1", "5", "[INVALID]", "[INVALID]", "4"]


def test_timeout_sample_fails_while_the_others_are_scored(flaky):
    texts = ["Answer: 1", "sleep", "Answer: 3", "Answer: 5"]
    truths = ["1", "2", "3", "4"]
    with RewardPool(flaky, workers(1, timeout_s=0.3)) as pool:
        workers_before = pool.pids
        g = pool.score(texts, truths)
        scores, acc, failed, errors = g.scores, g.acc, g.failed, g.errors
        assert failed.tolist() == [False, True, False, False]
        assert errors == ["sample 1: reward[0]: timeout after 0.3s"]
        assert scores.tolist() == [1.0, -1.0, 1.0, -1.0] and acc.tolist() == [True, False, True, False]
        replaced = pool.pids
        assert len(replaced) == 1 and replaced != workers_before and not alive(workers_before[0])  # replaced
        assert pool.score(["Answer: 2"], ["2"]).scores.tolist() == [1.0]


def test_consecutive_failures_across_calls_raise(flaky):
    with RewardPool(flaky, max_consecutive_failures=3) as pool:
        pool.score(["raise", "raise", "Answer: 1"], ["1"] * 3)  # a success resets the count
        pool.score(["Answer: 1", "raise", "raise"], ["1"] * 3)
        with pytest.raises(RewardFailureError, match=r"4 samples in a row failed .*bad input"):
            pool.score(["raise", "raise", "Answer: 1"], ["1"] * 3)


def test_no_worker_process_outlives_close(flaky):
    pool = RewardPool(flaky, workers(2, timeout_s=0.2))
    started = pool.pids
    assert len(started) == 2 and all(alive(pid) for pid in started)
    pool.score(["sleep", "Answer: 1", "sleep"], ["1", "1", "1"])
    replaced = pool.pids
    assert replaced[0] != started[0] and not alive(started[0])  # the first worker hung on sample 0
    pool.close()
    pool.close()
    assert not any(alive(pid) for pid in started + replaced)  # killed workers were reaped too: no zombies


def test_a_pool_resized_between_batches_grades_with_its_new_workers_and_the_removed_ones_end(flaky):
    expected = score_batch(load_reward_fn(flaky), TEXTS, TRUTHS)
    with RewardPool(flaky, workers(1)) as pool:
        first = pool.pids
        pool.resize(3)
        grown = pool.pids
        assert len(grown) == 3 and grown[0] == first[0] and all(alive(pid) for pid in grown)
        assert_same(pool.score(TEXTS, TRUTHS), expected, 1)  # 5 samples on 3 workers: sample 2 on worker 1
        pool.resize(1)
        assert pool.pids == first and not any(alive(pid) for pid in grown[1:])
        assert_same(pool.score(TEXTS, TRUTHS), expected, 0)
        with pytest.raises(ValueError, match="expected an integer >= 1"):
            pool.resize(0)
    with RewardPool(flaky) as inline, pytest.raises(ValueError, match="grades in its own process"):
        inline.resize(2)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="nope"):
        RewardPool("nope")
    with RewardPool("dapo") as pool:
        with pytest.raises(ValueError, match="2 texts but 1"):
            pool.score(["a", "b"], ["a"])
