"""Rank faults in a real run with two data-parallel trainer ranks: a slow rank is named (a
``straggler`` event with its rank) and given a smaller share; later a stuck rank is named (a
``hang`` event with its rank) and the supervisor restarts the run from its last checkpoint;
the run finishes. The DAPO recipe on the embedded warm start, its update long enough (~0.3 s) that a
threefold slowdown stands out of the machine's noise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reasonrl.metrics import read_jsonl

pytestmark = [pytest.mark.timeout(600), pytest.mark.serial, pytest.mark.long]  # a slow and a stuck rank are found by wall time


def _train(run_dir, steps: int, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "reasonrl.cli", "train", "dapo", f"run.dir={run_dir}", f"train.total_steps={steps}",
               "eval.every_steps=0", "run.progress=false", "runtime.trainer_ranks=2", "checkpoint.every_steps=2",
               "resilience.backoff_s=0.05", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=540)


def test_a_slow_rank_and_then_a_stuck_rank_are_named_and_the_run_finishes(tmp_path):
    done = _train(tmp_path, 6, "faults=[slow_rank@2:rank=1:factor=4:steps=8,hang_rank@5:rank=1]",
                  "runtime.collective_timeout_s=4")
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_jsonl(tmp_path / "events.jsonl")
    stragglers = [e for e in events if e["kind"] == "straggler"]
    assert stragglers and stragglers[0]["rank"] == 1 and 2 <= stragglers[0]["step"] <= 4, stragglers
    assert stragglers[0]["shares"][1] < stragglers[0]["shares"][0]  # the slow rank trains fewer rows
    [hang] = [e for e in events if e["kind"] == "hang"]
    assert hang["rank"] == 1 and hang["step"] == 5, hang
    [recovered] = [e for e in events if e["kind"] == "recovered"]
    assert recovered["from_step"] == 4  # the last checkpoint (every 2 steps)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 7))
    assert (tmp_path / "final" / "config.json").is_file()
    out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "trace", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "rank" in out.stdout, out.stderr
