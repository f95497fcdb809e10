"""Delta weight sync in real runs: bf16 rollout weights reach rollout worker processes as
deltas, step after step, and every worker samples with the trainer's weights bit for bit."""

from __future__ import annotations

import pytest
import torch

from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.metrics import read_jsonl
from reasonrl.rollout.weight_sync import snapshot
from tests.conftest import tiny_run


class Watched(Controller):
    """A Controller that, after each step, reads every rollout worker's weights through its
    ``weights()`` and keeps the trainer's weights of each version, cast to bf16 as the
    rollout side holds them."""

    def __init__(self, roles, cfg, log=print) -> None:
        super().__init__(roles, cfg, log)
        self.trainer: dict[int, dict[str, torch.Tensor]] = {}
        self.seen: list[tuple[int, int, dict[str, torch.Tensor]]] = []  # (step, version, tensors) per worker read

    def keep_trainer(self) -> None:
        self.trainer.setdefault(self.version, snapshot(self.roles.rank0.weights(), torch.bfloat16).tensors)

    def step(self):
        self.keep_trainer()
        metrics = super().step()
        self.keep_trainer()
        fleet = self.source.group.workers[0].rollout
        for future in fleet.group.submit("weights"):
            held = future.result(timeout=60)
            self.seen.append((self.step_count, held.version, held.tensors))
        return metrics


@pytest.mark.parametrize(("mode", "extra"), [
    ("async", ["train.precision=bf16-mixed", "runtime.roles.rollout.count=2", "rollout.max_staleness=0"]),
    ("lockstep", ["model.dtype=bfloat16", "rollout.max_staleness=1", "algo.off_policy=tis"]),
])
def test_rollout_workers_hold_the_trainers_weights_bit_for_bit_after_20_delta_updates(model_dir, tmp_path, mode, extra):
    # Step 21's batch is sampled with version 20 in both (async at staleness 0; lockstep: batch n
    # with version n - 1), so the read after it finds each worker at version 20 or later.
    steps = 21
    cfg = load(None, [*tiny_run(model_dir, tmp_path, steps), f"rollout.mode={mode}", "train.lr=1e-6", "run.threads=1",
                      "checkpoint.every_steps=0", "checkpoint.every_minutes=0", *extra])
    controller = Watched.from_config(cfg)
    controller.run()
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "weight_sync/bytes" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    whole = 2 * sum(t.numel() for t in controller.trainer[0].values())  # one bf16 version
    workers = 2 if mode == "async" else 1
    for r in rows:  # every version after the first load went to every worker as a delta (a whole one is 1.0)
        assert 0 < r["weight_sync/delta_frac"] < 0.25 and r["timing_s/weight_sync"] > 0
        assert r["weight_sync/bytes"] == pytest.approx(r["weight_sync/delta_frac"] * workers * whole)
    assert len(controller.seen) == steps * workers
    assert min(version for step, version, _ in controller.seen if step == steps) >= steps - 1
    for step, version, tensors in controller.seen:
        expected = controller.trainer[version]  # model.dtype=bfloat16: a copy of the trainer's own tensors
        assert tensors.keys() == expected.keys()
        for name, t in tensors.items():
            # the worker's module (fp32 under bf16-mixed) holds exactly the bf16 values
            assert torch.equal(t.to(torch.bfloat16).view(torch.int16), expected[name].view(torch.int16)), (step, version, name)
            assert torch.equal(t, expected[name].to(t.dtype)), (step, version, name)


@pytest.mark.parametrize("extra", [[], ["train.precision=bf16-mixed"]])
def test_a_lora_run_ships_the_adapters_alone_and_workers_hold_the_trainers(model_dir, tmp_path, extra):
    """model.lora.rank > 0 with a rollout worker process (the fast backend loads adapters):
    each version is the adapters alone (``weight_sync/adapter_only`` 1), ``weight_sync/bytes``
    their real bytes (fp32 whole, or a bf16 delta), and the worker holds the trainer's adapters."""
    from reasonrl.models.lora import adapter_tensors

    steps = 3
    cfg = load(None, [*tiny_run(model_dir, tmp_path, steps), "model.lora.rank=4", "train.lr=1e-2", "run.threads=1",
                      "rollout.mode=async", "rollout.max_staleness=0", "checkpoint.every_steps=0", "checkpoint.every_minutes=0", *extra])
    controller = Watched.from_config(cfg)
    controller.run()
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "weight_sync/bytes" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    adapters = adapter_tensors(controller.roles.rank0.module)
    whole = sum(t.numel() for t in adapters.values()) * (2 if extra else 4)
    assert all(r["weight_sync/adapter_only"] == 1.0 for r in rows)
    if extra:  # bf16 deltas of the adapters: never more than the adapters whole
        assert all(0 < r["weight_sync/bytes"] <= whole for r in rows)
    else:
        assert all(r["weight_sync/bytes"] == whole for r in rows)
    everything = sum(p.numel() for p in controller.roles.rank0.module.parameters()) * 4
    assert whole < everything / 4  # rank 4 on a 32-wide model: a small part of it
    step, version, tensors = controller.seen[-1]
    trainer = controller.trainer[version]
    for name, t in tensors.items():
        if ".lora_" in name:
            assert torch.equal(t.to(trainer[name].dtype), trainer[name]), name
    assert any(not torch.equal(trainer[n], controller.trainer[0][n]) for n in trainer if ".lora_B." in n)  # trained
