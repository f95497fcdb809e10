"""Delta weight sync: hand-built versions encode to the changes expected (sparse, whole-tensor
fallback, unchanged), apply back bit for bit, and a wrong base or a bad checksum is refused;
the sender picks delta or whole per worker, and a fleet sends a replaced or an added worker
the whole version, then deltas again."""

from __future__ import annotations

import pickle

import pytest
import torch

from reasonrl.restarts import RestartPolicy
from reasonrl.rollout.fleet import RolloutFleet
from reasonrl.rollout.weight_sync import (BLOCK, DELTA, SAME, WHOLE, WeightSender, WeightSyncError, apply_delta, checksum,
                                          encode, snapshot, sync_dtype, verify, weights_bytes)
from reasonrl.runtime import ProcessGroup, WorkerDied, WorkerTimeout
from reasonrl.types import SamplingParams, WeightsDelta, WeightsUpdate
from tests.unit.test_fleet import joined
from tests.worker_fixtures import DeltaRollouts

BF16 = torch.bfloat16


def version(v: int, tensors: dict[str, torch.Tensor]) -> WeightsUpdate:
    return WeightsUpdate(v, tensors, checksum(tensors))


def bump(t: torch.Tensor, at: list[int]) -> torch.Tensor:
    """``t`` with the elements at the flat positions ``at`` moved one bf16 step up (bit pattern + 1)."""
    out = t.clone()
    bits = out.reshape(-1).view(torch.int16)
    bits[at] += 1
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.int16), b.reshape(-1).view(torch.int16))


def base_and_next():
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3 * BLOCK + 5, generator=g).to(BF16)  # 4 blocks, the last of 5 elements
    small = torch.randn(2, 4, generator=g).to(BF16)
    norm = torch.ones(6, dtype=BF16)
    base = version(4, {"big": big, "small": small, "norm": norm})
    at = [0, 7, BLOCK - 1, BLOCK, 3 * BLOCK - 1, 3 * BLOCK + 4]
    nxt = version(5, {"big": bump(big, at), "small": bump(small, [1, 2, 6]), "norm": norm.clone()})
    return base, nxt, at


def test_a_sparse_change_ships_block_counts_offsets_and_values():
    base, nxt, at = base_and_next()
    d = encode(base, nxt)
    assert (d.version, d.base, d.checksum, d.base_checksum) == (5, 4, nxt.checksum, base.checksum)
    # small: 8 elements, 3 changed: 4 * 1 block + 4 * 3 = 16 bytes is not under 2 * 8 = 16: whole
    assert d.layout == [("big", DELTA, 6), ("small", WHOLE, 8), ("norm", SAME, 0)]
    assert d.counts.tolist() == [3, 1, 1, 1]  # positions 0, 7, 65535 | 65536 | 196607 | 196612
    assert (d.offsets.long() & 0xFFFF).tolist() == [0, 7, 65535, 0, 65535, 4]
    big = nxt.tensors["big"].view(torch.int16)
    assert d.values[:6].tolist() == big[at].tolist()
    assert same_bits(d.values[6:].view(BF16).view(2, 4), nxt.tensors["small"])
    assert weights_bytes(d) == 4 * 4 + 2 * 6 + 2 * (6 + 8)  # against 2 * (196613 + 8 + 6) whole
    made = apply_delta(base, d)
    assert made.version == 5 and made.checksum == nxt.checksum
    assert all(same_bits(made.tensors[k], nxt.tensors[k]) for k in nxt.tensors)
    assert made.tensors["norm"] is base.tensors["norm"]  # unchanged: shared
    assert not same_bits(base.tensors["big"], nxt.tensors["big"])  # the held version is left as it was


def test_two_changes_of_eight_ship_as_a_delta_and_three_whole():
    t = torch.arange(8, dtype=torch.float32).to(BF16)
    base = version(0, {"w": t})
    two = encode(base, version(1, {"w": bump(t, [3, 5])}))
    assert two.layout == [("w", DELTA, 2)] and weights_bytes(two) == 4 + 4 * 2  # 12 < 16
    three = encode(base, version(1, {"w": bump(t, [3, 5, 6])}))
    assert three.layout == [("w", WHOLE, 8)] and weights_bytes(three) == 16


def test_a_dense_change_ships_every_tensor_whole():
    g = torch.Generator().manual_seed(1)
    base = version(0, {"a": torch.randn(BLOCK + 3, generator=g).to(BF16), "b": torch.randn(5, 7, generator=g).to(BF16)})
    nxt = version(1, {k: (t.float() * 1.5 + 0.25).to(BF16) for k, t in base.tensors.items()})
    d = encode(base, nxt)
    assert [kind for _, kind, _ in d.layout] == [WHOLE, WHOLE] and d.counts.numel() == d.offsets.numel() == 0
    assert weights_bytes(d) == weights_bytes(nxt)
    assert all(same_bits(apply_delta(base, d).tensors[k], nxt.tensors[k]) for k in nxt.tensors)


def test_a_delta_against_another_version_is_refused():
    base, nxt, _ = base_and_next()
    d = encode(base, nxt)
    with pytest.raises(WeightSyncError, match=r"a delta against version 4 .* this worker holds no version"):
        apply_delta(None, d)
    with pytest.raises(WeightSyncError, match=r"this worker holds version 5"):
        apply_delta(nxt, d)
    # the same version number with other tensors (a rollback): the checksum tells them apart
    other = version(4, {k: bump(t, [1]) for k, t in base.tensors.items()})
    with pytest.raises(WeightSyncError, match=r"against version 4 \(checksum"):
        apply_delta(other, d)


def test_a_result_that_is_not_the_version_is_refused():
    base, nxt, _ = base_and_next()
    d = encode(base, nxt)
    d.values = d.values.clone()
    d.values[0] += 1  # one element arrives wrong
    with pytest.raises(WeightSyncError, match=r"gives checksum \d+, expected \d+"):
        apply_delta(base, d)
    bad = WeightsUpdate(5, dict(nxt.tensors), nxt.checksum)
    bad.tensors["small"] = bump(bad.tensors["small"], [0])
    with pytest.raises(WeightSyncError, match=r"weights version 5: checksum \d+, expected"):
        verify(bad)
    assert verify(nxt) is nxt


def test_a_delta_pickles_as_one_object_with_three_buffers_and_applies_after():
    base, nxt, _ = base_and_next()
    d = encode(base, nxt)
    buffers = []
    data = pickle.dumps(d, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 3 and len(data) < 1000  # the arrays travel out of band
    back = pickle.loads(data, buffers=[bytearray(b.raw()) for b in buffers])
    assert isinstance(back, WeightsDelta) and back.layout == d.layout
    assert apply_delta(base, back).checksum == nxt.checksum
    full = pickle.loads(pickle.dumps(nxt, protocol=5))
    assert full.checksum == nxt.checksum and verify(full)


def test_a_lora_version_keeps_its_kind_through_the_snapshot_a_pickle_and_a_delta():
    adapters = {"q.lora_A.default.weight": torch.randn(4, 8), "q.lora_B.default.weight": torch.zeros(8, 4)}
    v0 = snapshot(WeightsUpdate(0, adapters, kind="adapters"), BF16)
    assert v0.kind == "adapters"
    assert pickle.loads(pickle.dumps(v0, protocol=5)).kind == "adapters"
    moved = {k: t + 1 for k, t in adapters.items()}
    v1 = snapshot(WeightsUpdate(1, moved, kind="adapters"), BF16)
    assert apply_delta(v0, encode(v0, v1)).kind == "adapters"
    assert WeightsUpdate(0, {}).kind == "full"


def test_a_fleet_reports_whether_a_lora_version_was_the_adapters_alone(tmp_path):
    group = ProcessGroup(DeltaRollouts, [(0.0, -1, str(tmp_path / "died"))], name="rollout", timeout_s=30,
                         concurrent=("offer_weights", "stage_weights", "poll_stream", "stop_stream"))
    try:
        f = RolloutFleet(group, pad_id=0, streams=True, episodic=False, timeout_s=30,
                         restarts=RestartPolicy(budget=0, backoff_s=0.0), group_retries=1,
                         failures=(WorkerDied, WorkerTimeout), sender=WeightSender(BF16))
        tensors = {"q.lora_A.default.weight": torch.ones(4, 8), "q.lora_B.default.weight": torch.ones(8, 4)}
        assert f.load_weights(WeightsUpdate(0, tensors, kind="adapters")) == {
            "weight_sync/bytes": 2.0 * 64, "weight_sync/delta_frac": 1.0, "weight_sync/adapter_only": 1.0}
        # the kind is reported as given (a run's versions are all of one kind)
        assert f.load_weights(WeightsUpdate(1, tensors, kind="merged"))["weight_sync/adapter_only"] == 0.0
        assert "weight_sync/adapter_only" not in f.load_weights(WeightsUpdate(2, tensors))
    finally:
        f.close()


def test_a_snapshot_is_an_owned_round_to_nearest_copy():
    live = torch.tensor([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, -2.0**-130])
    snap = snapshot(WeightsUpdate(3, {"w": live}), BF16)
    # 1 + 2^-8 is half way between bf16 neighbours 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-9 rounds up
    assert snap.tensors["w"].tolist() == [1.0, 1.0, 1.0 + 2.0**-7, -2.0**-130]
    live.add_(1.0)
    assert snap.tensors["w"][0].item() == 1.0 and snap.checksum == checksum(snap.tensors)
    bf = torch.ones(3, dtype=BF16)
    assert snapshot(WeightsUpdate(0, {"b": bf}), BF16).tensors["b"].data_ptr() != bf.data_ptr()


def test_the_sync_dtype_follows_model_dtype_and_precision():
    from reasonrl.config import load

    assert sync_dtype(load(None, [])) is None
    assert sync_dtype(load(None, ["model.dtype=bfloat16"])) is BF16
    assert sync_dtype(load(None, ["train.precision=bf16-mixed"])) is BF16


def test_the_sender_sends_a_delta_only_to_a_worker_holding_the_version_before():
    sender = WeightSender(BF16)
    v0 = sender.version(WeightsUpdate(0, {"w": torch.zeros(100)}))
    assert sender.message((0, 11), v0) is v0  # nothing to diff against yet
    sender.held((0, 11), v0)
    v1 = sender.version(WeightsUpdate(1, {"w": torch.zeros(100).index_fill_(0, torch.tensor([4]), 1.0)}))
    d = sender.message((0, 11), v1)
    assert isinstance(d, WeightsDelta) and (d.base, d.version) == (0, 1) and d.layout == [("w", DELTA, 1)]
    assert sender.message((0, 12), v1) is v1  # the same index in another process: a new worker
    assert sender.message((1, 13), v1) is v1  # never held anything
    assert sender.message((0, 11), v0) is v0  # an older version is sent whole
    sender.keep([(1, 13)])
    assert sender.message((0, 11), v1) is v1  # forgotten
    assert WeightSender(None).version(v1) is v1  # fp32: the trainer's tensors as they are


def test_a_replaced_or_added_worker_gets_the_whole_version_then_deltas(tmp_path):
    params = SamplingParams(max_new_tokens=4)
    group = ProcessGroup(DeltaRollouts, [(0.0, 34, str(tmp_path / "died"))] * 2, name="rollout", timeout_s=30,
                         concurrent=("offer_weights", "stage_weights", "poll_stream", "stop_stream"))
    try:
        events = []
        f = RolloutFleet(group, pad_id=0, streams=True, episodic=False, timeout_s=30,
                         restarts=RestartPolicy(budget=2, backoff_s=0.0), group_retries=3,
                         failures=(WorkerDied, WorkerTimeout), emit=lambda kind, **fields: events.append((kind, fields)),
                         new_worker=lambda i: (0.0,), sender=WeightSender(BF16))
        g = torch.Generator().manual_seed(0)
        w = torch.randn(BLOCK, generator=g)

        def trained(v: int) -> WeightsUpdate:  # each version moves 1% of the elements by 1%
            moved = w.clone()
            moved[: v * BLOCK // 100] *= 1.01
            return WeightsUpdate(v, {"w": moved, "b": torch.ones(4)})

        whole = 2 * (BLOCK + 4)
        assert f.load_weights(trained(0)) == {"weight_sync/bytes": 2.0 * whole, "weight_sync/delta_frac": 1.0}
        stats = f.offer_weights(trained(1))
        k = BLOCK // 100  # 655 elements changed, at most (some round to the same bf16)
        assert stats["weight_sync/bytes"] <= 2 * (4 + 4 * k) and stats["weight_sync/delta_frac"] < 0.05
        f.generate([[1, 2]] * 6, 2, params, [31, 32, 33, 34, 35, 36])  # worker 1 dies at seed 34 and is replaced
        [join] = joined(events, 1)
        assert join["worker"] == 1 and join["version"] == 1 and f.live() == [0, 1]
        f.offer_weights(trained(2))
        f.stage_weights(trained(3))
        f.load_staged(3)
        f.resize(3)  # worker 2 joins
        assert [j["worker"] for j in joined(events, 2)] == [1, 2] and f.live() == [0, 1, 2]
        stats = f.offer_weights(trained(4))
        assert stats["weight_sync/delta_frac"] < 0.05  # all three hold version 3
        reports = [r.result(timeout=30) for r in group.submit("report")]
    finally:
        f.close()
    assert [(m, kind) for m, kind, _ in reports[0][0]] == [
        ("load_weights", "whole"), ("offer_weights", "delta"), ("offer_weights", "delta"), ("stage_weights", "delta"),
        ("offer_weights", "delta")]
    # the replacement, and the worker added: the whole current version at their start, deltas after it
    assert [(m, kind, v) for m, kind, v in reports[1][0]] == [
        ("load_weights", "whole", 1), ("offer_weights", "delta", 2), ("stage_weights", "delta", 3),
        ("offer_weights", "delta", 4)]
    assert [(m, kind, v) for m, kind, v in reports[2][0]] == [("load_weights", "whole", 3), ("offer_weights", "delta", 4)]
    expected = snapshot(trained(4), BF16).tensors
    for _, tensors in reports:
        assert all(same_bits(tensors[k], expected[k]) for k in expected)
