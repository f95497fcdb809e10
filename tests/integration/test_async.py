"""Asynchronous rollouts on a tiny random model: staleness 0 is the synchronous run bit for bit
with one or several rollout workers, the staleness bound holds, rollout-side faults act in
async mode, and a rollout worker that dies or hangs is replaced without losing a prompt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import dump, load
from reasonrl.controller import Controller
from reasonrl.ledger import check_ledger
from reasonrl.metrics import read_jsonl
from reasonrl.runtime.scaling import request_scale
from tests.conftest import tiny_run

NOT_VALUES = ("timing_s/", "time", "ettr", "time_lost_s", "mttr_s", "perf/throughput", "perf/max_memory_gb")


def values(row: dict) -> dict:
    """A metrics row without its timings, memory readings and weight transfer sizes (worker
    threads share the policy's module: nothing is copied to them)."""
    return {k: v for k, v in row.items() if not k.startswith((NOT_VALUES[0], "weight_sync/")) and k not in NOT_VALUES
            and not k.endswith("/busy_s")}


def overrides(model_dir, run_dir, steps, *extra):
    return [
        *tiny_run(model_dir, run_dir, steps),
        "algo.dynamic_sampling=true", "algo.max_gen_batches=20",  # early stop, aborted groups, refills
        "run.threads=1",  # the rollout process uses the trainer's thread count: the same numerics
        "eval.every_steps=3", "checkpoint.every_steps=2",
        *extra,
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_async_and_lockstep_at_staleness_0_are_the_synchronous_run_bit_for_bit(model_dir, tmp_path, workers, capsys):
    runs, logged = {}, {}
    modes = ("sync", "async", "lockstep") + (("lockstep-again", "sync-colocated") if workers > 1 else ())
    for mode in modes:
        run_dir = tmp_path / mode
        colocate = "policy" if mode.endswith("colocated") else "auto"  # threads over the policy's own module
        capsys.readouterr()
        Controller.from_config(load(None, overrides(model_dir, run_dir, 6, f"rollout.mode={mode.split('-')[0]}", "rollout.max_staleness=0",
                                        f"runtime.roles.rollout.count={workers}", "run.log_every=3",
                                        f"runtime.roles.rollout.colocate={colocate}"))).run()
        runs[mode] = (load_file(run_dir / "final/model.safetensors"), [values(r) for r in read_jsonl(run_dir / "metrics.jsonl")],
                      read_jsonl(run_dir / "prompts.jsonl"))
        logged[mode] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    # The log line of steps 3 and 6: in async and lockstep modes with the staleness, the queue and the idle times.
    waits = ("stale=0 ", "queue=", "trainer_idle_s=", "rollout_idle_s=")
    assert [line.split()[1] for line in logged["async"]] == ["3/6", "6/6"]
    assert all(all(w in line for w in waits) for mode in ("async", "lockstep") for line in logged[mode]), logged
    assert logged["sync"] and not any(w in line for w in waits for line in logged["sync"]), logged["sync"]
    weights, rows, prompts = runs["sync"]
    assert len(rows) == 7 and "val/acc" in rows[3] and rows[1]["batch/aborted_samples"] + rows[1]["batch/dropped_all_wrong"] > 0
    assert all(rows[s][f"rollout/worker{w}/groups"] > 0 for s in range(1, 7) for w in range(workers))  # every worker served
    for mode in modes[1:]:
        w, r, p = runs[mode]
        assert w.keys() == weights.keys() and all(torch.equal(w[k], weights[k]) for k in w), f"{mode}: weights differ"
        assert r == rows, f"{mode}: metrics rows differ"
        assert p == prompts, f"{mode}: prompt records differ"
    events = read_jsonl(tmp_path / "async" / "events.jsonl")
    [started] = [e for e in events if e["kind"] == "rollout_started"]
    assert len(started["pids"]) == workers and os.getpid() not in started["pids"]  # async: processes of their own
    assert not any(e["kind"].startswith("rollout_worker_") for e in events)


def test_rollout_side_faults_act_in_async_mode_and_name_the_worker(model_dir, tmp_path):
    # the slow worker from step 8: its baseline (steps 4-7) is clean of the reward drills' process starts
    cfg = load(None, overrides(model_dir, tmp_path, 14, "rollout.mode=async", "runtime.roles.rollout.count=2",
                               "runtime.roles.reward.count=1", "runtime.roles.reward.timeout_s=0.5",
                               "faults=[reward_error@2:count=2,reward_timeout@3,slow@8:worker=1:factor=4]",
                               "resilience.slow_window=4", "resilience.slow_min_s=0.005", "eval.every_steps=0",
                               "runtime.roles.rollout.quarantine_ratio=0"))  # the slow worker keeps a share
    Controller.from_config(cfg).run()
    events = read_jsonl(tmp_path / "events.jsonl")
    failed = [e for e in events if e["kind"] == "reward_failed"]
    assert [e["step"] for e in failed][:2] == [2, 3] and "reward[0]: RuntimeError: injected reward error" in failed[0]["errors"][0]
    assert "reward[0]: timeout after 0.5s" in " ".join(failed[1]["errors"])
    # The generation stage's first slowdown names worker 1, from step 8 (a stage of the trainer's
    # that takes a fraction of a millisecond can pass slow_min_s when the machine is busy).
    slow = [e for e in events if e["kind"] == "slowdown" and e["stage"] == "gen"]
    assert slow and slow[0]["worker"] == 1 and slow[0]["step"] >= 8, slow
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 14 and rows[-1]["rollout/worker1/groups"] < rows[-1]["rollout/worker0/groups"]  # work moved off 1


def test_async_staleness_never_exceeds_its_bound(model_dir, tmp_path):
    cfg = load(None, overrides(model_dir, tmp_path, 30, "rollout.mode=async", "rollout.max_staleness=2", "algo.off_policy=decoupled",
                               "eval.every_steps=0", "checkpoint.every_steps=0"))
    Controller.from_config(cfg).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 30
    assert all(r["staleness/max"] <= 2 for r in rows) and all(r["staleness/p99"] <= r["staleness/max"] for r in rows)
    assert max(r["staleness/max"] for r in rows) >= 1  # the rollout process ran ahead of the trainer
    assert all("staleness/dropped_groups" in r and r["staleness/dropped_groups"] >= 0 for r in rows)
    dropped = sum(r["staleness/dropped_groups"] for r in rows)
    assert dropped == sum(len(p["stale"]) for p in read_jsonl(tmp_path / "prompts.jsonl"))
    for key in ("off_policy/behaviour_kl", "off_policy/is_weight_mean", "off_policy/is_weight_max", "off_policy/is_truncated_frac",
                "off_policy/ess", "rollout/queue_length", "rollout/wasted_tokens", "timing_s/trainer_idle", "timing_s/rollout_idle",
                "timing_s/group_queued", "timing_s/group_in_flight", "staleness/mean"):
        assert key in rows[-1], key
    lagged = [r for r in rows if r["staleness/max"] > 0]
    assert all(r["off_policy/is_weight_max"] != 1.0 for r in lagged)  # stale samples: weights are not all 1


def test_partial_rollouts_keep_the_bound(model_dir, tmp_path):
    cfg = load(None, overrides(model_dir, tmp_path, 12, "rollout.mode=async", "rollout.max_staleness=1", "rollout.interrupt=true",
                               "algo.off_policy=tis", "rollout.max_new_tokens=16", "eval.every_steps=0"))
    Controller.from_config(cfg).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 12 and all(r["staleness/max"] <= 1 for r in rows)
    assert all(0 <= r["rollout/partial_samples"] <= 8 for r in rows)  # samples whose tokens span two versions


def _run_async(tmp_path, model_dir, steps, *extra, supervised: bool = False) -> subprocess.Popen:
    args = [sys.executable, "-m", "reasonrl.cli", "train", "grpo", *([] if supervised else ["--no-supervisor"]),
            *overrides(model_dir, tmp_path, steps, "rollout.mode=async", "rollout.max_staleness=1", "algo.off_policy=tis",
                       "eval.every_steps=0", *extra)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _rollout_pids(run_dir, after_steps: int) -> list[int]:
    def ready():
        events = read_jsonl(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
        rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
        started = [e["pids"] for e in events if e["kind"] == "rollout_started"]
        return started[-1] if started and len(rows) >= after_steps else None

    return _wait_for(ready, 120, f"{after_steps} steps and the rollout workers")


def _events(run_dir) -> list[dict]:
    return read_jsonl(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []


def _joined(run_dir, count: int) -> list[dict]:
    """The first ``count`` rollout_worker_joined events, waiting for them."""
    def found():
        joins = [e for e in _events(run_dir) if e["kind"] == "rollout_worker_joined"]
        return joins if len(joins) >= count else None

    return _wait_for(found, 120, f"{count} rollout_worker_joined events")


def _assert_whole_groups(run_dir, n: int) -> None:
    """Every trained group is ``n`` samples of one prompt, each sample index once (the train
    records of samples.jsonl hold the whole batch)."""
    records = [r for r in read_jsonl(run_dir / "samples.jsonl") if r["split"] == "train"]
    steps = {r["step"] for r in records}
    rows = read_jsonl(run_dir / "metrics.jsonl")
    for step in steps:
        mine = [r for r in records if r["step"] == step]
        by_prompt: dict[str, list[int]] = {}
        for r in mine:
            by_prompt.setdefault(r["prompt_id"], []).append(r["sample"])
        assert all(sorted(samples) == list(range(n)) for samples in by_prompt.values()), (step, by_prompt)
        assert len(by_prompt) == rows[step - 1]["batch/kept_groups"]


@pytest.mark.slow
def test_a_rollout_worker_killed_three_times_costs_no_sample_and_no_partial_group(model_dir, tmp_path):
    proc = _run_async(tmp_path, model_dir, 14, "runtime.roles.rollout.count=3", "run.keep_samples=8",
                      "runtime.roles.rollout.quarantine_ratio=0")
    killed = []
    try:
        pids = _rollout_pids(tmp_path, after_steps=2)
        for k in range(3):
            os.kill(pids[1], signal.SIGKILL)
            killed.append(pids[1])
            pids[1] = _joined(tmp_path, k + 1)[k]["pid"]  # its replacement, killed in turn
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, _tail(err)
    events = read_jsonl(tmp_path / "events.jsonl")
    deaths = [e for e in events if e["kind"] == "rollout_worker_died"]
    assert [(e["worker"], e["pid"]) for e in deaths] == [(1, pid) for pid in killed]
    joins = [e for e in events if e["kind"] == "rollout_worker_joined"]
    assert [(e["worker"], e["replaced"]) for e in joins] == [(1, pid) for pid in killed]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 15))
    _assert_every_prompt_used_once(tmp_path)
    _assert_whole_groups(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.serial  # the stop and the slowdown are found by wall time
def test_a_stopped_worker_is_hung_within_its_timeout_and_a_slowed_one_is_quarantined(model_dir, tmp_path):
    proc = _run_async(tmp_path, model_dir, 16, "runtime.roles.rollout.count=3", "runtime.roles.rollout.timeout_s=3",
                      "runtime.roles.rollout.quarantine_ratio=3", "runtime.roles.rollout.quarantine_steps=2",
                      "resilience.slow_min_s=0.005",
                      "faults=[slow@3:worker=2:factor=30:steps=40]")
    try:
        quarantined = _wait_for(lambda: [e for e in _events(tmp_path) if e["kind"] == "rollout_worker_quarantined"
                                         and e["worker"] == 2], 180, "the slowed worker's quarantine")
        pids = _rollout_pids(tmp_path, after_steps=8)
        os.kill(pids[0], signal.SIGSTOP)
        stopped_at = time.time()
        hung = _wait_for(lambda: [e for e in _events(tmp_path) if e["kind"] == "rollout_worker_hung"], 120,
                         "the stopped worker's detection")
        detected_in = time.time() - stopped_at
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, _tail(err)
    assert quarantined[0]["ratio"] > 3 and quarantined[0]["steps"] == 2
    assert hung[0]["worker"] == 0 and hung[0]["pid"] == pids[0] and "timeout_s" in hung[0]["error"]
    assert detected_in < 3 + 30  # the timeout, and the step it was detected in
    events = read_jsonl(tmp_path / "events.jsonl")
    joins = [(e["worker"], e["replaced"]) for e in events if e["kind"] == "rollout_worker_joined"]
    assert (2, quarantined[0]["pid"]) in joins and (0, pids[0]) in joins
    [fired] = [e for e in events if e["kind"] == "fault_injected" and e.get("fault", "").startswith("slow")]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 17))
    _assert_every_prompt_used_once(tmp_path)


def _assert_every_prompt_used_once(run_dir):
    """From the run's own records (reasonrl ledger): every draw of the sampler appears once, the
    trained ones were kept, and what was kept was trained, dropped stale, or left over at the end."""
    ledger = check_ledger(run_dir)
    assert ledger.ok and ledger.finished, ledger.describe()
    assert ledger.counts["trained"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 2])  # no queue, and a queue two versions deep
def test_an_async_run_killed_in_generation_in_the_update_and_during_a_scale_change_loses_no_sample(
        model_dir, tmp_path, staleness):
    faults = "faults=[sigkill@3:stage=gen,sigkill@5:stage=update_actor]"  # with groups queued at staleness > 0
    proc = _run_async(tmp_path, model_dir, 12, "checkpoint.every_steps=2", f"rollout.max_staleness={staleness}",
                      "resilience.backoff_s=0.05", faults, supervised=True)
    try:
        _wait_for(lambda: _steps_done(tmp_path) >= 7, 240, "7 steps")
        trainer = [e["pid"] for e in _events(tmp_path) if e["kind"] == "start"][-1]
        _scale(tmp_path, 2)
        os.kill(trainer, signal.SIGKILL)  # while the fleet grows, or just before
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, _tail(err)
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [e["kind"] for e in events].count("killed") == 3
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 13))
    assert any(e["kind"] == "rollout_started" and len(e["pids"]) == 2 for e in events)  # the restart kept the count
    _assert_every_prompt_used_once(tmp_path)


def _tail(err: str) -> str:
    """The end of a run's stderr without the progress bars of weight loading."""
    return "\n".join(line for line in err.splitlines() if line.strip() and "Loading weights" not in line)[-3000:]


def _scale(run_dir, count: int, *more: str) -> None:
    from reasonrl.cli import main

    assert main(["scale", str(run_dir), f"rollout={count}", *more]) == 0


def _steps_done(run_dir) -> int:
    return len(read_jsonl(run_dir / "metrics.jsonl")) if (run_dir / "metrics.jsonl").exists() else 0


@pytest.mark.slow
def test_reasonrl_scale_grows_an_async_fleet_to_three_and_back_to_one_and_loses_no_sample(model_dir, tmp_path):
    proc = _run_async(tmp_path, model_dir, 14, "runtime.roles.rollout.max=3", "runtime.roles.reward.count=1")
    try:
        _wait_for(lambda: _steps_done(tmp_path) >= 3, 120, "3 steps")
        _scale(tmp_path, 3, "reward=2")
        joins = _joined(tmp_path, 2)
        _wait_for(lambda: _steps_done(tmp_path) >= 9, 120, "9 steps")
        _scale(tmp_path, 1)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, _tail(err)
    events = read_jsonl(tmp_path / "events.jsonl")
    scaled = [(e["workers"], e["step"]) for e in events if e["kind"] == "rollout_scaled"]
    assert [w for w, _ in scaled] == [3, 1] and 4 <= scaled[0][1] < scaled[1][1]
    assert [(e["workers"], e["step"]) for e in events if e["kind"] == "reward_scaled"] == [(2, scaled[0][1])]
    assert sorted(j["worker"] for j in joins[:2]) == [1, 2] and all(j["reason"] == "scale" for j in joins[:2])
    for j in joins[:2]:  # it serves the weights current when it joined: an event's step counts the steps done, and
        assert j["step"] <= j["version"] <= j["step"] + 1, j  # the next step's update is current while it is published
    left = [e["worker"] for e in events if e["kind"] == "rollout_worker_left"]
    assert sorted(left) == [1, 2]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 15))
    assert any(r.get("rollout/worker2/groups", 0) > 0 for r in rows)  # the joined workers served
    after = [r for r in rows if r["step"] > scaled[1][1] + 2]  # collected after the fleet shrank
    assert all(r["rollout/live_workers"] == 1 for r in after), [r["rollout/live_workers"] for r in rows]
    _assert_every_prompt_used_once(tmp_path)


def _scheduled(run_dir, cfg, schedule: dict[int, int]):
    """``cfg``'s run directory with its config and the rollout fleet's schedule (step: count)
    written before the run starts."""
    run_dir.mkdir(parents=True)
    dump(cfg, run_dir / "config.yaml")
    for step, count in schedule.items():
        request_scale(run_dir, {"rollout": count}, at_step=step)
    return cfg


@pytest.mark.slow
def test_a_lockstep_run_scaled_on_a_schedule_and_killed_at_several_points_ends_bit_identical(model_dir, tmp_path):
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    common = ["rollout.mode=lockstep", "rollout.max_staleness=1", "algo.off_policy=decoupled", "checkpoint.every_steps=1",
              "checkpoint.keep=3", "resilience.backoff_s=0.05", "resilience.max_restarts=8", "runtime.roles.rollout.count=2",
              "runtime.roles.rollout.max=3"]
    schedule = {3: 3, 6: 1}  # 2 workers, 3 from step 3's collect on, 1 from step 6's
    Controller.from_config(_scheduled(clean, load("recipes/grpo.yaml", overrides(model_dir, clean, 8, *common)), schedule)).run()
    # killed in generation as the fleet has just grown, in update_actor (tests/integration/test_fault_drills.py) and
    # in generation with one worker left
    faults = "faults=[sigkill@3:stage=gen,ckpt_kill@5,sigkill@7:stage=gen]"
    args = overrides(model_dir, faulty, 8, *common, faults)
    _scheduled(faulty, load("recipes/grpo.yaml", args), schedule)
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", "grpo", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, _tail(proc.stderr)
    events = read_jsonl(faulty / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.count("killed") == 3 and kinds.count("recovered") == 3
    for run in (clean, faulty):
        live = [r["rollout/live_workers"] for r in read_jsonl(run / "metrics.jsonl") if r["step"] > 0]
        assert live == [2, 2, 3, 3, 3, 1, 1, 1], (run.name, live)
    a, b = load_file(clean / "final/model.safetensors"), load_file(faulty / "final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed lockstep run's weights differ from the clean run"
    # every value but the queue length (whether the next batch was ready yet is a matter of timing)
    drop = lambda r: {k: v for k, v in values(r).items() if k != "rollout/queue_length"}  # noqa: E731
    assert [drop(r) for r in read_jsonl(faulty / "metrics.jsonl")] == [drop(r) for r in read_jsonl(clean / "metrics.jsonl")]
    assert json.loads((faulty / "summary.json").read_text())["incidents"]["killed"] == 3
