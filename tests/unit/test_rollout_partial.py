"""PartialRollouts: without an update it is the fast backend token for token; an update mid-way
continues the unfinished samples with the new weights, each token tagged with its version."""

from __future__ import annotations

import copy

import torch

from reasonrl.rollout.base import copy_weights
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.partial import PartialRollouts
from reasonrl.types import SamplingParams
from tests.unit.test_rollout_hf import EOS, PAD, PROMPTS, recomputed_logprobs, seeds, tiny_qwen2

MAX_NEW = 10


class Updates:
    """A weight update that becomes pending after ``at`` decode steps (polls), once."""

    def __init__(self, fast: FastGenerator, new_weights: dict, at: int) -> None:
        self.fast, self.new, self.at = fast, new_weights, at
        self.polls, self.version, self.reloads = 0, 0, 0

    def pending(self) -> bool:
        self.polls += 1
        return self.version == 0 and self.polls > self.at

    def reload(self) -> None:
        copy_weights(self.fast.model, self.new)
        self.version, self.reloads = 1, self.reloads + 1


def models():
    old = tiny_qwen2(seed=0, eos_bias=1.5)
    new = copy.deepcopy(old)
    with torch.no_grad():
        for name, p in new.named_parameters():
            if "mlp" in name:
                p.mul_(2.5)
    return old, new


def interrupted_at(old, new, at: int) -> tuple[PartialRollouts, Updates]:
    """Partial rollouts that start on ``old``'s weights and see ``new``'s after ``at`` decode steps."""
    fast = FastGenerator(copy.deepcopy(old), PAD, EOS)
    updates = Updates(fast, {k: v.detach().clone() for k, v in new.named_parameters()}, at=at)
    return PartialRollouts(fast, updates.pending, updates.reload, lambda: updates.version), updates


def test_without_an_update_it_equals_the_fast_backend():
    old, _ = models()
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
    plain = FastGenerator(old, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS, 4))
    partial = PartialRollouts(FastGenerator(old, PAD, EOS), lambda: False, lambda: None, lambda: 7)
    ours = partial.generate(PROMPTS, 3, params, seeds(PROMPTS, 4))
    for key in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "eos", "truncated", "group_ids"):
        assert torch.equal(getattr(ours, key), getattr(plain, key)), key
    assert torch.equal(ours.versions, plain.response_mask.long() * 7)


def test_an_interrupted_sample_continues_its_random_draws():
    # An "update" to the same weights after 4 steps: the unfinished rows are encoded afresh and go
    # on drawing uniforms(row seed, t) from their token count, so they sample what an
    # uninterrupted generation samples.
    old, _ = models()
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=MAX_NEW)
    plain = FastGenerator(old, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS, 4))
    partial, updates = interrupted_at(old, old, at=4)
    ours = partial.generate(PROMPTS, 3, params, seeds(PROMPTS, 4))
    assert updates.reloads == 1 and (plain.lengths > 5).any() and (ours.versions == 1).any()
    for key in ("response_ids", "response_mask", "eos", "truncated"):
        assert torch.equal(getattr(ours, key), getattr(plain, key)), key
    torch.testing.assert_close(ours.logprobs, plain.logprobs, atol=1e-5, rtol=0)


def test_an_update_mid_way_continues_unfinished_samples_with_the_new_weights():
    old, new = models()
    partial, updates = interrupted_at(old, new, at=4)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW)
    batch = partial.generate(PROMPTS, 2, greedy, seeds(PROMPTS))
    assert updates.reloads == 1
    before = FastGenerator(old, PAD, EOS).generate(PROMPTS, 2, greedy, seeds(PROMPTS))
    interrupted = 0
    for row in range(batch.size):
        length = int(batch.lengths[row])
        tokens, versions = batch.response_ids[row, :length].tolist(), batch.versions[row, :length].tolist()
        k = versions.count(0)  # tokens sampled by the old weights: up to the interrupt (5 steps)
        assert versions == [0] * k + [1] * (length - k) and k == min(length, 5)
        assert tokens[:k] == before.response_ids[row, :k].tolist()
        if k == length:
            continue
        interrupted += 1
        # the rest is what the new weights decode from the prompt plus the old tokens
        prompt = PROMPTS[row // 2]
        rest = FastGenerator(new, PAD, EOS).generate([prompt + tokens[:k]], 1, SamplingParams(0.0, max_new_tokens=MAX_NEW - k),
                                                     seeds([prompt]))
        assert tokens[k:] == rest.response_ids[0, : int(rest.lengths[0])].tolist()
        assert bool(batch.eos[row]) == (tokens[-1] == EOS) and (batch.eos[row] or length == MAX_NEW)
    assert interrupted > 0, "no sample outlived the interrupt"
    # the log-probs of each token are those of the weights that sampled it
    old_lp, new_lp = recomputed_logprobs(old, batch, 1.0), recomputed_logprobs(new, batch, 1.0)
    expected = torch.where(batch.versions == 0, old_lp, new_lp) * batch.response_mask
    torch.testing.assert_close(batch.logprobs, expected, atol=1e-4, rtol=0)


def test_streaming_reports_each_group_once_across_an_interrupt_and_can_stop():
    old, new = models()
    partial, _ = interrupted_at(old, new, at=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
    seen = []

    def on_groups_done(groups, rows):
        assert rows.size == 3 * len(groups) and rows.group_ids.tolist() == [g for g in groups for _ in range(3)]
        seen.extend(groups)
        return False

    result = partial.generate_stream(PROMPTS, 3, params, seeds(PROMPTS, 1), on_groups_done)
    assert sorted(seen) == list(range(len(PROMPTS))) and result.completed == seen and result.aborted == []
    assert result.batch.size == 12 and set(result.batch.versions[result.batch.response_mask.bool()].tolist()) <= {0, 1}
    # a callback that stops at the first report aborts the rest, with their tokens so far counted
    partial, _ = interrupted_at(old, new, at=2)
    result = partial.generate_stream(PROMPTS, 3, params, seeds(PROMPTS, 1), lambda groups, rows: True)
    assert result.stopped and len(result.completed) >= 1 and len(result.aborted) == len(PROMPTS) - len(result.completed)
    assert len(result.aborted_lengths) == 3 * len(result.aborted) and all(0 < k <= MAX_NEW for k in result.aborted_lengths)
