"""The sweep runner's checks before anything trains (reasonrl/experiments/runner.py)."""

from __future__ import annotations

import json
import os

import pytest

from reasonrl.config import dump
from reasonrl.errors import ResumeError, RunDirError
from reasonrl.experiments.runner import SweepLock, check_resumable, check_sweep_dir
from reasonrl.experiments.sweep import SweepRun, parse_sweep


def test_the_sweep_directory_is_new_empty_or_a_sweeps(tmp_path):
    check_sweep_dir(tmp_path / "new")
    check_sweep_dir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="holds files that are not a sweep's \\(notes.txt\\)"):
        check_sweep_dir(tmp_path)
    (tmp_path / "sweep.json").write_text("{}")
    check_sweep_dir(tmp_path)
    with pytest.raises(RunDirError, match="is a file"):
        check_sweep_dir(tmp_path / "notes.txt")


def test_one_sweep_per_directory(tmp_path):
    lock = SweepLock(tmp_path).acquire()
    try:
        assert f'"pid": {os.getpid()}' in SweepLock(tmp_path).holder()
        with pytest.raises(RunDirError, match=f'another reasonrl sweep is running in this directory .*"pid": {os.getpid()}'):
            SweepLock(tmp_path).acquire()
    finally:
        lock.release()
    assert SweepLock(tmp_path).holder() is None
    SweepLock(tmp_path).acquire().release()


def test_a_run_directory_written_with_another_config_is_refused_naming_the_keys(tmp_path):
    def config(eps_high: float, steps: int):
        s = parse_sweep({"recipe": "grpo", "set": {"train.total_steps": steps}, "cells": [{"algo.eps_high": eps_high}],
                         "seeds": [0]}, "s.yaml", tmp_path)
        return s.config(SweepRun(s.cells[0], 0, tmp_path / "run"))

    check_resumable(config(0.2, 30))  # nothing there yet
    dump(config(0.2, 30), tmp_path / "run" / "config.yaml")
    check_resumable(config(0.2, 30))
    check_resumable(config(0.2, 60))  # more steps: the run goes on
    with pytest.raises(ResumeError, match=r"another config than the sweep gives it now \(algo.eps_high: 0.2 -> 0.28\)"):
        check_resumable(config(0.28, 30))
    with pytest.raises(ResumeError, match=r"now \(algo.eps_high: 0.2 -> 0.28\); restore"):  # not the keys a resume may change
        check_resumable(config(0.28, 60))


def test_status_says_where_each_run_stands(tmp_path):
    import torch

    from reasonrl.checkpoint import CheckpointWriter
    from reasonrl.experiments.runner import status_text

    s = parse_sweep({"recipe": "grpo", "set": {"train.total_steps": 4, "eval.every_steps": 2},
                     "grid": {"algo.eps_high": [0.2, 0.28]}, "seeds": [0, 1], "target": 0.5}, "s.yaml", tmp_path)
    root = tmp_path / "sweep"
    root.mkdir()
    (root / "sweep.json").write_text(json.dumps(s.to_dict()))
    done, midway, failed, _ = s.runs(root)
    for run, rows in ((done, [(0, 0.25), (2, 0.5), (4, 0.625)]), (midway, [(0, 0.25), (1, None)])):
        dump(s.config(run), run.dir / "config.yaml")
        (run.dir / "metrics.jsonl").write_text("".join(
            json.dumps({"step": step, **({"val/acc": acc} if acc is not None else {})}) + "\n" for step, acc in rows))
    CheckpointWriter(done.dir / "checkpoints", 2).save(4, {"policy": {"w": torch.zeros(2)}}, {"step": 4})
    (root / "events.jsonl").write_text(json.dumps({"kind": "run_failed", "run": failed.label, "error": "LimitError: x",
                                                   "retry": False, "time": 0, "step": None}) + "\n")
    lock = SweepLock(root).acquire()
    try:
        text = status_text(root)
    finally:
        lock.release()
    lines = text.splitlines()
    assert lines[0] == f"sweep {root}: running (pid {os.getpid()} since " + lines[0].split(" since ")[1]
    assert lines[1] == "runs: 4; 1 finished, 1 in progress, 1 failed, 1 not started"
    assert lines[3].split() == ["cell", "seed", "0", "seed", "1"]
    assert lines[4].split() == ["algo.eps_high=0.2", "done", "0.625", "failed"]
    assert lines[5].split() == ["algo.eps_high=0.28", "step", "1/4", "-"]
    assert f"failed {failed.label}: LimitError: x" in text
    assert "algo.eps_high=0.2   1      0.625" in text  # the summary of the finished run
    assert "not running" in status_text(root)
