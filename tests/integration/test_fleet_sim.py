"""bench/fleet.py --simulate: the real producer, router, queue, prompt records and failover over
simulated workers; a scripted death and hang are replaced and the ledger stays clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def simulate(*options: str) -> dict:
    out = subprocess.run([sys.executable, "bench/fleet.py", "--simulate", *options], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = out.stdout.splitlines()
    return json.loads(line)


def test_a_simulated_fleet_replaces_a_dead_and_a_hung_worker_and_loses_no_draw():
    # 3 workers, 8 prompts x 8 samples a step, a generation call of about 25 modelled seconds,
    # each 0.005 real seconds: a death at 60 s and a hang at 90 s, each detected and replaced.
    result = simulate("--workers", "3", "--staleness", "1", "--steps", "5", "--seeds", "0", "--prompts-per-step", "8",
                      "--seconds-per-token", "0.05", "--update-s", "20", "--start-s", "5", "--timeout-s", "60",
                      "--time-scale", "0.005", "--deaths-per-min", "1", "--hangs-per-min", "1", "--no-compare")
    assert result["simulated"] is True and result["workers"] == 3
    assert result["ledger_ok"] is True
    [run] = result["runs"]["faults"]
    assert run["steps"] == 5 and run["ledger"]["trained"] == 5 * 8
    applied = [f["fault"] for f in run["faults_applied"]]
    assert "die" in applied and "freeze" in applied
    assert run["incidents"].get("rollout_worker_died", 0) >= 1 and run["incidents"].get("rollout_worker_hung", 0) >= 1
    assert result["seconds_lost"] > 0 and 0 < result["ettr"] < 1
    assert sum(result["staleness"].values()) == 5 * 8 and set(result["staleness"]) <= {"0", "1"}
