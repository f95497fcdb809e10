"""One trainer per run directory, no orphan after the supervisor dies, and the stop signals:
real ``reasonrl train`` processes, killed and interrupted, on one run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from reasonrl.cli import main
from reasonrl.metrics import read_jsonl
from tests.conftest import tiny_run

pytestmark = pytest.mark.slow

SLOWER = ("checkpoint.every_steps=5", "run.threads=1")


def command(model_dir, run_dir, steps, *extra, supervised=True):
    return [sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, run_dir, steps), *SLOWER, *extra,
            *([] if supervised else ["--no-supervisor"])]


def start(cmd, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    return rows[-1]["step"] if rows else 0


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def holders(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.lock").read_text())


def kill_all(*procs):
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_trainer_is_refused_and_no_orphan_outlives_a_killed_supervisor(model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    a = b = None
    try:
        a = start(command(model_dir, run, 400), tmp_path / "a.log")
        wait_for(lambda: last_step(run) >= 3, 60, "the first trainer's step 3")
        trainer = holders(run)["trainer"]
        assert holders(run)["supervisor"] == a.pid and alive(trainer)
        maps = Path(f"/proc/{a.pid}/maps").read_text()  # the checks ran in the trainer: the supervisor loads no torch
        assert "libtorch" not in maps and "libc10" not in maps
        # A second trainer on the same directory, supervised or not, is refused naming the holder.
        for extra in ([], ["--no-supervisor"]):
            code = main(["train", "grpo", *tiny_run(model_dir, run, 400), *SLOWER, *extra])
            err = capsys.readouterr().err
            assert code == 2 and "in use by another reasonrl trainer" in err and f"trainer pid {trainer}" in err, err
        # SIGKILL of the supervisor alone: its trainer checkpoints and ends within 20 s, no orphan trains on.
        a.kill()
        a.wait()
        wait_for(lambda: not alive(trainer), 20, f"the orphaned trainer {trainer} to end")
        stopped_at = last_step(run)
        checkpoints = [e["step"] for e in read_jsonl(run / "events.jsonl") if e["kind"] == "checkpoint"]
        assert checkpoints[-1] == stopped_at  # it stopped as after SIGTERM: with a checkpoint of its last step
        # The rerun resumes there; Ctrl-C (SIGINT to the supervisor) checkpoints and exits 130.
        b = start(command(model_dir, run, 400), tmp_path / "b.log")
        wait_for(lambda: last_step(run) > stopped_at, 60, "the rerun's first new step")
        b.send_signal(signal.SIGINT)
        assert b.wait(timeout=60) == 130, (tmp_path / "b.log").read_text()[-3000:]
        stopped_at = last_step(run)
        events = read_jsonl(run / "events.jsonl")
        assert events[-1]["kind"] == "stopped" and events[-1]["signal"] == "SIGINT"
        assert [e["step"] for e in events if e["kind"] == "checkpoint"][-1] == stopped_at
    finally:
        kill_all(a, b)
    # Across the three trainers, every step's metrics row was written exactly once.
    counts = Counter(row["step"] for row in read_jsonl(run / "metrics.jsonl"))
    assert sorted(counts) == list(range(1, stopped_at + 1)) and set(counts.values()) == {1}
    incidents = json.loads((run / "summary.json").read_text())["incidents"]
    assert incidents == {}, incidents  # stops and the lost supervisor are not failures


def test_sigint_and_sigterm_without_the_supervisor_checkpoint_and_exit_130_and_143(model_dir, tmp_path):
    procs = {}
    try:
        for name in ("int", "term"):
            procs[name] = start(command(model_dir, tmp_path / name, 400, supervised=False), tmp_path / f"{name}.log")
        for name in procs:
            wait_for(lambda: last_step(tmp_path / name) >= 2, 60, f"{name}'s step 2")
        procs["int"].send_signal(signal.SIGINT)
        procs["term"].send_signal(signal.SIGTERM)
        codes = {name: p.wait(timeout=60) for name, p in procs.items()}
    finally:
        kill_all(*procs.values())
    assert codes == {"int": 130, "term": 143}
    for name in procs:
        run, log = tmp_path / name, (tmp_path / f"{name}.log").read_text()
        assert "Traceback" not in log and "stopping after this step, with a checkpoint" in log, log[-2000:]
        checkpoints = [e["step"] for e in read_jsonl(run / "events.jsonl") if e["kind"] == "checkpoint"]
        assert checkpoints[-1] == last_step(run) and not (run / "final").exists()
