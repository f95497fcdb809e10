"""The rollout fleet: per-group dispatch, rows back in prompt order, streaming with early stop
across workers in one worker's order, failover of a dead worker, weights to every worker."""

from __future__ import annotations

import time

import pytest
import torch

from reasonrl.restarts import RestartPolicy
from reasonrl.rollout.fleet import FleetError, RolloutFleet
from reasonrl.runtime import LocalGroup, ProcessGroup, WorkerDied, WorkerTimeout
from reasonrl.runtime.group import ThreadGroup
from reasonrl.types import SamplingParams, WeightsUpdate
from tests.worker_fixtures import ScriptedRollouts

PARAMS = SamplingParams(max_new_tokens=12)
CONCURRENT = ("offer_weights", "stage_weights", "poll_stream", "stop_stream")


def fleet(group, events=None, restarts=2, *, retries=3, timeout_s=30.0, quarantine=0.0, clock=lambda: 0) -> RolloutFleet:
    emit = (lambda kind, **fields: events.append((kind, fields))) if events is not None else (lambda kind, **f: None)
    return RolloutFleet(group, pad_id=0, streams=True, episodic=False, timeout_s=timeout_s,
                        restarts=RestartPolicy(budget=restarts, backoff_s=0.0), group_retries=retries,
                        failures=(WorkerDied, WorkerTimeout), quarantine_ratio=quarantine, clock=clock, emit=emit)


def processes(*args_per_worker) -> ProcessGroup:
    return ProcessGroup(ScriptedRollouts, list(args_per_worker), name="rollout", timeout_s=30, concurrent=CONCURRENT)


def joined(events, count: int, timeout_s: float = 60.0) -> list[dict]:
    """The fields of the first ``count`` rollout_worker_joined events, waiting for them."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = [f for k, f in list(events) if k == "rollout_worker_joined"]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {count} rollout_worker_joined events within {timeout_s} s: {events}")


def threads(count: int, step_s: float = 0.0) -> ThreadGroup:
    return ThreadGroup(ScriptedRollouts, [(step_s,)] * count, name="rollout", timeout_s=30, concurrent=CONCURRENT)


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("response_ids", "response_mask", "group_ids", "versions"))


def test_groups_go_to_the_worker_with_the_fewest_outstanding_tokens():
    f = fleet(LocalGroup([ScriptedRollouts(), ScriptedRollouts()]))
    assert f.assign([[1, 2]] * 5, 4, 10) == [0, 1, 0, 1, 0]
    # a long prompt weighs like several short ones: 4 * (30 + 10) = 160 vs 4 * (2 + 10) = 48 each,
    # so worker 1 takes short ones until its load passes 160: 48, 96, 144, 192; then worker 0
    assert f.assign([[0] * 30] + [[1, 2]] * 5, 4, 10) == [0, 1, 1, 1, 1, 0]


def test_rows_come_back_in_prompt_order_whatever_the_number_of_workers():
    prompts, seeds = [[1, 2]] * 7, [11, 5, 23, 8, 42, 17, 3]
    one = fleet(LocalGroup([ScriptedRollouts()])).generate(prompts, 3, PARAMS, seeds)
    for count in (2, 3):
        workers = [ScriptedRollouts() for _ in range(count)]
        many = fleet(LocalGroup(workers)).generate(prompts, 3, PARAMS, seeds)
        assert same(one, many)
        assert sorted(s for w in workers for call in w.calls for s in call) == sorted(seeds)
        assert all(w.calls for w in workers)  # every worker served some groups


def _stream(f: RolloutFleet, seeds, stop_after: int | None):
    seen = []

    def on_done(groups, rows):
        seen.append((groups, rows.response_ids.clone(), rows.group_ids.tolist()))
        return stop_after is not None and sum(len(g) for g, _, _ in seen) >= stop_after

    result = f.generate_stream([[1, 2]] * len(seeds), 2, PARAMS, seeds, on_done)
    return seen, result


def test_streamed_groups_reach_the_scheduler_in_one_workers_order_and_stop_alike():
    seeds = list(range(100, 116))
    for stop_after in (None, 5):
        reference, ref_result = _stream(fleet(threads(1)), seeds, stop_after)
        for count, step_s in ((2, 0.0), (3, 0.002)):
            group = threads(count, step_s)
            try:
                seen, result = _stream(fleet(group), seeds, stop_after)
            finally:
                group.close()
            assert [g for g, _, _ in seen] == [g for g, _, _ in reference]
            assert all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(seen, reference))
            assert all(ids == [g for g in groups for _ in range(2)] for groups, _, ids in seen)
            assert (result.aborted, result.aborted_lengths, result.stopped) == (
                ref_result.aborted, ref_result.aborted_lengths, ref_result.stopped)
    assert ref_result.stopped and ref_result.aborted  # the stop case did stop early


def test_a_dead_worker_is_replaced_and_its_groups_are_generated_again(tmp_path):
    seeds = [31, 32, 33, 34, 35, 36]
    reference = fleet(LocalGroup([ScriptedRollouts()])).generate([[1, 2]] * 6, 2, PARAMS, seeds)
    events = []
    group = processes(*[(0.0, 34, str(tmp_path / "died"))] * 2)
    try:
        f = fleet(group, events)
        f.load_weights(WeightsUpdate(3, {}))
        pids = group.pids
        batch = f.generate([[1, 2]] * 6, 2, PARAMS, seeds)  # worker 1 had 34 (and 32, 36): worker 0 does them
        assert torch.equal(batch.response_ids, reference.response_ids) and bool((batch.versions[batch.response_mask > 0] == 3).all())
        kind, fields = events[0]
        assert kind == "rollout_worker_died" and fields["worker"] == 1 and fields["pid"] == pids[1]
        assert fields["groups_moved"] == 3 and fields["seconds_lost"] >= 0 and fields["workers"] == 2
        [join] = joined(events, 1)  # the replacement starts beside the generation, with the current weights
        assert join["worker"] == 1 and join["replaced"] == pids[1] and join["pid"] == group.pids[1] != pids[1]
        assert join["version"] == 3 and f.live() == [0, 1]
        seen, _ = _stream(f, [40, 41, 34, 43], None)  # the replacement streams too
        assert sorted(g for groups, _, _ in seen for g in groups) == [0, 1, 2, 3]
        assert f.take_stats()["rollout/worker1/groups"] > 0
    finally:
        f.close()


def test_a_dead_worker_mid_stream_loses_no_group(tmp_path):
    seeds = list(range(60, 72))
    reference, _ = _stream(fleet(threads(1)), seeds, None)
    events = []
    f = fleet(processes(*[(0.001, 63, str(tmp_path / "died"))] * 2), events)
    try:
        seen, result = _stream(f, seeds, None)
    finally:
        f.close()
    assert [g for g, _, _ in seen] == [g for g, _, _ in reference] and not result.aborted and not result.failed
    assert [k for k, _ in events][0] == "rollout_worker_died"


@pytest.mark.serial  # timeouts and slowdowns read wall time
def test_a_hung_worker_loses_its_groups_to_the_others_within_its_timeout():
    seeds = [50, 51, 52, 53]
    reference = fleet(LocalGroup([ScriptedRollouts()])).generate([[1, 2]] * 4, 2, PARAMS, seeds)
    events = []
    f = fleet(processes((0.0,), (0.0, None, "", 51)), events, timeout_s=1.5)  # worker 1 sleeps on seed 51
    try:
        batch = f.generate([[1, 2]] * 4, 2, PARAMS, seeds)  # the hung worker is cut at its timeout
        assert torch.equal(batch.response_ids, reference.response_ids)
        kind, fields = events[0]
        assert kind == "rollout_worker_hung" and fields["worker"] == 1 and fields["groups_moved"] == 2
        assert "runtime.roles.rollout.timeout_s" in fields["error"]
        joined(events, 1)
    finally:
        f.close()


def test_a_group_that_kills_every_worker_fails_whole_after_its_retries_and_the_rest_are_trained():
    events = []
    f = fleet(processes(*[(0.0, 52)] * 3), events, retries=1)  # seed 52 kills any worker, every time
    try:
        batch = f.generate([[1, 2]] * 4, 2, PARAMS, [50, 51, 52, 53])
        assert batch.group_ids.tolist() == [0, 0, 1, 1, 3, 3]  # group 2 left out whole, never in part
        kinds = [k for k, _ in events]
        assert kinds.count("rollout_worker_died") == 2  # the first dispatch and its one retry
        [failed] = [fields for k, fields in events if k == "rollout_groups_failed"]
        assert failed["groups"] == 1 and failed["retries"] == 1
        with pytest.raises(FleetError, match=r"every one of the 1 groups of the batch failed on 2 dispatches"):
            f.generate([[1, 2]], 2, PARAMS, [52])
    finally:
        f.close()


@pytest.mark.serial  # timeouts and slowdowns read wall time
def test_a_worker_that_raises_twice_in_a_row_is_quarantined_but_an_error_on_every_worker_ends_the_call():
    events = []
    f = fleet(processes((0.0,), (0.0, None, "", None, -1)), events)  # worker 1 raises on every call
    try:
        seeds = [60, 61, 62, 63]
        reference = fleet(LocalGroup([ScriptedRollouts()])).generate([[1, 2]] * 4, 2, PARAMS, seeds)
        for _ in range(2):
            assert torch.equal(f.generate([[1, 2]] * 4, 2, PARAMS, seeds).response_ids, reference.response_ids)
        [quarantined] = [fields for k, fields in events if k == "rollout_worker_quarantined"]
        assert quarantined["worker"] == 1 and "2 calls in a row raised" in quarantined["reason"]
        assert "injected error" in quarantined["reason"]
    finally:
        f.close()
    f = fleet(processes(*[(0.0, None, "", None, 71)] * 2))  # seed 71 raises wherever it goes
    try:
        with pytest.raises(RuntimeError, match=r"injected error on seeds \[71"):
            f.generate([[1, 2]] * 2, 2, PARAMS, [70, 71])
    finally:
        f.close()


@pytest.mark.serial  # timeouts and slowdowns read wall time
def test_a_slow_worker_is_quarantined_after_its_steps_and_replaced():
    events, step = [], [0]
    f = fleet(processes((0.0,), (0.05,)), events, quarantine=3.0, clock=lambda: step[0])  # 0.6 s a call on 1
    f.quarantine_steps = 2
    try:
        for step[0] in range(1, 6):
            f.generate([[1, 2]] * 4, 2, PARAMS, [80, 81, 82, 83])
            if any(k == "rollout_worker_quarantined" for k, _ in events):
                break
        [quarantined] = [fields for k, fields in events if k == "rollout_worker_quarantined"]
        assert quarantined["worker"] == 1 and quarantined["steps"] == 2 and quarantined["ratio"] > 3
        joined(events, 1)
    finally:
        f.close()


def test_weights_reach_every_worker_and_a_fleet_with_no_worker_left_fails(tmp_path):
    workers = [ScriptedRollouts(), ScriptedRollouts()]
    f = fleet(LocalGroup(workers))
    f.offer_weights(WeightsUpdate(7, {}))
    assert [w.version for w in workers] == [7, 7]
    events = []
    f = fleet(processes((0.0, 5)), events, restarts=0)
    try:
        with pytest.raises(FleetError, match=r"no rollout worker left: each of the 1 failed 0 restarts in a row "
                                             r"\(resilience.rollout_restarts\)"):
            f.generate([[1]], 2, PARAMS, [5])
        assert [k for k, _ in events] == ["rollout_worker_died", "rollout_worker_gone"]
    finally:
        f.close()


def test_a_fleet_grows_with_the_current_weights_and_shrinks_after_its_running_groups():
    events = []
    group = processes((0.0,))
    f = RolloutFleet(group, pad_id=0, streams=True, episodic=False, timeout_s=30, restarts=RestartPolicy(),
                     group_retries=3, failures=(WorkerDied, WorkerTimeout),
                     emit=lambda kind, **fields: events.append((kind, fields)), new_worker=lambda i: (0.001,))
    try:
        seeds = list(range(90, 96))
        reference = fleet(LocalGroup([ScriptedRollouts()])).generate([[1, 2]] * 6, 2, PARAMS, seeds)
        f.load_weights(WeightsUpdate(4, {}))
        f.resize(3)
        with pytest.raises(FleetError, match="did not reach 3 serving workers within 0.01 s"):
            f.wait_resized(0.01)  # a process takes longer than that to start
        f.wait_resized(30)
        assert f.target == 3 and f.live() == [0, 1, 2]
        joins = joined(events, 2, timeout_s=1)  # written in the instant each went live
        assert [(j["worker"], j["reason"], j["version"]) for j in joins] == [(1, "scale", 4), (2, "scale", 4)]
        assert f.live() == [0, 1, 2] and group.size == 3 and len(set(group.pids)) == 3
        batch = f.generate([[1, 2]] * 6, 2, PARAMS, seeds)
        assert torch.equal(batch.response_ids, reference.response_ids)
        assert bool((batch.versions[batch.response_mask > 0] == 4).all())  # the joiners sampled with version 4
        stats = f.take_stats()
        assert all(stats[f"rollout/worker{i}/groups"] > 0 for i in range(3))
        leaving = group.pids[1:]
        f.resize(1)
        assert f.live() == [0]  # at once: the others take no new group
        f.wait_resized(30)
        assert group.size == 1 and f.size == 1 and f.target == 1
        assert sorted((fields["worker"], fields["pid"]) for k, fields in events if k == "rollout_worker_left") == [
            (1, leaving[0]), (2, leaving[1])]
        assert torch.equal(f.generate([[1, 2]] * 6, 2, PARAMS, seeds).response_ids, reference.response_ids)
        with pytest.raises(ValueError, match="expected an integer >= 1"):
            f.resize(0)
    finally:
        f.close()
