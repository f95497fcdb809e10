"""RolloutScheduler: dynamic sampling that keeps exactly the wanted mixed groups, stops
decoding once it has them, accounts for every sample, and is reproducible."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl import algo
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.rollout.scheduler import DynamicSamplingError, RolloutScheduler, SampleState
from reasonrl.rollout.seeds import group_seed
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, ScoredBatch
from tests.unit.test_rollout_hf import EOS, PAD, tiny_qwen2

N = 4
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


def token_hash(tokens: list[int]) -> int:
    """A deterministic hash of a response (stable across processes, unlike ``hash``)."""
    h = 17
    for t in tokens:
        h = (h * 1_000_003 + t) % (1 << 61)
    return h


def fake_score(k: int = 3, acc_of=None):
    """``score(rollout, prompts)``: acc = hash(response tokens) % k == 0, score = acc.

    Records each call's row count in ``calls``.
    """
    calls: list[int] = []

    def score(rollout: RolloutBatch, prompts: list[Prompt]) -> ScoredBatch:
        assert len(prompts) == rollout.size
        calls.append(rollout.size)
        responses = [rollout.response_ids[i, : int(rollout.lengths[i])].tolist() for i in range(rollout.size)]
        acc = torch.tensor([acc_of(r) if acc_of else token_hash(r) % k == 0 for r in responses], dtype=torch.bool)
        return ScoredBatch(rollout, prompts, [str(r) for r in responses], acc.float(), acc, torch.zeros_like(acc))

    score.calls = calls
    return score


class Prompts:
    """A resumable prompt source: ``next_prompts(k)`` hands out the next k prompts as
    ``(prompt, ids, seed)``, the ``d``-th drawn with ``group_seed(run, d)`` (as a run's producer)."""

    def __init__(self, seed: int = 0, count: int = 400, run: int = 0) -> None:
        self.run = run
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(count):
            ids = torch.randint(2, 48, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
            self.items.append((Prompt(id=f"p{i}", text=str(ids), ground_truth=""), ids))
        self.position = 0
        self.requests: list[int] = []

    def __call__(self, k: int):
        self.requests.append(k)
        draws = range(self.position, self.position + k)
        self.position += k
        return [(*self.items[d], group_seed(self.run, d)) for d in draws]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2(eos_bias=3.0)


def scheduler(model, score=None, generator_cls=FastGenerator, **kw) -> RolloutScheduler:
    options = dict(want_groups=4, oversample=2.0, max_gen_batches=10, pad_id=PAD)
    options.update(kw)
    return RolloutScheduler(generator_cls(model, PAD, EOS), score or fake_score(), N, PARAMS, **options)


def check_lifecycle(s: RolloutScheduler, stats: dict[str, float]) -> None:
    states = [r.state for r in s.samples]
    assert set(states) <= {SampleState.KEPT, SampleState.DROPPED, SampleState.ABORTED}
    started, kept = len(states), states.count(SampleState.KEPT)
    completed = kept + states.count(SampleState.DROPPED)
    assert stats["batch/generated_samples"] == completed
    assert stats["batch/aborted_samples"] == states.count(SampleState.ABORTED)
    assert started == stats["batch/generated_samples"] + stats["batch/aborted_samples"]
    dropped_groups = stats["batch/dropped_all_correct"] + stats["batch/dropped_all_wrong"] + stats["batch/surplus_groups"]
    assert completed == N * (stats["batch/kept_groups"] + dropped_groups)
    assert stats["batch/wasted_samples"] == completed - kept
    assert stats["batch/samples_per_kept_group"] == started / stats["batch/kept_groups"]
    assert stats["batch/aborted_tokens"] == sum(r.tokens for r in s.samples if r.state is SampleState.ABORTED)
    # Whole groups move together.
    for i in range(0, started, N):
        assert len({(r.gen_batch, r.group, r.state, r.reason) for r in s.samples[i : i + N]}) == 1
    assert all(isinstance(v, float) for v in stats.values())


def replay(model, s: RolloutScheduler, prompts: Prompts) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Plain ``generate`` of each generation batch's prompts with the same seeds:
    ``{prompt id: (response ids [N, T], logprobs [N, T])}``."""
    gen = FastGenerator(model, PAD, EOS)
    out, position = {}, 0
    for k in prompts.requests:
        pairs = prompts.items[position : position + k]
        seeds = [group_seed(prompts.run, d) for d in range(position, position + k)]
        position += k
        batch = gen.generate([ids for _, ids in pairs], N, s.params, seeds)
        for g, (p, _) in enumerate(pairs):
            out[p.id] = (batch.response_ids[g * N : (g + 1) * N], batch.logprobs[g * N : (g + 1) * N])
    return out


def test_keeps_exactly_want_mixed_groups_equal_to_plain_generate(model):
    s, prompts = scheduler(model, want_groups=6), Prompts()
    batch, stats = s.collect(prompts)
    assert batch.size == 6 * N and batch.rollout.group_ids.tolist() == [i // N for i in range(6 * N)]
    assert algo.keep_groups(batch.acc.float(), batch.rollout.group_ids).all()
    assert algo.group_outcomes(batch.acc, batch.rollout.group_ids) == (0, 0, 6)
    assert stats["batch/kept_groups"] == 6
    check_lifecycle(s, stats)
    # Prompts drawn as needed: ceil(missing * oversample) per generation batch.
    assert prompts.requests[0] == 12 and prompts.position == sum(prompts.requests)
    assert len(prompts.requests) == stats["batch/num_gen_batches"]
    # Same tokens and log-probs as a plain generate of the same prompts and seed.
    plain = replay(model, s, prompts)
    T = batch.rollout.response_ids.shape[1]
    assert T == int(batch.rollout.lengths.max())
    for g in range(6):
        rows = slice(g * N, (g + 1) * N)
        ids, logprobs = plain[batch.prompts[g * N].id]
        assert all(p.id == batch.prompts[g * N].id for p in batch.prompts[rows])
        width = min(T, ids.shape[1])
        assert torch.equal(batch.rollout.response_ids[rows, :width], ids[:, :width])
        assert batch.rollout.response_ids[rows, width:].eq(PAD).all() and ids[:, width:].eq(PAD).all()
        assert torch.equal(batch.rollout.logprobs[rows, :width], logprobs[:, :width])
        # Prompts re-padded on the left, trimmed to the longest kept prompt.
        mask = batch.rollout.prompt_mask[rows]
        assert batch.rollout.prompt_ids[rows][mask.bool()].tolist() == [
            t for _ in range(N) for t in prompts.items[int(batch.prompts[g * N].id[1:])][1]
        ]
    assert batch.rollout.prompt_mask.any(0).all()


def test_early_stop_aborts_unfinished_groups(model):
    # Half of the samples correct: almost every group is mixed, the first 4 of 24 to end fill the batch.
    s = scheduler(model, score=fake_score(k=2), want_groups=4, oversample=6.0)
    batch, stats = s.collect(Prompts(run=1))
    check_lifecycle(s, stats)
    assert stats["batch/num_gen_batches"] == 1 and batch.size == 4 * N
    assert stats["batch/aborted_samples"] > 0 and stats["batch/aborted_tokens"] > 0
    assert stats["batch/generated_samples"] < 24 * N
    assert stats["batch/samples_per_kept_group"] == 24 * N / 4
    # Aborted samples never reached the scorer.
    assert sum(s.score.calls) == stats["batch/generated_samples"]
    kept_lengths = batch.rollout.lengths.view(-1, N).max(1).values
    aborted = [r.tokens for r in s.samples if r.state is SampleState.ABORTED]
    assert max(aborted) <= int(kept_lengths.max())


def test_without_early_stop_whole_batches_in_prompt_order(model):
    prompts = Prompts(run=2)
    s = scheduler(model, want_groups=4, early_stop=False, gen_batch_prompts=6)
    batch, stats = s.collect(prompts)
    check_lifecycle(s, stats)
    assert stats["batch/aborted_samples"] == 0 and set(prompts.requests) == {6}
    assert stats["batch/generated_samples"] == 6 * N * stats["batch/num_gen_batches"]
    kept = [(r.gen_batch, r.group) for r in s.samples[::N] if r.state is SampleState.KEPT]
    assert kept == sorted(kept) and [p.id for p in batch.prompts[::N]] == [f"p{b * 6 + g}" for b, g in kept]
    # A generator without generate_stream gives the same batch.
    hf = scheduler(model, generator_cls=HFGenerator, want_groups=4, gen_batch_prompts=6)
    assert not hf.streaming
    other, other_stats = hf.collect(Prompts(run=2))
    check_lifecycle(hf, other_stats)
    assert other.size == 4 * N and other_stats["batch/aborted_samples"] == 0


def test_all_wrong_raises_with_counts_and_config_keys(model):
    prompts = Prompts()
    s = scheduler(model, score=fake_score(acc_of=lambda r: False), want_groups=3, max_gen_batches=2)
    with pytest.raises(DynamicSamplingError, match="only 0 of 3 groups") as info:
        s.collect(prompts)
    message = str(info.value)
    for key in ("algo.max_gen_batches=2", "train.gen_prompts_per_step", "train.prompts_per_step", "algo.dynamic_sampling"):
        assert key in message
    assert "0 groups dropped all correct, 12 dropped all wrong" in message
    assert isinstance(info.value, RuntimeError) and info.value.stats["batch/dropped_all_wrong"] == 12
    assert prompts.requests == [6, 6]


def test_deterministic(model):
    results = []
    for _ in range(2):
        s = scheduler(model, want_groups=5, oversample=1.5)
        batch, stats = s.collect(Prompts(seed=3, run=4))
        results.append((batch, stats, [(r.state, r.reason, r.tokens) for r in s.samples]))
    (a, sa, ra), (b, sb, rb) = results
    assert sa == sb and ra == rb and [p.id for p in a.prompts] == [p.id for p in b.prompts]
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "group_ids"):
        assert torch.equal(getattr(a.rollout, name), getattr(b.rollout, name)), name
    assert torch.equal(a.acc, b.acc)


def test_refill_draws_only_the_missing_groups(model):
    # Few correct samples (k=12): the first batch falls short; each refill is sized to what is missing.
    s, prompts = scheduler(model, score=fake_score(k=12), want_groups=4, oversample=1.0), Prompts(run=5)
    batch, stats = s.collect(prompts)
    check_lifecycle(s, stats)
    assert stats["batch/num_gen_batches"] > 1 and batch.size == 4 * N
    missing = 4
    for b, k in enumerate(prompts.requests):
        assert k == missing
        missing -= sum(1 for r in s.samples[::N] if r.gen_batch == b and r.state is SampleState.KEPT)
    assert missing == 0


def test_the_give_up_budget_counts_prompts_so_small_refills_go_on(model):
    # algo.max_gen_batches=2 full batches of 4 prompts: refills sized to what is missing use the
    # rest of that budget. With this seed the batches keep 2, 1, 0 and 1 groups: refills of 2, 1
    # and 1 prompts, 8 in all (the whole budget) in 4 generation batches.
    s, prompts = scheduler(model, score=fake_score(k=12), want_groups=4, oversample=1.0, max_gen_batches=2), Prompts(run=1)
    batch, stats = s.collect(prompts)
    kept = [sum(r.gen_batch == b and r.state is SampleState.KEPT for r in s.samples[::N]) for b in range(4)]
    assert kept == [2, 1, 0, 1]
    assert prompts.requests == [4, 2, 1, 1] and stats["batch/num_gen_batches"] == 4 and batch.size == 4 * N
    check_lifecycle(s, stats)
    # nothing kept: every refill is a full batch, and the second one exhausts the budget
    s, prompts = scheduler(model, score=fake_score(acc_of=lambda r: False), want_groups=4, oversample=1.0, max_gen_batches=2), Prompts(run=1)
    with pytest.raises(DynamicSamplingError, match=r"from 8 prompts in 2 generation batches, the budget of "
                                                   r"algo.max_gen_batches=2 batches of 4 prompts"):
        s.collect(prompts)
    assert prompts.requests == [4, 4]


def test_without_dynamic_sampling_one_batch_as_scored(model):
    prompts = Prompts(run=6)
    s = scheduler(model, want_groups=3, dynamic=False)
    batch, stats = s.collect(prompts)
    plain = FastGenerator(model, PAD, EOS).generate(
        [ids for _, ids in prompts.items[:3]], N, PARAMS, [group_seed(6, d) for d in range(3)]
    )
    assert prompts.requests == [3] and torch.equal(batch.rollout.response_ids, plain.response_ids)
    assert stats["batch/kept_groups"] == 3 and stats["batch/generated_samples"] == 3 * N
    assert stats["batch/samples_per_kept_group"] == N and stats["batch/wasted_samples"] == 0
    check_lifecycle(s, stats)


class Losing:
    """A generator that loses the groups whose seed is in ``lose`` (as the rollout fleet leaves
    out a group that ran out of retries): missing from ``generate``'s rows, named in a stream's
    ``failed``."""

    def __init__(self, inner, lose: set[int]) -> None:
        self.inner, self.lose, self.streams = inner, lose, inner.streams

    def generate(self, prompts, n, params, seeds):
        keep = [g for g, seed in enumerate(seeds) if seed not in self.lose]
        rows = self.inner.generate([prompts[g] for g in keep], n, params, [seeds[g] for g in keep])
        rows.group_ids = torch.tensor(keep).repeat_interleave(n)
        return rows


def test_a_failed_group_is_recorded_whole_and_a_plain_batch_draws_one_more_in_its_place(model):
    prompts = Prompts(run=6)
    lost = group_seed(6, 1)
    s = RolloutScheduler(Losing(FastGenerator(model, PAD, EOS), {lost}), fake_score(), N, PARAMS, want_groups=3,
                         dynamic=False, pad_id=PAD)
    batch, stats = s.collect(prompts)
    assert prompts.requests == [3, 1]  # the failed group's place is drawn again
    plain = FastGenerator(model, PAD, EOS).generate(
        [prompts.items[d][1] for d in (0, 2, 3)], N, PARAMS, [group_seed(6, d) for d in (0, 2, 3)])
    assert batch.rollout.group_ids.tolist() == [0] * N + [1] * N + [2] * N
    T = int(plain.lengths.max())
    assert torch.equal(batch.rollout.response_ids[:, :T], plain.response_ids[:, :T])
    assert s.kept_draws == [0, 2, 3]
    assert [r.state for r in s.samples[::N]] == [SampleState.KEPT, SampleState.FAILED, SampleState.KEPT, SampleState.KEPT]
    assert stats["batch/failed_groups"] == 1 and stats["batch/kept_groups"] == 3


def test_a_failed_group_in_dynamic_sampling_is_failed_not_dropped(model):
    prompts = Prompts(run=6)
    s = RolloutScheduler(Losing(FastGenerator(model, PAD, EOS), {group_seed(6, 0)}), fake_score(), N, PARAMS,
                         want_groups=2, oversample=2.0, early_stop=False, pad_id=PAD)
    batch, stats = s.collect(prompts)
    assert s.samples[0].state is SampleState.FAILED and 0 not in s.kept_draws
    assert stats["batch/failed_groups"] == 1 and batch.rollout.size == 2 * N


def test_batch_sizes_and_validation(model):
    s = scheduler(model, want_groups=10, oversample=1.1)
    assert [s.batch_prompts(m) for m in (10, 3, 1)] == [11, 4, 2]
    assert scheduler(model, gen_batch_prompts=24).batch_prompts(3) == 24
    assert math.isinf(s.stats(0)["batch/samples_per_kept_group"])
    for bad, match in [
        (dict(want_groups=0), "want_groups"),
        (dict(oversample=0.5), "oversample"),
        (dict(max_gen_batches=0), "max_gen_batches"),
    ]:
        with pytest.raises(ValueError, match=match):
            scheduler(model, **bad)
    with pytest.raises(ValueError, match="rollout.n"):
        RolloutScheduler(FastGenerator(model, PAD, EOS), fake_score(), 0, PARAMS, 4)


def test_dynamic_sampling_keeps_groups_of_one_sample(model):
    # As verl's DAPO filter: a group of one has no spread to measure, so it is kept, and
    # rollout.n=1 with dynamic sampling fills its batch from the first generation batch.
    s = RolloutScheduler(FastGenerator(model, PAD, EOS), fake_score(), 1, PARAMS, 4, dynamic=True, oversample=1.0)
    batch, stats = s.collect(Prompts())
    assert batch.size == 4 and stats["batch/kept_groups"] == 4 and stats["batch/num_gen_batches"] == 1
    assert stats["batch/dropped_all_correct"] == stats["batch/dropped_all_wrong"] == 0
    # kept_draws names the draw of each group of the batch, in batch order (groups complete in any order)
    assert [p.id for p in batch.prompts] == [f"p{d}" for d in s.kept_draws] and len(set(s.kept_draws)) == 4


def test_batches_follow_the_run_seed_whatever_the_generation_batches(model):
    # Each group samples with group_seed(run, its draw index): the same prompts drawn in
    # generation batches of 6 or of 3 (whole batches, kept in draw order) give the same groups,
    # token for token (log-probs to fp32 noise: the batches around them differ in size); the same
    # run seed gives the same batch again, another one other samples.
    def collect(gen_batch_prompts: int, run: int):
        s = scheduler(model, want_groups=4, early_stop=False, gen_batch_prompts=gen_batch_prompts)
        batch, _ = s.collect(Prompts(run=run))
        return batch, s

    six, s6 = collect(6, run=9)
    three, s3 = collect(3, run=9)
    assert s6.kept_draws == s3.kept_draws
    assert s3.samples[-1].gen_batch > s6.samples[-1].gen_batch  # really split differently
    assert [p.id for p in six.prompts] == [p.id for p in three.prompts]
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_ids"):
        assert torch.equal(getattr(six.rollout, name), getattr(three.rollout, name)), name
    torch.testing.assert_close(six.rollout.logprobs, three.rollout.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(six.acc, three.acc)
    again, _ = collect(6, run=9)
    assert torch.equal(again.rollout.response_ids, six.rollout.response_ids)
    other, _ = collect(6, run=10)
    assert [p.id for p in other.prompts] != [p.id for p in six.prompts] or not torch.equal(
        other.rollout.response_ids, six.rollout.response_ids)
