"""The rollout fleet: per-group dispatch, rows back in prompt order, streaming with early stop
across workers in one worker's order, failover of a dead worker, weights to every worker."""

from __future__ import annotations

import torch

from reasonrl.rollout.fleet import RolloutFleet
from reasonrl.runtime import LocalGroup, ProcessGroup, WorkerDied, WorkerTimeout
from reasonrl.runtime.group import ThreadGroup
from reasonrl.types import SamplingParams, WeightsUpdate
from tests.worker_fixtures import ScriptedRollouts

PARAMS = SamplingParams(max_new_tokens=12)
CONCURRENT = ("offer_weights", "stage_weights", "poll_stream", "stop_stream")


def fleet(group, events=None, restarts=2) -> RolloutFleet:
    emit = (lambda kind, **fields: events.append((kind, fields))) if events is not None else (lambda kind, **f: None)
    return RolloutFleet(group, pad_id=0, streams=True, episodic=False, timeout_s=30, max_restarts=restarts,
                        failures=(WorkerDied, WorkerTimeout), emit=emit)


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
    group = ProcessGroup(ScriptedRollouts, [(0.0, 34, str(tmp_path / "died"))] * 2, name="rollout", timeout_s=30,
                         concurrent=CONCURRENT)
    try:
        f = fleet(group, events)
        f.load_weights(WeightsUpdate(3, {}))
        pids = group.pids
        batch = f.generate([[1, 2]] * 6, 2, PARAMS, seeds)
        assert torch.equal(batch.response_ids, reference.response_ids) and bool((batch.versions[batch.response_mask > 0] == 3).all())
        [(kind, fields)] = events
        assert kind == "rollout_worker_died" and fields["worker"] == 1 and fields["pid"] == pids[1]
        assert fields["groups_moved"] == 3 and fields["new_pid"] == group.pids[1] != pids[1]
        seen, _ = _stream(f, [40, 41, 34, 43], None)  # the replacement streams too
        assert sorted(g for groups, _, _ in seen for g in groups) == [0, 1, 2, 3]
    finally:
        group.close()


def test_a_dead_worker_mid_stream_loses_no_group(tmp_path):
    seeds = list(range(60, 72))
    reference, _ = _stream(fleet(threads(1)), seeds, None)
    events = []
    group = ProcessGroup(ScriptedRollouts, [(0.001, 63, str(tmp_path / "died"))] * 2, name="rollout", timeout_s=30,
                         concurrent=CONCURRENT)
    try:
        seen, result = _stream(fleet(group, events), seeds, None)
    finally:
        group.close()
    assert [g for g, _, _ in seen] == [g for g, _, _ in reference] and not result.aborted
    assert [k for k, _ in events] == ["rollout_worker_died"]


def test_weights_reach_every_worker_and_a_fleet_out_of_restarts_fails(tmp_path):
    workers = [ScriptedRollouts(), ScriptedRollouts()]
    f = fleet(LocalGroup(workers))
    f.offer_weights(WeightsUpdate(7, {}))
    assert [w.version for w in workers] == [7, 7]
    group = ProcessGroup(ScriptedRollouts, [(0.0, 5, str(tmp_path / "died"))], name="rollout", timeout_s=30,
                         concurrent=CONCURRENT)
    try:
        import pytest

        from reasonrl.rollout.fleet import FleetError

        with pytest.raises(FleetError, match=r"gave up after 0 replacements \(resilience.rollout_restarts=0\)"):
            fleet(group, restarts=0).generate([[1]], 2, PARAMS, [5])
    finally:
        group.close()
