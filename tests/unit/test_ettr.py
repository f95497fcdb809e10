"""ETTR from the event log, by hand: what is lost to incidents, and what is neither productive nor lost."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import reasonrl
from reasonrl.resilience.ettr import INCIDENT_KINDS, LIFECYCLE_KINDS, effective_time, step_seconds


def ev(time, kind, step, **fields):
    return {"time": time, "kind": kind, "step": step, **fields}


STEPS = {1: 2.0, 2: 2.0, 3: 3.0, 4: 3.0, 5: 4.0, 6: 1.0}


def test_a_clean_run_loses_nothing_whatever_its_loading_and_validation_took():
    events = [ev(0.0, "resume", 0, from_step=0), ev(30.0, "start", 0), ev(100.0, "checkpoint", 6), ev(101.0, "done", 6)]
    figures = effective_time(events, STEPS)
    assert figures["ettr"] == 1.0 and figures["lost_s"] == 0.0 and figures["productive_s"] == 15.0
    assert figures["incidents"] == {} and figures["steps"] == 6


def test_time_between_two_invocations_is_not_lost():
    events = [ev(0.0, "start", 0), ev(20.0, "checkpoint", 3), ev(20.5, "stopped", 3, signal="SIGTERM"),
              ev(5000.0, "resume", 3, from_step=3), ev(5001.0, "start", 3), ev(5020.0, "done", 6)]
    assert effective_time(events, STEPS)["ettr"] == 1.0


def test_a_resumed_run_that_crashes_loses_nothing_of_the_gap_before_it():
    # The first invocation stops after step 3; 900 s later the second one's first attempt dies
    # while loading (no resume, no start of its own), and its restart resumes from step 3.
    events = [ev(0.0, "start", 0), ev(20.0, "checkpoint", 3), ev(20.5, "stopped", 3, signal="SIGTERM"),
              ev(930.0, "crash", 3, started=920.0),
              ev(935.0, "resume", 3, from_step=3), ev(936.0, "start", 3),
              ev(940.0, "recovered", 4, recover_s=10.0, steps_lost=0), ev(950.0, "done", 6)]
    figures = effective_time(events, STEPS)
    assert figures["lost_s"] == pytest.approx(15.0)  # 920 (the attempt began) -> 935 (its restart resumed)
    assert figures["ettr"] == pytest.approx(15.0 / 30.0)
    # The same without the attempt's start time (a log of an older supervisor): from the end of the
    # previous invocation (20.5), not from its checkpoint (20.0) or its start (0.0).
    del events[3]["started"]
    assert effective_time(events, STEPS)["lost_s"] == pytest.approx(935.0 - 20.5)


def test_failures_an_invocation_gave_up_on_lose_nothing_of_the_gap_after_it():
    events = [ev(0.0, "start", 0), ev(10.0, "checkpoint", 2), ev(12.0, "crash", 3, started=0.0),
              ev(14.0, "crash", 2, started=13.0), ev(14.5, "gave_up", 2, restarts=1),
              ev(900.0, "resume", 2, from_step=2), ev(901.0, "start", 2), ev(920.0, "done", 6)]
    figures = effective_time(events, STEPS)
    assert figures["lost_s"] == pytest.approx(4.5)  # the checkpoint (10) -> gave_up (14.5), not -> 900
    assert figures["incidents"] == {"crash": 2, "gave_up": 1}


def test_a_resume_from_the_snapshot_loses_from_the_snapshot_on():
    """Checkpoint at step 2 (t=104), snapshot of step 4 taken at t=109, a kill at t=110; the
    restart resumes from the snapshot at t=111.5: 2.5 s lost, not the 7.5 s since the checkpoint."""
    events = [
        ev(100.0, "start", 0), ev(104.0, "checkpoint", 2), ev(110.0, "killed", 4),
        ev(111.5, "resume", 4, from_step=4, source="snapshot", state_time=109.0), ev(111.6, "start", 4),
        ev(113.0, "recovered", 5, recover_s=3.0, steps_lost=0),
    ]
    figures = effective_time(events, STEPS)
    assert figures["lost_s"] == pytest.approx(2.5) and figures["steps_lost"] == 0


def test_consecutive_failures_before_one_restart_count_once():
    events = [
        ev(100.0, "start", 0), ev(104.0, "checkpoint", 2),
        ev(110.0, "crash", 3),                        # the attempt dies after step 3
        ev(112.0, "hang", 2),                         # the next dies while loading (no resume, no start)
        ev(120.0, "resume", 2, from_step=2), ev(120.5, "start", 2),
        ev(130.0, "killed", 4),                       # then a kill after step 4, no checkpoint since step 2
        ev(133.0, "resume", 2, from_step=2), ev(133.2, "start", 2),
        ev(140.0, "recovered", 3, recover_s=4.0, steps_lost=2),
    ]
    figures = effective_time(events, STEPS)
    # 104 -> 120 (16 s) and then from the restarted attempt's start 120.5 -> 133 (12.5 s)
    assert figures["lost_s"] == pytest.approx(16.0 + 12.5)
    assert figures["ettr"] == pytest.approx(15.0 / (15.0 + 28.5))
    assert figures["incidents"] == {"crash": 1, "hang": 1, "killed": 1}
    assert figures["mttr_s"] == 4.0 and figures["steps_lost"] == 2


def test_rollbacks_and_skipped_updates_are_wasted_steps():
    events = [
        ev(0.0, "start", 0),
        ev(10.0, "nonfinite", 2, action="skip"),
        ev(20.0, "rollback", 5, from_step=3, recover_s=0.5),  # undoes steps 4 and 5
        ev(30.0, "nonfinite", 5, action="rollback"),          # the rollback's own verdict: not a skip
    ]
    figures = effective_time(events, STEPS)
    wasted = STEPS[2] + STEPS[4] + STEPS[5]
    assert figures["productive_s"] == pytest.approx(15.0 - wasted)
    assert figures["lost_s"] == pytest.approx(wasted + 0.5) and figures["steps_wasted"] == 3
    assert figures["ettr"] == pytest.approx((15.0 - wasted) / (15.5))


def test_step_seconds_keeps_each_steps_last_row_and_skips_validation_rows():
    rows = [{"step": 0, "val/acc": 0.3}, {"step": 1, "timing_s/step": 2.0}, {"step": 1, "timing_s/step": 2.5}]
    assert step_seconds(rows) == {1: 2.5}


def test_a_replaced_rollout_worker_loses_its_seconds_inside_the_step():
    events = [ev(0.0, "start", 0), ev(0.5, "rollout_started", 0, pids=[7, 8]),
              ev(3.0, "rollout_worker_died", 2, worker=1, pid=7, seconds_lost=0.5),
              ev(5.0, "rollout_worker_hung", 3, worker=0, pid=8, seconds_lost=1.5)]
    out = effective_time(events, {1: 2.0, 2: 2.0, 3: 4.0})
    # productive 8 - 0.5 - 1.5 = 6, lost 2: 6 / 8
    assert out["ettr"] == 0.75 and out["lost_s"] == 2.0 and out["productive_s"] == 6.0
    assert out["incidents"] == {"rollout_worker_died": 1, "rollout_worker_hung": 1}  # rollout_started is no incident


def test_a_worker_lost_from_a_fleet_costs_its_share_of_the_fleet():
    events = [ev(0.0, "start", 0), ev(3.0, "rollout_worker_died", 2, worker=1, pid=7, seconds_lost=4.0, workers=4),
              ev(5.0, "rollout_worker_hung", 3, worker=0, pid=8, seconds_lost=1.5, workers=1)]
    out = effective_time(events, {1: 2.0, 2: 2.0, 3: 4.0})
    # lost 4 / 4 + 1.5 / 1 = 2.5, productive 8 - 2.5 = 5.5: 5.5 / 8
    assert out["lost_s"] == 2.5 and out["productive_s"] == 5.5 and out["ettr"] == 5.5 / 8


def test_incidents_are_the_failures_only():
    events = [ev(0.0, "start", 0, resumed=False), ev(0.1, "resume", 0, from_step=0), ev(0.5, "rollout_started", 0, pids=[7]),
              ev(1.0, "rollout_scaled", 1, workers=2), ev(1.1, "rollout_worker_joined", 1, worker=1),
              ev(1.2, "fault_injected", 2, fault="sigkill@2"), ev(1.5, "checkpoint", 2), ev(1.6, "rollout_worker_left", 3),
              ev(2.0, "spike", 3, metric="actor/grad_norm"), ev(2.5, "reward_failed", 4, samples=1),
              ev(3.0, "slowdown", 5, stage="gen"), ev(3.5, "slowdown_recovered", 6, stage="gen"),
              ev(4.0, "rollout_leftover", 6, groups=[])]
    out = effective_time(events, {s: 1.0 for s in range(1, 7)})
    assert out["incidents"] == {"spike": 1, "reward_failed": 1, "slowdown": 1}


def _emitted_kinds() -> set[str]:
    """Every event kind written as a string literal in the first argument of an ``emit`` or
    ``_emit`` call in the package (``"a" if x else "b"`` gives both)."""
    kinds = set()
    for path in Path(reasonrl.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = getattr(node, "func", None)
            name = getattr(func, "attr", getattr(func, "id", ""))
            if isinstance(node, ast.Call) and name in ("emit", "_emit") and node.args:
                kinds |= {c.value for c in ast.walk(node.args[0]) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return kinds


def test_every_event_kind_the_code_writes_is_either_a_failure_or_part_of_the_runs_course():
    kinds = _emitted_kinds()
    assert {"rollout_started", "rollout_scaled", "hang", "checkpoint_failed"} <= kinds  # the scan finds them
    assert not INCIDENT_KINDS & LIFECYCLE_KINDS
    assert kinds - INCIDENT_KINDS - LIFECYCLE_KINDS == set()
    assert "rollout_started" in LIFECYCLE_KINDS and "fault_injected" in LIFECYCLE_KINDS
