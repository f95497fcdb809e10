"""FastGenerator: same contract as HFGenerator, same greedy tokens, same sampling distribution
(and the contract checks both backends share: seeding, the global RNG, the module's mode)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.types import SamplingParams
from tests.unit.test_rollout_hf import (
    EOS,
    PAD,
    PROMPTS,
    check_contract,
    recompute_logits,
    recomputed_logprobs,
    seeds,
    tiny_qwen2,
)


def rows_per_call(model) -> list[int]:
    """Record the batch size of every forward pass through ``model``'s embedding (appended
    to the returned list): one per prefill and per decode step."""
    rows: list[int] = []
    model.model.embed_tokens.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    return rows


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_greedy_equals_hf(attention):
    # Prompt 1 ends with the trigger: its 3 rows end at once, so the batch is compacted.
    model = tiny_qwen2(trigger_bias=30.0, attention=attention)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    hf = HFGenerator(model, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS))
    rows = rows_per_call(model)
    fast = FastGenerator(model, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS))
    # One prefill of the 4 distinct prompts; prompt 1's 3 rows end at the first token and
    # are dropped before the first decode step.
    assert rows[:2] == [4, 9]
    check_contract(fast, PROMPTS, 3, 12)
    assert fast.eos.any() and fast.truncated.any()
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "eos", "truncated"):
        assert torch.equal(getattr(fast, name), getattr(hf, name)), name
    assert torch.equal(fast.group_ids, hf.group_ids)
    torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-5, rtol=0)


def test_fixed_shape_loop_equals_hf_and_keeps_every_row():
    # The loop a CUDA graph replays (static_shapes=True), run eagerly: the cache's empty
    # slots hold zeros and must be masked, the prompts' padding too (PROMPTS differ in length).
    model = tiny_qwen2(trigger_bias=30.0)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    hf = HFGenerator(model, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS))
    rows = rows_per_call(model)
    fast = FastGenerator(model, PAD, EOS, static_shapes=True).generate(PROMPTS, 3, params, seeds(PROMPTS))
    # prefill, then every row at every step, nothing compacted; a step samples a token and
    # then runs the model on it, also at the last step (wasted there, one graph for all steps)
    assert rows == [4] + [12] * 12
    check_contract(fast, PROMPTS, 3, 12)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "eos", "truncated", "group_ids"):
        assert torch.equal(getattr(fast, name), getattr(hf, name)), name
    torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-5, rtol=0)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=10, max_new_tokens=10)
    model = tiny_qwen2(eos_bias=1.5)
    batch = FastGenerator(model, PAD, EOS, static_shapes=True).generate(PROMPTS, 4, sampling, seeds(PROMPTS, 3))
    check_contract(batch, PROMPTS, 4, 10)
    assert batch.eos.any() and batch.truncated.any()
    torch.testing.assert_close(batch.logprobs, recomputed_logprobs(model, batch, sampling.temperature), atol=1e-5, rtol=0)


def test_stops_when_every_row_ended():
    # Row 0 ends at once but is not worth compacting away (1 of 5); the others end at step 28
    # (this model's greedy path).
    model = tiny_qwen2(trigger_bias=30.0)
    prompts = [PROMPTS[1]] + [PROMPTS[0]] * 4
    rows = rows_per_call(model)
    params = SamplingParams(temperature=0.0, max_new_tokens=30)
    batch = FastGenerator(model, PAD, EOS).generate(prompts, 1, params, seeds(prompts))
    assert batch.lengths.tolist() == [1, 28, 28, 28, 28]
    assert rows == [5] * 28


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=10, max_new_tokens=10),
    ],
)
def test_sampling_contract_and_logprobs_match_full_forward(params):
    model = tiny_qwen2(eos_bias=1.5)
    batch = FastGenerator(model, PAD, EOS).generate(PROMPTS, 4, params, seeds(PROMPTS, 3))
    check_contract(batch, PROMPTS, 4, 10)
    assert batch.eos.any() and batch.truncated.any()
    expected = recomputed_logprobs(model, batch, params.temperature)
    torch.testing.assert_close(batch.logprobs, expected, atol=1e-5, rtol=0)


def first_token_probs(model, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """[V] exact first-token distribution, truncated by transformers' own warpers."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, -1].float()
    for warper in (
        TemperatureLogitsWarper(params.temperature),
        TopKLogitsWarper(params.top_k) if params.top_k else None,
        TopPLogitsWarper(params.top_p) if params.top_p < 1 else None,
    ):
        logits = warper(ids, logits) if warper else logits
    return torch.softmax(logits, -1)[0]


def empirical_first_tokens(
    generator, prompt: list[int], n: int, params: SamplingParams, seed: int
) -> torch.Tensor:
    """[V] frequencies of the first response token over ``n`` samples."""
    batch = generator.generate([prompt], n, params, seeds([prompt], seed))
    return torch.bincount(batch.response_ids[:, 0], minlength=48).float() / n


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    """Total-variation distance between two distributions over the vocabulary."""
    return 0.5 * (p - q).abs().sum().item()


def expected_tv(p: torch.Tensor, n: int) -> float:
    """Expected TV between ``p`` and the frequencies of ``n`` draws from it (normal approximation)."""
    return 0.5 * ((2 / torch.pi) ** 0.5 * (p * (1 - p) / n).sqrt()).sum().item()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.5, top_p=0.8, max_new_tokens=1),
        SamplingParams(temperature=1.2, max_new_tokens=1),
        SamplingParams(temperature=1.0, top_k=5, max_new_tokens=1),
    ],
)
def test_first_token_distribution_matches_hf_and_exact(params):
    model = tiny_qwen2()
    prompt, n = PROMPTS[1], 4000
    exact = first_token_probs(model, prompt, params)
    tolerance = 3 * expected_tv(exact, n)
    # The test has power: each plausible mistake moves the distribution well beyond the tolerance.
    mistakes = [replace(params, temperature=params.temperature / 2)]
    if params.top_p < 1 or params.top_k:
        mistakes.append(replace(params, top_p=1.0, top_k=0))
    for wrong in mistakes:
        assert tv(first_token_probs(model, prompt, wrong), exact) > 2 * tolerance
    fast = empirical_first_tokens(FastGenerator(model, PAD, EOS), prompt, n, params, 0)
    hf = empirical_first_tokens(HFGenerator(model, PAD, EOS), prompt, n, params, 0)
    assert tv(fast, exact) < tolerance
    assert tv(hf, exact) < tolerance
    assert tv(fast, hf) < 2**0.5 * tolerance
    # The support is exact: nothing outside it, and every token with p > 0.003 was drawn.
    assert (fast[exact == 0] == 0).all()
    assert (fast[exact > 0.003] > 0).all()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.5, top_k=3, max_new_tokens=6),
        SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=6),
    ],
)
def test_truncation_respected(params):
    model = tiny_qwen2()
    batch = FastGenerator(model, PAD, EOS).generate(PROMPTS, 16, params, seeds(PROMPTS, 4))
    logits = recompute_logits(model, batch) / params.temperature
    valid = batch.response_mask.bool()
    if params.top_k:
        in_top = (logits.topk(params.top_k, -1).indices == batch.response_ids[..., None]).any(-1)
        assert in_top[valid].all()
    else:
        probs = torch.softmax(logits, -1)
        chosen = probs.gather(-1, batch.response_ids[..., None]).squeeze(-1)
        mass_above = (probs * (probs > chosen[..., None])).sum(-1)
        assert (mass_above[valid] < params.top_p + 1e-5).all()


SAMPLED = [
    SamplingParams(temperature=1.0, max_new_tokens=12),
    SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=12),
]


def group_samples(batch, group: int, n: int) -> tuple[list[list[int]], torch.Tensor]:
    """Group ``group``'s responses (each up to its length) and log-probs ``[n, T]`` of ``batch``."""
    rows = range(group * n, (group + 1) * n)
    return [batch.response_ids[r, : int(batch.lengths[r])].tolist() for r in rows], batch.logprobs[group * n : (group + 1) * n]


@pytest.mark.parametrize("params", SAMPLED)
@pytest.mark.parametrize("static", [False, True])
def test_a_groups_samples_do_not_depend_on_the_rest_of_the_call(params, static):
    # The groups of one call split into two calls, in another order: each group samples the same
    # tokens, its seed (not its place) picking its draws, and the lean decoder works row by row
    # (the batches differ in size and compact at other steps; fp32 on the CPU gives the same
    # tokens). The fixed-shape loop draws the same uniforms, so it samples the same tokens too.
    n = 3
    model = tiny_qwen2(eos_bias=1.5, trigger_bias=30.0)
    group_seeds = seeds(PROMPTS, 5)
    whole = FastGenerator(model, PAD, EOS).generate(PROMPTS, n, params, group_seeds)
    assert whole.eos.any() and whole.truncated.any()
    gen = FastGenerator(model, PAD, EOS, static_shapes=static)
    for part in ([3, 1], [2, 0]):
        batch = gen.generate([PROMPTS[i] for i in part], n, params, [group_seeds[i] for i in part])
        for k, i in enumerate(part):
            (ids, logprobs), (want_ids, want_logprobs) = group_samples(batch, k, n), group_samples(whole, i, n)
            assert ids == want_ids, (part, i)
            width = min(logprobs.shape[1], want_logprobs.shape[1])
            torch.testing.assert_close(logprobs[:, :width], want_logprobs[:, :width], atol=1e-5, rtol=0)
    # another seed, other samples
    other = FastGenerator(model, PAD, EOS).generate(PROMPTS, n, params, seeds(PROMPTS, 6))
    assert [group_samples(other, g, n)[0] for g in range(4)] != [group_samples(whole, g, n)[0] for g in range(4)]


@pytest.mark.parametrize("params", SAMPLED)
def test_sampling_equals_hf(params):
    # The same uniforms in both backends: where their logits agree (fp32 noise), the same tokens.
    model = tiny_qwen2(eos_bias=1.5, trigger_bias=30.0)
    hf = HFGenerator(model, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS, 2))
    fast = FastGenerator(model, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS, 2))
    assert fast.eos.any() and fast.truncated.any()
    for name in ("response_ids", "response_mask", "eos", "truncated", "group_ids"):
        assert torch.equal(getattr(fast, name), getattr(hf, name)), name
    torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-5, rtol=0)


def test_seeds_are_checked():
    gen = FastGenerator(tiny_qwen2(), PAD, EOS)
    with pytest.raises(ValueError, match=r"^seeds: expected one seed per prompt group \(4\), got 3"):
        gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=2), [1, 2, 3])


@pytest.mark.parametrize("backend", [HFGenerator, FastGenerator])
def test_seeded_and_leaves_global_rng_alone(backend):
    model = tiny_qwen2(eos_bias=1.0)
    gen = backend(model, PAD, EOS)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    torch.manual_seed(123)
    a = gen.generate(PROMPTS, 2, params, seeds(PROMPTS, 7))
    after_call = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after_call, torch.rand(3))
    b = gen.generate(PROMPTS, 2, params, seeds(PROMPTS, 7))
    c = gen.generate(PROMPTS, 2, params, seeds(PROMPTS, 8))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert a.response_ids.shape != c.response_ids.shape or not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize("backend", [HFGenerator, FastGenerator])
@pytest.mark.parametrize("training", [True, False])
def test_mode_restored(backend, training):
    model = tiny_qwen2()
    model.train(training)
    backend(model, PAD, EOS).generate(
        PROMPTS[:1], 1, SamplingParams(max_new_tokens=2), seeds(PROMPTS[:1])
    )
    assert model.training is training


def test_unsupported_models_are_named():
    model = tiny_qwen2()
    model.config.model_type = "gpt2"
    with pytest.raises(ValueError, match="model_type = 'gpt2'.*rollout.backend=hf"):
        FastGenerator(model, PAD, EOS)
    model = tiny_qwen2()
    model.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="layer_types.*sliding_attention"):
        FastGenerator(model, PAD, EOS)


# ---------------------------------------------------------------- generate_stream

STREAM_PROMPTS = PROMPTS * 3  # 12 groups


def stream(gen, params, seed, stop_after: int | None, n: int = 4):
    """generate_stream with a callback that records its calls and stops once
    ``stop_after`` groups were reported (never when None)."""
    calls: list[tuple[list[int], object]] = []

    def on_groups_done(groups, rows):
        calls.append((groups, rows))
        return stop_after is not None and sum(len(g) for g, _ in calls) >= stop_after

    result = gen.generate_stream(STREAM_PROMPTS, n, params, seeds(STREAM_PROMPTS, seed), on_groups_done)
    return result, calls


def group_rows(groups, n: int) -> torch.Tensor:
    return torch.tensor([g * n + j for g in groups for j in range(n)], dtype=torch.long)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=16),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=12, max_new_tokens=16),
        SamplingParams(temperature=0.0, max_new_tokens=16),
    ],
)
def test_stream_completed_groups_equal_generate(params):
    n = 4
    model = tiny_qwen2(eos_bias=2.0, trigger_bias=30.0)
    gen = FastGenerator(model, PAD, EOS)
    plain = gen.generate(STREAM_PROMPTS, n, params, seeds(STREAM_PROMPTS, 3))
    longest = plain.lengths.view(-1, n).max(1).values
    assert len(set(longest.tolist())) > 2  # groups complete at different steps

    # Never stopped: the whole batch, identical to generate.
    full, calls = stream(gen, params, 3, None)
    assert not full.stopped and full.aborted == [] and full.aborted_lengths == []
    assert sorted(full.completed) == list(range(len(STREAM_PROMPTS)))
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "eos", "truncated", "group_ids"):
        assert torch.equal(getattr(full.batch, name), getattr(plain, name)), name
    # Each group is reported once, at the step its longest sample ends, with its own rows.
    steps = []
    for groups, rows in calls:
        assert groups == sorted(groups)
        assert rows.group_ids.tolist() == [g for g in groups for _ in range(n)]
        assert set(longest[groups].tolist()) == {int(rows.lengths.max())}
        assert torch.equal(rows.response_ids, plain.response_ids[group_rows(groups, n)][:, : rows.response_ids.shape[1]])
        steps.append(int(rows.lengths.max()))
    assert steps == sorted(steps) and len(steps) == len(set(steps))

    # Stopped after 5 groups: only the completed ones, same tokens and log-probs.
    part, calls = stream(gen, params, 3, 5)
    assert part.stopped and len(part.completed) >= 5 and part.aborted
    assert part.completed == [g for groups, _ in calls for g in groups]
    assert sorted(part.completed + part.aborted) == list(range(len(STREAM_PROMPTS)))
    done = sorted(part.completed)
    assert part.batch.group_ids.tolist() == [g for g in done for _ in range(n)]
    expected = plain.select(group_rows(done, n))
    T = part.batch.response_ids.shape[1]
    assert T == int(expected.lengths.max())
    for name in ("prompt_ids", "prompt_mask", "eos", "truncated"):
        assert torch.equal(getattr(part.batch, name), getattr(expected, name)), name
    for name in ("response_ids", "response_mask", "logprobs"):
        assert torch.equal(getattr(part.batch, name), getattr(expected, name)[:, :T]), name
    # Aborted: every row of the unfinished groups, with the tokens generated up to the stop.
    stop_step = max(int(rows.lengths.max()) for _, rows in calls)
    aborted = plain.select(group_rows(part.aborted, n))
    assert len(part.aborted_lengths) == len(part.aborted) * n
    assert part.aborted_lengths == aborted.lengths.clamp(max=stop_step).tolist()
    assert (longest[part.aborted] > stop_step).all()


def test_stream_stop_ends_decoding_at_once():
    model = tiny_qwen2(eos_bias=2.0, trigger_bias=30.0)
    gen = FastGenerator(model, PAD, EOS)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    rows = rows_per_call(model)
    gen.generate(STREAM_PROMPTS, 4, params, seeds(STREAM_PROMPTS, 3))
    full_calls = len(rows)
    rows.clear()
    part, calls = stream(gen, params, 3, 1)
    # Prefill, then one decode call per step until the step at which the first group ended.
    assert len(rows) == 1 + int(calls[0][1].lengths.max()) - 1 < full_calls
    assert sum(part.aborted_lengths) > 0


def test_stream_with_zero_new_tokens_reports_every_group():
    gen = FastGenerator(tiny_qwen2(), PAD, EOS)
    calls = []
    result = gen.generate_stream(
        PROMPTS, 2, SamplingParams(max_new_tokens=0), seeds(PROMPTS),
        lambda groups, rows: calls.append(groups) or False,
    )
    assert calls == [[0, 1, 2, 3]] and result.batch.size == 8 and result.batch.response_ids.shape[1] == 0
