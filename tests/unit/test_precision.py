"""train.precision=bf16-mixed and train.grad_checkpointing: what runs in which dtype, what
gradients result, and the sampler/trainer gap they leave."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from reasonrl.algo import logprob_mismatch
from reasonrl.models.decoder import LeanDecoder
from reasonrl.precision import compute_context, enable_checkpointing
from reasonrl.rollout.fast import FastGenerator
from reasonrl.trainer.logprobs import policy_logprobs, response_hidden
from reasonrl.trainer.update import sampler_gap
from reasonrl.types import SamplingParams
from tests.unit.test_decoder import FAMILIES, build, grouped_rollout, hf_response_logits
from tests.unit.test_rollout_hf import seeds


def lean_logits(model, rollout):
    hidden, T = response_hidden(LeanDecoder(model), rollout, torch.arange(rollout.size))
    return torch.nn.functional.linear(hidden, model.lm_head.weight, model.lm_head.bias), T


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_mixed_runs_the_products_in_bf16_like_transformers_under_autocast(family):
    model = build(family).eval()
    rollout = grouped_rollout()
    mask = rollout.response_mask.bool()
    fp32, T = lean_logits(model, rollout)
    with compute_context("bf16-mixed", "cpu"):
        ours, _ = lean_logits(model, rollout)
        theirs = hf_response_logits(model, rollout)[:, :T]
    m = mask[:, :T]
    assert ours.dtype == theirs.dtype == torch.bfloat16
    scale = float(fp32.detach().abs().max())
    assert float((ours.float() - fp32).detach()[m].abs().max()) > 1e-4 * scale  # rounded: the products ran in bf16
    assert float((ours.float() - theirs.float()).detach()[m].abs().max()) <= 0.02 * scale  # and as transformers rounds them
    # gradients reach the fp32 parameters through the casts, as fp32
    ours.float().log_softmax(-1)[m].sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


def test_bf16_mixed_generation_keeps_the_residual_stream_in_fp32():
    model = build("qwen2").eval()
    prompts = [[3, 9, 14], [7, 2, 30, 4, 5]]
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    with torch.no_grad():
        fp32 = FastGenerator(model, 0, 1).generate(prompts, 1, params, seeds(prompts))
        with compute_context("bf16-mixed", "cpu"):
            mixed = FastGenerator(model, 0, 1).generate(prompts, 1, params, seeds(prompts))
    assert mixed.logprobs.dtype == torch.float32
    assert torch.equal(mixed.response_ids[:, :2], fp32.response_ids[:, :2])
    gap = (mixed.logprobs - fp32.logprobs)[:, :2].abs().max()
    assert 0 < gap < 0.1


def test_bf16_mixed_keeps_fp32_master_weights_so_a_tiny_step_is_not_rounded_away(model_dir, tmp_path):
    from reasonrl.config import load
    from reasonrl.controller import Controller
    from tests.conftest import tiny_run

    def one_step(*extra):
        trainer = Controller.from_config(load(None, tiny_run(model_dir, tmp_path / "-".join(extra), steps=1) + ["train.lr=1e-5", *extra]))
        [policy] = trainer.policy.workers
        before = {n: p.detach().clone() for n, p in policy.module.named_parameters()}
        metrics = trainer.step()
        return policy, before, metrics

    policy, before, metrics = one_step("train.precision=bf16-mixed")
    assert all(p.dtype == torch.float32 for p in policy.module.parameters())
    states = [s for s in policy.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    w0, w1 = before["model.layers.0.mlp.up_proj.weight"], policy.module.model.layers[0].mlp.up_proj.weight.detach()
    moved = w1 != w0
    assert float(moved.float().mean()) > 0.9  # AdamW moved nearly every weight by about lr = 1e-5
    lost = (w1.bfloat16() == w0.bfloat16()) & moved
    assert float(lost.float().mean()) > 0.5  # most of those steps are below half a bf16 spacing of the weight
    # the sampler ran other numerics: auto recomputed the old log-probs and logged the gap
    assert metrics["timing_s/old_log_prob"] > 0
    assert 0 < metrics["rollout/logprob_diff_mean"] <= metrics["rollout/logprob_diff_max"] < 1
    assert metrics["rollout/logprob_kl"] >= 0
    assert metrics["perf/max_memory_gb"] > 0.1

    policy, before, _ = one_step("model.dtype=bfloat16")  # pure bf16 parameters lose the same steps
    w0, w1 = before["model.layers.0.mlp.up_proj.weight"], policy.module.model.layers[0].mlp.up_proj.weight.detach()
    assert w1.dtype == torch.bfloat16 and float((w1 != w0).float().mean()) < 0.5


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn`` runs."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gpt2"])
def test_grad_checkpointing_gives_the_same_gradients_and_keeps_less(family):
    if family == "gpt2":  # the transformers path
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=32, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    else:
        model = build(family)
    model.train()
    model.config.attn_pdrop = model.config.resid_pdrop = model.config.embd_pdrop = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    rollout = grouped_rollout()
    results = []
    for checkpointing in (False, True):
        if checkpointing:
            enable_checkpointing(model)
        model.zero_grad()
        (logprobs, entropy, T), saved = saved_bytes(
            lambda: policy_logprobs(model, rollout, torch.arange(rollout.size), 1.0, with_entropy=True)
        )
        loss = -(logprobs * rollout.response_mask[:, :T]).sum() - 0.1 * entropy.sum()
        loss.backward()
        results.append((saved, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain_saved, plain), (ckpt_saved, ckpt) = results
    assert ckpt_saved < plain_saved
    assert plain.keys() == ckpt.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(ckpt[name], grad, atol=1e-6 * float(grad.abs().max()) + 1e-12, rtol=0, msg=name)


def test_logprob_mismatch_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, 0.0]])
    sampler = torch.tensor([[-1.1, -1.8, -9.0], [-0.3, -4.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    m = logprob_mismatch(trainer, sampler, mask)
    d = [0.1, -0.2, 0.0]  # trainer - sampler on the three valid tokens
    assert m["logprob_diff_mean"].item() == pytest.approx(0.1, abs=1e-6)
    assert m["logprob_diff_max"].item() == pytest.approx(0.2, abs=1e-6)
    assert m["logprob_kl"].item() == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 3, abs=1e-7)
    assert all(v.item() == 0 for v in logprob_mismatch(trainer, sampler, torch.zeros_like(mask)).values())


def test_sampler_gap_counts_only_tokens_the_trainers_version_sampled():
    rollout = grouped_rollout()
    trainer = torch.zeros_like(rollout.response_mask)
    sampler = trainer.clone()
    rollout.versions[:4] = 3  # rows 0-3: sampled by version 3, with a gap of 0.5
    sampler[:4] = -0.5 * rollout.response_mask[:4]
    sampler[4:] = -2.0 * rollout.response_mask[4:]  # version 0 rows: stale, not a numerics gap
    gap = sampler_gap(trainer, sampler, rollout, version=3)
    assert gap["rollout/logprob_diff_mean"] == pytest.approx(0.5) and gap["rollout/logprob_diff_max"] == pytest.approx(0.5)
    assert sampler_gap(trainer, sampler, rollout, version=7) == {}
