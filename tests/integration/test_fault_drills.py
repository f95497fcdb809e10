"""Injected faults on a real supervised training process (tiny random model), checked in events.jsonl.

Run A: crashes, SIGKILLs at several points (in generation, in the update, in the middle of a
checkpoint write), a full disk at a checkpoint and a hang, all in one run; the supervisor
restarts the trainer from the in-memory snapshot of its last step each time and the final
weights are bit-identical to an uninterrupted run.
Run B: faults handled inside the process: NaN loss (update skipped, then a rollback),
reward timeouts and errors (samples failed, run goes on), and a slow rollout worker
(detected as fail-slow, work shifted away from it).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.metrics import read_jsonl
from reasonrl.report import load_run
from tests.conftest import tiny_run

pytestmark = pytest.mark.slow


def overrides(model_dir, run_dir, steps, *extra):
    return [
        *tiny_run(model_dir, run_dir, steps),
        "checkpoint.every_steps=1",
        "checkpoint.keep=3",
        "resilience.backoff_s=0.05",
        *extra,
    ]


def supervised(args, timeout_s=300):
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", "grpo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def test_restarts_after_every_restart_fault_in_one_run_end_bit_identical(model_dir, tmp_path):
    # Not serial: its hang is injected (it never ends), and a step takes a small part of the 10 s
    # hang timeout even on a core shared with the rest of the suite.
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    Controller.from_config(load("recipes/grpo.yaml", overrides(model_dir, clean, 6))).run()
    faults = "faults=[crash@2,disk_full@2,sigkill@3:stage=gen,ckpt_kill@4,sigkill@5:stage=update_actor,hang@6:stage=adv]"
    proc = supervised(overrides(model_dir, faulty, 6, faults, "resilience.hang_timeout_s=10", "resilience.max_restarts=8"),
                      timeout_s=480)  # five restarts
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("memory: ") == 1 and proc.stdout.count("roles:") == 1  # the first child's checks, not a restart's
    assert "openmp: threads wait as the environment sets them (OMP_WAIT_POLICY=PASSIVE)" in proc.stdout  # tests/conftest.py's
    events = read_jsonl(faulty / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.count("crash") == 1 and kinds.count("killed") == 3 and kinds.count("hang") == 1
    hang = next(e for e in events if e["kind"] == "hang")
    assert hang["stage"] == "adv" and "in _hang_forever" in hang["stack"] and "in step" in hang["stack"]
    recovered = [e for e in events if e["kind"] == "recovered"]
    # Every restart resumed from the in-memory snapshot of the last finished step (the default
    # resilience.snapshot_every=1): no step was redone.
    assert [e.get("source") for e in events if e["kind"] == "resume"][1:] == ["snapshot"] * 5
    assert all(e["recover_s"] >= 0 and e["steps_lost"] == 0 for e in recovered)
    # crash@2 fires at step 2's first stage, after step 1's checkpoint (not in the checkpoint stage)
    crash = next(e for e in events if e["kind"] == "fault_injected" and e["fault"] == "crash@2")
    assert crash["stage"] != "checkpoint" and recovered[0]["from_step"] == 1
    # Step 2's checkpoint found the disk full; its snapshot was written first, and the trainer
    # restarted after the kill in step 3's generation resumed from it and wrote the checkpoint.
    assert [e["step"] for e in events if e["kind"] == "checkpoint_failed"] == [2]
    assert [e["step"] for e in events if e["kind"] == "checkpoint"] == [1, 2, 3, 4, 5, 6]
    # ckpt_kill@4 died after step 4's snapshot: the restart resumed at step 4 (and wrote its
    # checkpoint), then died in step 5's update before a new step: one recovery for both.
    assert any(e["kind"] == "fault_injected" and e["fault"].startswith("ckpt_kill") for e in events)
    assert [(e["from_step"], e["failures"]) for e in recovered] == [(1, 1), (2, 1), (4, 2), (5, 1)]
    a = load_file(clean / "checkpoints/step_6/policy.safetensors")
    b = load_file(faulty / "checkpoints/step_6/policy.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed run's weights differ from the clean run"
    rows = read_jsonl(faulty / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert 0 < rows[-1]["ettr"] < 1 and rows[-1]["time_lost_s"] > 0 and rows[-1]["mttr_s"] > 0
    summary = json.loads((faulty / "summary.json").read_text())
    assert summary["incidents"] == {"crash": 1, "killed": 3, "hang": 1, "checkpoint_failed": 1}  # failures, not injections
    # One ETTR: the last metrics row, summary.json and the report say the same.
    report = load_run(faulty).figures
    assert rows[-1]["ettr"] == pytest.approx(summary["ettr"], abs=1e-12) == pytest.approx(report["ettr"], abs=1e-12)
    assert rows[-1]["time_lost_s"] == pytest.approx(summary["time_lost_s"], abs=1e-9)


@pytest.mark.serial  # the slow worker is found by wall time
def test_nan_reward_faults_and_a_slow_worker_are_handled_in_process(model_dir, tmp_path):
    run = tmp_path / "run"
    faults = "faults=[nan@3,nan@4,reward_timeout@5:count=2,reward_error@6:count=3,slow@6:worker=1:factor=4:steps=6]"
    args = overrides(
        model_dir, run, 12, faults,
        "resilience.nonfinite_max_consecutive=2", "runtime.roles.reward.count=1", "runtime.roles.reward.timeout_s=0.5",
        # the tiny model generates in milliseconds: a 10 ms floor keeps their noise out, the 4x worker costs ~25 ms a step
        "runtime.roles.rollout.count=2", "resilience.slow_window=4", "resilience.slow_min_s=0.01", "train.prompts_per_step=8",
        "train.mini_batch_size=16",
    )
    proc = supervised(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_jsonl(run / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.count("nonfinite") == 2 and kinds.count("rollback") == 1
    assert next(e for e in events if e["kind"] == "rollback")["step"] == 4
    failed = [e for e in events if e["kind"] == "reward_failed"]
    assert [e["step"] for e in failed] == [5, 6] and [e["samples"] for e in failed] == [2, 3]
    assert "timeout" in failed[0]["errors"][0]
    slow = next(e for e in events if e["kind"] == "slowdown")
    assert slow["stage"] == "gen" and slow["worker"] == 1 and 6 <= slow["step"] < 12 and slow["factor"] > 1.5
    rows = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl")}
    before, after = rows[slow["step"]], rows[slow["step"] + 1]
    assert before["rollout/worker1/groups"] >= before["rollout/worker0/groups"] - 2  # shared alike until the detection
    assert after["rollout/worker1/groups"] < after["rollout/worker0/groups"]  # then work moved away from worker 1
    assert rows[5]["train/reward_failed"] == 2 and rows[5]["reward/timeouts"] == 2 and rows[6]["reward/timeouts"] == 0
    assert rows[3]["actor/nonfinite_skips"] >= 1
    assert "crash" not in kinds and "killed" not in kinds


def test_each_trainer_is_forked_from_one_template_that_ends_with_supervision(model_dir, tmp_path):
    """resilience.trainer_template (the default): the first trainer and its restart after a
    crash are children of one template, itself the supervisor's child, which shows the trainer's
    command and is gone once the run is (false: tests/unit/test_supervisor.py)."""
    run = tmp_path / "run"
    args = overrides(model_dir, run, 4, "faults=[crash@2]")
    proc = subprocess.Popen([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    parents: dict[int, int] = {}  # each trainer's parent, read while it runs
    seen: dict[int, tuple[int, bytes]] = {}  # each parent's own parent and command line
    deadline = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in _started(run):
                if pid not in parents and (parent := _parent(pid)) is not None:
                    parents[pid] = parent
                    with contextlib.suppress(OSError):
                        seen[parent] = (_parent(parent), Path(f"/proc/{parent}/cmdline").read_bytes())
            time.sleep(0.01)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert sorted(parents) == sorted(_started(run)) and len(parents) == 2, (parents, _started(run))
    [template_pid] = set(parents.values())
    grandparent, cmdline = seen[template_pid]
    assert template_pid != proc.pid and grandparent == proc.pid
    assert b"_serve_template" in cmdline and f"run.dir={run}".encode() in cmdline.split(b"\0")
    with contextlib.suppress(OSError):  # gone with the run (or its pid already reused)
        assert b"_serve_template" not in Path(f"/proc/{template_pid}/cmdline").read_bytes()


def _started(run_dir) -> list[int]:
    """The pids of the trainers' ``start`` events so far (a line being written is skipped)."""
    pids = []
    with contextlib.suppress(FileNotFoundError):
        for line in (run_dir / "events.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event["kind"] == "start":
                    pids.append(event["pid"])
    return pids


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _processes_of(run_dir) -> list[int]:
    """Pids of the processes whose command line names ``run_dir`` (the trainer template's and
    its trainers' too)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"run.dir={run_dir}".encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_a_killed_trainer_resumes_warm_from_the_snapshot_and_ends_bit_identical(model_dir, tmp_path):
    """No checkpoint before the kill (every 20 steps): the standby, built while the first
    trainer trained, resumes from the in-memory snapshot of step 9, loses no step, and the
    weights equal the clean run's; the next standby does not outlive the run."""
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    base = [*tiny_run(model_dir, clean, 12), "checkpoint.every_steps=20"]
    Controller.from_config(load("recipes/grpo.yaml", base)).run()
    args = [*tiny_run(model_dir, faulty, 12), "checkpoint.every_steps=20", "resilience.backoff_s=0.05",
            "resilience.standby=true", "faults=[sigkill@10:stage=update_actor]"]
    proc = supervised(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_jsonl(faulty / "events.jsonl")
    resumes = [e for e in events if e["kind"] == "resume"]
    assert resumes[-1]["source"] == "snapshot" and resumes[-1]["from_step"] == 9
    recovered = next(e for e in events if e["kind"] == "recovered")
    assert recovered["steps_lost"] == 0 and recovered["warm"] is True
    assert [e["step"] for e in events if e["kind"] == "checkpoint"] == [12]
    a = load_file(clean / "checkpoints/step_12/policy.safetensors")
    b = load_file(faulty / "checkpoints/step_12/policy.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "the run resumed from the snapshot differs from the clean run"
    assert [r["step"] for r in read_jsonl(faulty / "metrics.jsonl")] == list(range(1, 13))
    assert _processes_of(faulty) == []
