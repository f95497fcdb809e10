"""GroupQueue: staleness measured per group, stale and off-lineage groups dropped and counted,
metrics and prompt records of the collects it was given; the AsyncSource's admission rule."""

from __future__ import annotations

import math
from concurrent.futures import Future

import pytest
import torch

from reasonrl.rollout.source import AsyncSource, Collected, GroupQueue
from reasonrl.types import Prompt, RolloutBatch, ScoredBatch, WeightsUpdate

N, PAD = 2, 0


def collected(versions: list[int], first_draw: int, tokens: int = 3, started: float = 10.0) -> Collected:
    """Groups of N rows; group g's tokens sampled by ``versions[g]`` (its rows' lengths 1..tokens)."""
    G = len(versions)
    B, T = G * N, tokens
    lengths = torch.tensor([1 + (i % tokens) for i in range(B)])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    rollout = RolloutBatch(
        prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
        response_ids=torch.full((B, T), 5) * mask.long(), response_mask=mask, logprobs=-mask,
        eos=torch.ones(B, dtype=torch.bool), truncated=torch.zeros(B, dtype=torch.bool),
        group_ids=torch.arange(B) // N, versions=torch.tensor(versions).repeat_interleave(N)[:, None] * mask.long(),
    )
    prompts = [Prompt(f"p{first_draw + i // N}", "q", "1") for i in range(B)]
    batch = ScoredBatch(rollout, prompts, ["t"] * B, torch.ones(B), torch.ones(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool))
    draws = [[first_draw + g, 100 + g, "kept"] for g in range(G)] + [[first_draw + G, 7, "all_wrong"]]
    stats = {k: 1.0 for k in ("batch/num_gen_batches", "batch/dropped_all_correct", "batch/dropped_all_wrong", "batch/surplus_groups",
                              "batch/aborted_samples", "batch/aborted_tokens", "batch/wasted_samples")}
    stats.update({"batch/kept_groups": float(G), "batch/generated_samples": float(B + N),
                  "batch/generated_tokens": float(lengths.sum()) + 4.0, "batch/samples_per_kept_group": 0.0,
                  "batch/tokens_per_kept_group": 0.0})
    return Collected(batch, [first_draw + g for g in range(G)], draws, stats, ["sample 0: boom"], started, started + 2.0,
                     1.5, 0.5, 0.25, {"draws": first_draw + G + 1})


def test_take_measures_staleness_and_drops_stale_and_off_lineage_groups():
    queue = GroupQueue(N, PAD, max_staleness=1)
    queue.put(collected([3, 4, 5, 6], first_draw=0))  # at version 5: staleness 2, 1, 0, -1
    queue.put(collected([5, 5], first_draw=5))
    batch = queue.take(3, version=5)
    assert batch.record["trained"] == [1, 2, 5]  # draw 0 too old (2 > 1), draw 3 from a later version (a rollback)
    assert batch.record["stale"] == [0, 3]
    assert batch.record["drawn"] == [[0, 100, "kept"], [1, 101, "kept"], [2, 102, "kept"], [3, 103, "kept"], [4, 7, "all_wrong"],
                                     [5, 100, "kept"], [6, 101, "kept"], [7, 7, "all_wrong"]]
    m = batch.metrics
    assert (m["staleness/mean"], m["staleness/max"], m["staleness/p99"]) == (pytest.approx(1 / 3), 1.0, 1.0)
    assert m["staleness/dropped_groups"] == 2 and m["rollout/queue_length"] == 1  # draw 6 still waits
    # two collects: counts summed, ratios recomputed: started = generated + aborted samples per kept group
    assert m["batch/kept_groups"] == 6 and m["batch/num_gen_batches"] == 2
    assert m["batch/samples_per_kept_group"] == pytest.approx((10 + 6 + 1 + 1) / 6)  # (generated + aborted) / kept
    # wasted: per collect, generated + aborted tokens - kept tokens (19 + 1 - 15, 11 + 1 - 7), plus the
    # stale groups' tokens (draw 0: rows of length 1 and 2; draw 3: 1 and 2)
    assert m["rollout/wasted_tokens"] == 5 + 5 + 3 + 3
    assert m["timing_s/reward"] == 1.0 and m["timing_s/rollout_idle"] == 0.5 and m["timing_s/group_in_flight"] == 2.0
    assert batch.errors == ["sample 0: boom", "sample 0: boom"]
    # the batch: 3 groups of 2 rows, group ids renumbered, versions kept per token
    r = batch.scored.rollout
    assert r.group_ids.tolist() == [0, 0, 1, 1, 2, 2] and r.oldest_versions().tolist() == [4, 4, 5, 5, 5, 5]
    assert [p.id for p in batch.scored.prompts[::N]] == ["p1", "p2", "p5"]


def test_take_waits_for_enough_fresh_groups_and_a_step_without_a_new_collect_reports_zero_counts():
    queue = GroupQueue(N, PAD, max_staleness=0)
    queue.put(collected([2, 2, 1], first_draw=0))
    assert queue.take(3, version=2) is None  # two fresh, one stale: not enough
    assert len(queue) == 2
    queue.put(collected([2, 2], first_draw=4))
    first = queue.take(2, version=2)
    assert first.record["trained"] == [0, 1] and first.record["stale"] == [2]
    second = queue.take(2, version=2)  # no collect since the last take
    assert second.record == {"drawn": [], "trained": [4, 5], "stale": []}
    assert second.metrics["batch/kept_groups"] == 0 and math.isinf(second.metrics["batch/samples_per_kept_group"])


def test_queue_state_round_trips_through_a_checkpoint():
    queue = GroupQueue(N, PAD, max_staleness=1)
    queue.put(collected([1, 2], first_draw=0))
    state = queue.state_dict()
    restored = GroupQueue(N, PAD, max_staleness=1)
    restored.load_state_dict(state)
    a, b = queue.take(2, version=2), restored.take(2, version=2)
    assert a.record == b.record and a.metrics.keys() == b.metrics.keys()
    assert all(torch.equal(getattr(a.scored.rollout, k), getattr(b.scored.rollout, k)) for k in ("response_ids", "versions", "logprobs"))
    assert a.scored.prompts == b.scored.prompts and a.scored.texts == b.scored.texts


class _Rollout:
    """A stand-in rollout process: records the calls it is sent, answers collects on demand."""

    pids = [1234]

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.futures: list[Future] = []

    def submit(self, method: str, *args):
        future = Future()
        self.calls.append((method, (args[0] if isinstance(args[0], int) else args[0].version) if args else -1))
        if method == "collect":
            self.futures.append(future)
        else:
            future.set_result(None)
        return [future]

    def call(self, method: str, *args):
        if method == "pids":
            return [self.pids]
        return [f.result() for f in self.submit(method, *args)]

    def kill(self): ...

    def close(self, timeout_s: float = 0): ...


@pytest.mark.parametrize("lockstep", [False, True])
def test_admission_keeps_at_most_max_staleness_batches_ahead(lockstep):
    rollout = _Rollout()
    source = AsyncSource(lambda: rollout, WeightsUpdate(0, {}), n=N, pad_id=PAD, want=2, max_staleness=2, lockstep=lockstep,
                         timeout_s=5, emit=lambda *a, **k: None)
    source.publish(WeightsUpdate(0, {}))
    assert [c for c in rollout.calls if c[0] == "collect"] == [("collect", -1)] * 3  # batches 0..2 at version 0
    for step, future in enumerate(rollout.futures[:1]):
        future.set_result(collected([0, 0], first_draw=0))
    batch = source.next_batch(0)
    assert batch.metrics["staleness/max"] == 0 and len(rollout.futures) == 3  # training: nothing new admitted
    source.publish(WeightsUpdate(1, {}))
    assert len(rollout.futures) == 4  # one more, with version 1
    sent = [c for c in rollout.calls if c[0] in ("load_weights", "offer_weights", "stage_weights", "load_staged")]
    # lockstep: the weights cross at once (staged), and their version is loaded in line
    # before the collect; async: offered at once
    assert sent[-2:] == ([("stage_weights", 1), ("load_staged", 1)] if lockstep else [("load_weights", 0), ("offer_weights", 1)])


class _Recorder(_Rollout):
    """The stand-in rollout process, recording each collect's arguments and the state it is
    restored from."""

    def __init__(self) -> None:
        super().__init__()
        self.collects: list[tuple] = []
        self.restored: list[dict] = []

    def submit(self, method: str, *args):
        if method in ("collect", "load_state_dict"):
            (self.collects if method == "collect" else self.restored).append(args)
            args = ()
        return super().submit(method, *args)


def test_held_out_accuracies_go_with_the_collect_submitted_after_them_also_after_a_resume():
    def source_on(rollout):
        return AsyncSource(lambda: rollout, WeightsUpdate(0, {}), n=N, pad_id=PAD, want=2, max_staleness=0,
                           lockstep=True, timeout_s=5, emit=lambda *a, **k: None)

    rollout = _Recorder()
    source = source_on(rollout)
    source.publish(WeightsUpdate(0, {}))  # collect 1 submitted
    source.observe_held_out({"a": 0.5})  # the step-0 validation: after 1 collect
    source.observe_held_out({})  # a validation without per-source accuracies sends nothing
    rollout.futures[0].set_result(collected([0, 0], first_draw=0))
    source.next_batch(0)
    source.publish(WeightsUpdate(1, {}))  # collect 2 takes it in
    due = [{"after": 1, "accuracy": {"a": 0.5}}]
    assert rollout.collects == [(), (due,)]
    state = source.state_dict()  # collect 2 not delivered yet: the accuracies are kept
    assert state["delivered"] == 1 and state["held_out"] == due
    resumed = _Recorder()
    again = source_on(resumed)
    again.load_state_dict(state)
    again.publish(WeightsUpdate(1, {}))  # the resumed run's collect 2
    assert resumed.restored == [({"draws": 3},)] and resumed.collects == [(due,)]
    resumed.futures[0].set_result(collected([1, 1], first_draw=2))
    again.next_batch(1)
    assert again.state_dict()["held_out"] == []  # collect 2 delivered: taken in


def test_data_metrics_of_a_step_sum_the_counts_of_its_collects_and_keep_the_newest_levels():
    from dataclasses import replace

    def with_data(c, retired, weight):
        return replace(c, data={"data/curriculum/retired": retired, "data/mix/a": weight})

    queue = GroupQueue(N, PAD, max_staleness=1)
    queue.put(with_data(collected([1], first_draw=0), 2.0, 0.25))
    queue.put(with_data(collected([1, 1], first_draw=2), 3.0, 0.75))
    first = queue.take(2, version=1)
    assert (first.metrics["data/curriculum/retired"], first.metrics["data/mix/a"]) == (5.0, 0.75)
    restored = GroupQueue(N, PAD, max_staleness=1)
    restored.load_state_dict(queue.state_dict())
    second = restored.take(1, version=1)  # no collect since: the levels stay, no prompt retired
    assert (second.metrics["data/curriculum/retired"], second.metrics["data/mix/a"]) == (0.0, 0.75)


def test_a_source_launched_ahead_still_starts_from_the_state_a_resume_restores():
    """A standby trainer launches its rollout side before its go; the resume that follows
    restores the producer's state, which the first publish hands to that same launch."""
    launched: list[_Recorder] = []

    def launch():
        launched.append(_Recorder())
        return launched[-1]

    source = AsyncSource(launch, WeightsUpdate(0, {}), n=N, pad_id=PAD, want=2, max_staleness=0, lockstep=True,
                         timeout_s=5, emit=lambda *a, **k: None)
    source.prepare()
    assert len(launched) == 1 and launched[0].calls == []
    source.load_state_dict({"producer": {"draws": 3}, "queue": GroupQueue(N, PAD, 0).state_dict(), "delivered": 1,
                            "held_out": []})
    source.publish(WeightsUpdate(1, {}))
    assert len(launched) == 1 and launched[0].restored == [({"draws": 3},)]
    assert [c[0] for c in launched[0].calls][:2] == ["load_state_dict", "load_weights"]
