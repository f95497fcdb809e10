"""Data-parallel trainer ranks in real gloo process groups: 2 ranks compute the 1-rank update
(ddp, and the fsdp code path, which FSDP2 also runs over gloo), and the collective traces of
injected faults name a slow rank and a stuck one.

Rank 0 runs in the test's process (as beside the controller), rank 1 in a child process; one
group serves every aggregation (reset between them) to keep the process starts few.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
import torch

from reasonrl.algo import AGG_MODES
from reasonrl.config import load
from reasonrl.metrics import EventLog, read_jsonl
from reasonrl.resilience.collectives import RankMonitor, analyse, build_rank, format_table, launch_ranks
from reasonrl.resilience.faults import FIRED_FILE
from reasonrl.runtime import LocalGroup, ProcessGroup, WorkerTimeout
from reasonrl.runtime.ranks import RankGroup
from reasonrl.trainer.logprobs import compute_logprobs
from reasonrl.types import ScoredBatch, TrainBatch
from reasonrl.workers.policy import PolicyWorker
from reasonrl.workers.trainer_rank import TrainerRank
from tests.conftest import synthetic_rollout

pytestmark = pytest.mark.xdist_group("ranks")  # the module's two rank processes start once


class TunableRank(TrainerRank):
    """A rank whose algo and train settings a test changes between updates (from the ones it was built with)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.base = self.cfg

    def configure(self, algo: dict, train: dict) -> None:
        self.cfg = replace(self.base, algo=replace(self.base.algo, **algo), train=replace(self.base.train, **train))

    def own_weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}


def tunable_rank(cfg, model_dir, rank: int, world: int, trace_dir):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return TunableRank(cfg, model_dir, rank, world, trace_dir)


def config(model_dir, run_dir, *extra: str):
    return load(None, [f"model.path={model_dir}", f"run.dir={run_dir}", "run.threads=1", "rollout.max_new_tokens=7",
                       "train.mini_batch_size=4", "train.micro_batch_size=2", "train.lr=1e-3",
                       "runtime.trainer_ranks=2", "runtime.collective_timeout_s=4", *extra])


def train_batch(B: int = 8, seed: int = 0) -> TrainBatch:
    """A batch of varied lengths (one empty response), some clipped ratios, two rows without signal."""
    rollout = synthetic_rollout(B=B, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    mask = rollout.response_mask
    rollout.logprobs = -torch.rand(mask.shape, generator=g) * mask
    adv = torch.randn(B, generator=g)[:, None] * mask
    adv[[1, 5]] = 0.0
    old = (rollout.logprobs + 0.3 * torch.randn(mask.shape, generator=g)) * mask
    ref = (rollout.logprobs + 0.1 * torch.randn(mask.shape, generator=g)) * mask
    scored = ScoredBatch(rollout, [None] * B, [""] * B, torch.zeros(B), torch.zeros(B, dtype=torch.bool),
                         torch.zeros(B, dtype=torch.bool))
    return TrainBatch(scored, mask, old, adv, ref_logprobs=ref)


# (algo, train, anchor given, rank shares) per aggregation: micro-batching by rows and by tokens,
# 2 epochs, KL and entropy terms, the proximal anchor computed by the update, gradient clipping
# active, a smaller share for rank 1.
CASES = {
    "token-mean": ({}, {}, True, [0.5, 0.5]),
    "seq-mean-token-mean": ({"entropy_coef": 0.01}, {"micro_batch_tokens": 20, "grad_clip": 0.005}, True, [0.5, 0.5]),
    "seq-mean-token-sum": ({"off_policy": "decoupled"}, {"micro_batch_size": 1}, False, [0.5, 0.5]),
    "seq-mean-token-sum-norm": ({"kl_loss_coef": 0.1}, {"ppo_epochs": 2}, True, [0.75, 0.25]),
}


@pytest.mark.serial  # the slow and the hung rank are found by wall time
def test_a_slow_rank_is_named_and_given_less_and_a_hung_rank_times_out(model_dir, tmp_path):
    # rank 1 computes 6 times longer in steps 1-3 and hangs before its first collective of step 4
    cfg = config(model_dir, tmp_path, "faults=[slow_rank@1:rank=1:factor=6:steps=3,hang_rank@4:rank=1]",
                 "resilience.slow_min_s=0.05")
    events = EventLog(tmp_path)
    # the run's launcher: rank 0 in this process (as beside the controller; in a child when another
    # test's group already holds this process's process group); the faults act in rank 1's process
    group = launch_ranks(cfg, model_dir, tmp_path, rank0_here=not torch.distributed.is_initialized())
    monitor = RankMonitor(tmp_path / "trace", 2, events, cfg.resilience, cfg.runtime)
    batch = train_batch()
    try:
        straggler = None
        for step in (1, 2, 3):
            group.call("update", batch, 1e-3, step=step)
            found = monitor.after_step(step)
            if found.shares is not None:
                group.call("set_shares", found.shares)
            straggler = straggler or next((e for e in found.events if e["kind"] == "straggler"), None)
        assert straggler is not None and straggler["rank"] == 1 and straggler["lateness_s"] > 0.05
        assert straggler["share"] < 0.5 < straggler["shares"][0]  # less than an equal part: how much less is timing
        report = analyse(tmp_path / "trace")
        assert {s.rank: s.times_last for s in report.ranks}[1] >= 2  # the others waited for it
        assert format_table(report).splitlines()[1].split()[:2] == ["rank", "collectives"]
        with pytest.raises(WorkerTimeout, match="policy.update: ranks \\[1\\] did not answer"):  # the hang is cut
            group.call("update", batch, 1e-3, step=4)
        assert monitor.on_timeout(4) == 1
    finally:
        group.close()
    logged = read_jsonl(tmp_path / "events.jsonl")
    [hang] = [e for e in logged if e["kind"] == "hang"]
    assert (hang["step"], hang["rank"], hang["op"], hang["what"]) == (4, 1, "all_reduce", "grads")
    fired = [e["fault"] for e in logged if e["kind"] == "fault_injected"]
    assert fired == ["slow_rank@1:rank=1:factor=6.0:steps=3", "hang_rank@4:rank=1"]
    # fired once per run: a restarted run would not hang again
    assert set(json.loads((tmp_path / FIRED_FILE).read_text())["fired"]) == set(fired)


@pytest.fixture(scope="module")
def ranks(model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ranks")
    cfg = config(model_dir, run_dir)
    trace = run_dir / "trace"

    def launch(rank: int):
        if rank == 0:
            return LocalGroup([tunable_rank(cfg, model_dir, 0, 2, trace)])
        return ProcessGroup(tunable_rank, [(cfg, model_dir, rank, 2, trace)], name=f"rank{rank}", timeout_s=60)

    group = RankGroup(launch, 2, timeout_s=60)
    yield cfg, group
    group.close()


def test_two_ranks_compute_the_single_rank_update_for_every_aggregation(ranks, model_dir):
    assert set(CASES) == set(AGG_MODES)
    torch.use_deterministic_algorithms(True)
    cfg, group = ranks
    single = PolicyWorker(cfg, model_dir)
    for agg, (algo, train, given, shares) in CASES.items():
        algo = {"loss_agg": agg, "eps_low": 0.2, "eps_high": 0.28, **algo}
        single.reset()
        single.cfg = replace(cfg, algo=replace(cfg.algo, **algo), train=replace(cfg.train, **train))
        group.call("reset")
        group.call("configure", algo, train)
        group.call("set_shares", shares)
        batch = train_batch()
        if not given:
            batch = replace(batch, old_logprobs=None)
        before = {name: p.detach().clone() for name, p in single.module.named_parameters()}
        expected = single.update(batch, 1e-3)
        got = group.call("update", batch, 1e-3, step=1)
        assert got[0] == got[1], agg  # every rank returns the global metrics
        # Means over micro-batches (clip fractions, ppo_kl; entropy when zero-advantage rows are
        # skipped) depend on the micro-batches, as they do in one rank; everything else is global.
        means = {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
        if expected["trained_rows_frac"] < 1:
            means.add("entropy")
        for key, value in expected.items():
            if key not in means:
                assert got[0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (agg, key)
        assert set(got[0]) == set(expected), agg
        w0, w1 = group.call("own_weights")
        for name, p in single.module.named_parameters():
            assert torch.equal(w1[name], w0[name]), (agg, name)  # the ranks hold the same weights
        flat = lambda weights: torch.cat([weights[n].flatten() for n in before])  # noqa: E731
        one = torch.cat([p.detach().flatten() for p in single.module.parameters()])
        change, gap = one - flat(before), flat(w0) - one
        # The weights to 1e-6 relative (as vectors); the change itself to 1e-4 relative (AdamW's
        # first step divides by |g| + eps, so a near-zero gradient turns rounding into 1e-4 of a step).
        assert float(gap.norm() / one.norm()) < 1e-6, agg
        assert float(gap.norm() / change.norm()) < 1e-4, agg
        assert float(change.abs().max()) > 1e-4, agg
        if agg == "seq-mean-token-mean":
            assert expected["grad_norm"] > 0.005  # the clip acted
        if not given:
            assert "off_policy/ess" in got[0]


def test_two_ranks_score_the_batch_as_one(ranks, model_dir):
    cfg, group = ranks
    group.call("reset")
    rollout = train_batch().scored.rollout
    single = compute_logprobs(PolicyWorker(cfg, model_dir).module, rollout, 1.0, 2)
    got = group.call("logprobs", rollout, step=1)
    assert got[1] is None
    torch.testing.assert_close(got[0], single, rtol=1e-5, atol=1e-6)


def fsdp_rank(cfg, model_dir, rank: int, world: int):
    """A rank built as ddp (the CPU check passes), then switched to fsdp before it connects:
    FSDP2 runs on gloo too (with sum reductions), so its code path is tested without a GPU."""
    torch.set_num_threads(1)
    worker = TrainerRank(cfg, model_dir, rank, world)
    worker.cfg = replace(cfg, train=replace(cfg.train, strategy="fsdp"))
    return worker


def test_the_fsdp_path_computes_the_single_rank_update(model_dir, tmp_path):
    cfg = config(model_dir, tmp_path, "algo.off_policy=decoupled", "algo.loss_agg=seq-mean-token-mean",
                 "train.micro_batch_size=1")
    group = RankGroup(lambda rank: ProcessGroup(fsdp_rank, [(cfg, model_dir, rank, 2)], name=f"fsdp{rank}", timeout_s=60),
                      2, timeout_s=60)
    single = PolicyWorker(cfg, model_dir)
    batch = replace(train_batch(), old_logprobs=None)
    rollout = batch.scored.rollout
    try:
        group.call("set_shares", [0.6, 0.4])
        # scoring first: a forward without backward must not spoil the next backward's reduce-scatter
        torch.testing.assert_close(group.first("logprobs", rollout), single.logprobs(rollout), rtol=1e-5, atol=1e-6)
        expected = single.update(batch, 1e-3)
        got = group.call("update", batch, 1e-3, step=1)
        assert got[0] == got[1]
        for key in ("loss", "pg_loss", "entropy", "grad_norm", "off_policy/ess", "rollout/logprob_kl"):
            assert got[0][key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
        weights = group.first("weights")
        one = torch.cat([p.detach().flatten() for p in single.module.parameters()])
        gap = torch.cat([weights.tensors[n].flatten() for n, _ in single.module.named_parameters()]) - one
        assert float(gap.norm() / one.norm()) < 1e-6 and weights.version == 1
        assert group.call("params_finite") == [True, True]
        state = group.first("state_dict")
        group.call("reset")
        group.call("load_state_dict", state)
        restored = group.first("weights")
        assert all(torch.equal(restored.tensors[n], weights.tensors[n]) for n in weights.tensors)
    finally:
        group.close()


def test_fsdp_needs_cuda(model_dir, tmp_path):
    cfg = config(model_dir, tmp_path)  # the config loader refuses it too; a rank built from a Config object checks again
    with pytest.raises(ValueError, match="train.strategy: fsdp .* run.device is 'cpu'"):
        TrainerRank(replace(cfg, train=replace(cfg.train, strategy="fsdp")), model_dir, 0, 1)


def on_cuda(batch: TrainBatch) -> TrainBatch:
    rollout = batch.scored.rollout
    for f in fields(rollout):
        if isinstance(getattr(rollout, f.name), torch.Tensor):
            setattr(rollout, f.name, getattr(rollout, f.name).cuda())
    moved = {f.name: getattr(batch, f.name).cuda() for f in fields(batch) if isinstance(getattr(batch, f.name), torch.Tensor)}
    return replace(batch, **moved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("dtype", "rtol"), [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_fsdp_on_one_gpu_computes_the_single_rank_update(model_dir, tmp_path, dtype, rtol):
    # one rank (one GPU here), in a child process: this one may hold another test's process group;
    # bfloat16: bf16 parameters, fp32 gradient reduction (MixedPrecisionPolicy)
    cfg = config(model_dir, tmp_path, "run.device=cuda", f"model.dtype={dtype}", "train.strategy=fsdp",
                 "runtime.trainer_ranks=1")
    single = PolicyWorker(replace(cfg, train=replace(cfg.train, strategy="ddp")), model_dir)
    group = RankGroup(lambda rank: ProcessGroup(build_rank, [(cfg, model_dir, rank, 1, tmp_path, 1)], name="fsdp-gpu",
                                                timeout_s=120), 1, timeout_s=120)
    try:
        batch = on_cuda(train_batch())
        expected = single.update(batch, 1e-3)
        got = group.first("update", batch, 1e-3, step=1)
        for key in ("loss", "pg_loss", "grad_norm"):
            assert got[key] == pytest.approx(expected[key], rel=rtol, abs=1e-5), key
        weights = group.first("weights")
        for name, p in single.module.named_parameters():
            torch.testing.assert_close(weights.tensors[name].to(p.device), p.detach(), rtol=rtol, atol=1e-5)
    finally:
        group.close()


def test_two_lora_ranks_compute_the_single_rank_update(model_dir, tmp_path):
    """model.lora.rank > 0 under ddp: the ranks all-reduce the adapters' gradients alone and
    end with the single rank's adapters; the frozen base does not move."""
    torch.use_deterministic_algorithms(True)
    cfg = config(model_dir, tmp_path, "model.lora.rank=4", "train.lr=1e-2")
    here = not torch.distributed.is_initialized()  # else another test's rank 0 holds this process's group

    def launch(rank: int):
        if rank == 0 and here:
            return LocalGroup([tunable_rank(cfg, model_dir, 0, 2, tmp_path / "trace")])
        return ProcessGroup(tunable_rank, [(cfg, model_dir, rank, 2, tmp_path / "trace")], name=f"rank{rank}", timeout_s=60)

    group = RankGroup(launch, 2, timeout_s=60)
    try:
        single = PolicyWorker(cfg, model_dir)
        before = {name: p.detach().clone() for name, p in single.module.named_parameters()}
        for step in (1, 2):  # the second step moves A too (B is no longer 0)
            batch = train_batch(seed=step)
            expected = single.update(batch, 1e-2)
            got = group.call("update", batch, 1e-2, step=step)
            assert got[0]["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
        w0, w1 = group.call("own_weights")
        adapters = [name for name in before if ".lora_" in name]
        for name, p in single.module.named_parameters():
            assert torch.equal(w1[name], w0[name]), name  # the ranks hold the same weights
            if name not in adapters:
                assert torch.equal(w0[name], before[name]) and torch.equal(p.detach(), before[name]), name  # frozen
        flat = lambda weights: torch.cat([weights[n].flatten() for n in adapters])  # noqa: E731
        one = flat({n: p.detach() for n, p in single.module.named_parameters()})
        change, gap = one - flat(before), flat(w0) - one
        assert all(not torch.equal(w0[n], before[n]) for n in adapters)  # A and B both trained
        # as in the test above: vectors to 1e-6 relative, the change to 1e-4 (AdamW's early steps
        # divide by |g| + eps, which turns the rounding of a near-zero gradient into part of a step)
        assert float(gap.norm() / one.norm()) < 1e-6 and float(gap.norm() / change.norm()) < 1e-4
    finally:
        group.close()
