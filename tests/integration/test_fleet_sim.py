"""bench/fleet.py --simulate: the real producer, router, queue, prompt records and failover over
simulated workers; a scripted death and a scripted hang are replaced and the ledger stays clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def simulate(*options: str) -> dict:
    # PYTHONFAULTHANDLER: an abort (a thread left in C++ code at exit) prints every thread's stack
    out = subprocess.run([sys.executable, "bench/fleet.py", "--simulate", *options], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = out.stdout.splitlines()
    return json.loads(line)


def test_a_simulated_fleet_replaces_a_dead_and_a_hung_worker_and_loses_no_draw():
    # 3 workers, 8 prompts x 8 samples a step, a generation call of about 30 modelled seconds,
    # each 0.005 real seconds: a death at 40 s and a hang at 70 s, each detected and replaced.
    result = simulate("--workers", "3", "--staleness", "1", "--steps", "4", "--seeds", "0", "--prompts-per-step", "8",
                      "--seconds-per-token", "0.05", "--update-s", "20", "--start-s", "5", "--timeout-s", "150",
                      "--time-scale", "0.005", "--deaths-per-min", "0", "--at", "death@40,hang@70", "--no-compare")
    assert result["simulated"] is True and result["workers"] == 3
    assert result["ledger_ok"] is True
    [run] = result["runs"]["faults"]
    assert run["steps"] == 4 and run["ledger"]["trained"] == 4 * 8
    assert [f["fault"] for f in run["faults_applied"]] == ["death", "hang"]
    assert run["incidents"]["rollout_worker_died"] == 1 and run["incidents"]["rollout_worker_hung"] == 1
    assert result["seconds_lost"] > 0 and 0 < result["ettr"] < 1
    assert sum(result["staleness"].values()) == 4 * 8 and set(result["staleness"]) <= {"0", "1"}
