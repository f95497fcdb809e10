"""RewardPool: scoring in worker processes with per-sample timeouts, fault drills, cleanup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from reasonrl.reward.base import load_reward_fn, score_batch
from reasonrl.reward.pool import RewardFailureError, RewardPool

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


def child_pids() -> set[int]:
    return {int(pid) for f in Path("/proc/self/task").glob("*/children") for pid in f.read_text().split()}


def assert_same(got, expected) -> None:
    for name in ("scores", "acc", "failed"):
        assert torch.equal(getattr(got, name), getattr(expected, name))
    assert (got.errors, got.preds, got.extras) == (expected.errors, expected.preds, expected.extras)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_scores_equal_score_batch(flaky, workers):
    expected = score_batch(load_reward_fn(flaky), TEXTS, TRUTHS)
    with RewardPool(flaky, workers=workers) as pool:
        got = pool.score(TEXTS, TRUTHS)
        assert_same(got, expected)
        assert_same(pool.score(TEXTS, TRUTHS), expected)
    assert got.errors == ["sample 2: ValueError: bad input"]
    assert got.failed.tolist() == [False, False, True, False, False]
    assert got.preds == ["1", "5", "[INVALID]", "[INVALID]", "4"]


def test_timeout_sample_fails_while_the_others_are_scored(flaky):
    texts = ["Answer: 1", "sleep", "Answer: 3", "Answer: 5"]
    truths = ["1", "2", "3", "4"]
    with RewardPool(flaky, workers=1, timeout_s=0.3) as pool:
        workers_before = child_pids()
        began = time.monotonic()
        g = pool.score(texts, truths)
        scores, acc, failed, errors = g.scores, g.acc, g.failed, g.errors
        assert time.monotonic() - began < 5
        assert failed.tolist() == [False, True, False, False]
        assert errors == ["sample 1: timeout after 0.3s"]
        assert scores.tolist() == [1.0, -1.0, 1.0, -1.0] and acc.tolist() == [True, False, True, False]
        replaced = child_pids()
        assert len(replaced) == len(workers_before) and replaced != workers_before  # the stuck worker was replaced
        assert pool.score(["Answer: 2"], ["2"]).scores.tolist() == [1.0]


def test_consecutive_failures_across_calls_raise(flaky):
    with RewardPool(flaky, workers=0, max_consecutive_failures=3) as pool:
        pool.score(["raise", "raise", "Answer: 1"], ["1"] * 3)  # a success resets the count
        pool.score(["Answer: 1", "raise", "raise"], ["1"] * 3)
        with pytest.raises(RewardFailureError, match=r"4 samples in a row failed .*bad input"):
            pool.score(["raise", "raise", "Answer: 1"], ["1"] * 3)


def test_no_worker_process_outlives_close(flaky):
    before = child_pids()
    pool = RewardPool(flaky, workers=2, timeout_s=0.2)
    assert len(child_pids() - before) == 2
    pool.score(["sleep", "Answer: 1", "sleep"], ["1", "1", "1"])
    pool.close()
    pool.close()
    assert child_pids() == before  # killed workers were reaped too: no zombies


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="nope"):
        RewardPool("nope", workers=0)
    with RewardPool("dapo", workers=0) as pool:
        with pytest.raises(ValueError, match="2 texts but 1"):
            pool.score(["a", "b"], ["a"])
