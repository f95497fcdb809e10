"""ETTR from the event log, by hand: what is lost to incidents, and what is neither productive nor lost."""

from __future__ import annotations

import pytest

from reasonrl.resilience.ettr import effective_time, step_seconds


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
