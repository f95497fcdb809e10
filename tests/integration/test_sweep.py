"""``reasonrl sweep``: a 2 x 2 x 2 sweep of 3-step runs killed mid-way and started again, and
runs trained in parallel worker processes."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reasonrl.cli import main
from reasonrl.config.loader import read_yaml
from reasonrl.experiments.runner import run_sweep
from reasonrl.experiments.sweep import read_sweep
from reasonrl.metrics import read_jsonl
from tests.conftest import tiny_run

REPO = Path(__file__).resolve().parents[2]

CELLS = ["algo.eps_high=0.2__algo.loss_agg=token-mean", "algo.eps_high=0.2__algo.loss_agg=seq-mean-token-mean",
         "algo.eps_high=0.28__algo.loss_agg=token-mean", "algo.eps_high=0.28__algo.loss_agg=seq-mean-token-mean"]
SEED_MAJOR = [f"{cell}/seed_{seed}" for seed in (0, 1) for cell in CELLS]


def write_sweep(path: Path, model_dir: Path, seeds: list[int], grid: dict, **extra) -> Path:
    """A sweep file of tiny runs on ``model_dir``: rollouts on the trainer's threads (no worker
    processes to start), a checkpoint and a validation every step, no loggers."""
    settings = {key: read_yaml(value) for key, value in (item.split("=", 1) for item in tiny_run(model_dir, "x"))}
    del settings["run.dir"]
    settings |= {"eval.every_steps": 1, "eval.k": 2, "checkpoint.every_steps": 1, "run.loggers": [],
                 "runtime.roles.rollout.colocate": "policy", "reward.fn": "tests.reward_fixtures:slow_coin"}
    baseline = {key: values[0] for key, values in grid.items()}
    path.write_text(json.dumps({"recipe": "grpo", "set": settings, "grid": grid, "seeds": seeds,
                                "baseline": baseline, "target": 0.5, **extra}, indent=1))
    return path


def committed(run_dir: Path) -> int | None:
    """The newest step with a COMMITTED checkpoint in ``run_dir`` (as seen from outside)."""
    steps = [int(p.parent.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*/COMMITTED")]
    return max(steps, default=None)


def snapshot(run_dir: Path) -> dict[str, tuple[int, int, int]]:
    """{path: (inode, mtime_ns, size)} of every file under ``run_dir``."""
    return {str(p.relative_to(run_dir)): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_killed_sweep_started_again_redoes_no_finished_run_and_completes_the_summary(tmp_path, model_dir):
    grid = {"algo.eps_high": [0.2, 0.28], "algo.loss_agg": ["token-mean", "seq-mean-token-mean"]}
    spec = write_sweep(tmp_path / "sweep.yaml", model_dir, [0, 1], grid)
    root = tmp_path / "sweep"
    runs = [root / label for label in SEED_MAJOR]
    command = [sys.executable, "-m", "reasonrl.cli", "sweep", str(spec), "--dir", str(root)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not (any(committed(r) == 3 for r in runs) and any(committed(r) in (1, 2) for r in runs)):
                assert first.poll() is None, "the sweep ended before it was killed:\n" + (tmp_path / "first.log").read_text()
                assert time.monotonic() < deadline, "no run finished and another mid-way within 240 s"
                time.sleep(0.01)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)

    finished = {r: snapshot(r) for r in runs if committed(r) == 3}
    midway = {r: committed(r) for r in runs if committed(r) in (1, 2)}
    assert 1 <= len(finished) < len(runs) and midway

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"{len(finished)} finished, {len(runs) - len(finished)} to train" in second.stdout

    for run, files in finished.items():  # not one file of a finished run was written again
        assert snapshot(run) == files, run
    for run, step in midway.items():  # resumed from its checkpoint, through the trainer's resume
        resumes = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "resume"]
        assert resumes[-1]["from_step"] == step, run
    for run in runs:
        assert [row["step"] for row in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3], run

    events = read_jsonl(root / "events.jsonl")
    started = [e["run"] for e in events if e["kind"] == "run_start"]
    assert list(dict.fromkeys(started)) == SEED_MAJOR  # seed-major, the mid-way run again first
    assert [e["finished"] for e in events if e["kind"] == "sweep_start"] == [0, len(finished)]
    done = [e["run"] for e in events if e["kind"] == "run_done"]
    assert len(done) == len(set(done))  # no run finished twice
    restart = max(i for i, e in enumerate(events) if e["kind"] == "sweep_start")
    assert {e["run"] for e in events[restart:] if e["kind"] == "run_done"} == set(SEED_MAJOR) - {
        str(r.relative_to(root)) for r in finished}

    summary = json.loads((root / "summary.json").read_text())
    assert [c["name"] for c in summary["cells"]] == CELLS
    for cell in summary["cells"]:
        assert cell["seeds"] == [0, 1] and cell["final_lo"] <= cell["final_mean"] <= cell["final_hi"]
        finals = [read_jsonl(root / cell["name"] / f"seed_{s}" / "metrics.jsonl")[-1]["val/acc"] for s in (0, 1)]
        assert cell["finals"] == finals and cell["final_mean"] == sum(finals) / 2
    base, others = summary["cells"][0], summary["cells"][1:]
    assert base["verdict"] == "baseline" and base["diff"] is None
    for cell in others:
        diffs = [a - b for a, b in zip(cell["finals"], base["finals"])]
        assert cell["diff_lo"] == min(diffs) and cell["diff_hi"] == max(diffs)  # 2 pairs: the exact bootstrap's ends
        assert cell["verdict"] == ("better" if min(diffs) > 0 else "worse" if max(diffs) < 0 else "no difference")
    with open(root / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["algo.eps_high"], r["algo.loss_agg"], r["seeds"]) for r in rows] == [
        ("0.2", '"token-mean"', "2"), ("0.2", '"seq-mean-token-mean"', "2"), ("0.28", '"token-mean"', "2"),
        ("0.28", '"seq-mean-token-mean"', "2")]
    report = (root / "report.html").read_text()
    assert '<img src="curves.png"' in report and (root / "curves.png").stat().st_size > 0
    assert all(cell in report for cell in CELLS)
    assert summary["cells"][0]["name"] in second.stdout and "baseline" in second.stdout


def test_status_and_parallel_runs_in_worker_processes(tmp_path, model_dir, capsys):
    spec = write_sweep(tmp_path / "sweep.yaml", model_dir, [3], {"algo.eps_high": [0.2, 0.28]},
                       sweep={"parallel": 2})
    root = tmp_path / "sweep"
    assert run_sweep(read_sweep(spec), root) == 0
    pids = set()
    for cell in ("algo.eps_high=0.2", "algo.eps_high=0.28"):
        run = root / cell / "seed_3"
        [start] = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "start"]
        pids.add(start["pid"])
        threads = read_yaml((run / "config.yaml").read_text())["run"]["threads"]
        assert threads == max(1, len(os.sched_getaffinity(0)) // 2)
    assert len(pids) == 2 and os.getpid() not in pids  # each in a worker process of its own
    assert main(["sweep", "--status", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"sweep {root}: not running" in out and "runs: 2; 2 finished, 0 in progress, 0 failed, 0 not started" in out
    assert "algo.eps_high=0.28  done" in out and "baseline" in out


def test_a_run_that_crashes_is_retried_and_one_that_cannot_run_is_recorded(tmp_path, model_dir, capsys):
    cells = [{"faults": ["crash@3:stage=gen"]},  # raises once in step 3: started again from its step-2 checkpoint
             {"reward.fn": "tests.reward_fixtures:broken_on_answers", "resilience.reward_max_failures": 1},  # fails for good
             {"algo.eps_high": 0.28}]
    spec = write_sweep(tmp_path / "sweep.yaml", model_dir, [0], {"algo.eps_high": [0.2]})
    data = json.loads(spec.read_text())
    del data["grid"]
    spec.write_text(json.dumps({**data, "cells": cells, "baseline": cells[2]}))
    root = tmp_path / "sweep"
    assert run_sweep(read_sweep(spec), root) == 1
    events = [e for e in read_jsonl(root / "events.jsonl") if e["kind"].startswith("run_")]
    runs = {e["run"] for e in events}
    [crashed], [broken] = ([r for r in runs if r.startswith(prefix)] for prefix in ("faults=__crash_3_stage=gen__-", "reward.fn="))
    assert [(e["kind"], e.get("retry")) for e in events if e["run"] == crashed] == [
        ("run_start", None), ("run_failed", True), ("run_start", None), ("run_done", None)]
    [failure] = [e for e in events if e["run"] == broken and e["kind"] == "run_failed"]
    assert failure["retry"] is False and failure["error"].startswith("RewardFailureError")  # a FatalError
    assert [e["from_step"] for e in events if e["run"] == crashed and e["kind"] == "run_start"] == [0, 2]
    summary = json.loads((root / "summary.json").read_text())
    assert [len(c["seeds"]) for c in summary["cells"]] == [1, 0, 1]
    out = capsys.readouterr().out
    assert "1 run failed" in out and f"{broken}: RewardFailureError" in out
