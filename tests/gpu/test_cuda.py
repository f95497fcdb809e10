"""The same code on a CUDA device: lean decoder vs transformers, fast (CUDA graphs and eager)
vs HF rollouts, training runs (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.models.decoder import LeanDecoder
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.trainer.logprobs import compute_logprobs, response_hidden
from reasonrl.types import SamplingParams
from tests.conftest import tiny_run
from tests.unit.test_decoder import FAMILIES, build, grouped_rollout, hf_response_logits
from tests.unit.test_rollout_hf import seeds

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def on_cuda(rollout):
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "eos", "truncated", "group_ids"):
        setattr(rollout, name, getattr(rollout, name).cuda())
    return rollout


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_decoder_matches_transformers_on_cuda(family):
    model = build(family).cuda().eval()
    rollout = on_cuda(grouped_rollout())
    mask = rollout.response_mask.bool()
    hidden, T = response_hidden(LeanDecoder(model), rollout, torch.arange(8, device="cuda"))
    ours = torch.nn.functional.linear(hidden, model.lm_head.weight, model.lm_head.bias)
    theirs = hf_response_logits(model, rollout)[:, :T]
    torch.testing.assert_close(ours[mask[:, :T]], theirs[mask[:, :T]], atol=1e-4, rtol=1e-4)
    logprobs = compute_logprobs(model, rollout, temperature=1.0, micro_batch_size=3, micro_batch_tokens=24)
    expected = theirs.float().log_softmax(-1).gather(-1, rollout.response_ids[:, :T, None]).squeeze(-1)
    torch.testing.assert_close(logprobs[:, :T][mask[:, :T]], expected[mask[:, :T]], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_rollouts_match_hf_on_cuda(family):
    model = build(family).cuda().eval()
    prompts = [[3, 9, 14], [7, 2, 30, 4, 5], [22, 8], [11, 12, 13, 17, 19, 23]]
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    hf = HFGenerator(model, 0, 1).generate(prompts, 2, params, seeds(prompts))
    for static_shapes in (None, False):  # a CUDA graph per step (the default on CUDA); eager, compacting
        fast = FastGenerator(model, 0, 1, static_shapes).generate(prompts, 2, params, seeds(prompts))
        assert fast.response_ids.is_cuda
        assert torch.equal(fast.response_ids, hf.response_ids), static_shapes
        torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-4, rtol=0)
    # Sampling on the GPU with a CPU generator, through graphs: reproducible, and the
    # sampling log-probs are the model's (a stale or mis-fed graph would break this).
    sampling = SamplingParams(temperature=0.8, max_new_tokens=10)
    sampled = [
        FastGenerator(model, 0, 1).generate(prompts, 4, sampling, seeds(prompts, 3)) for _ in range(2)
    ]
    assert torch.equal(sampled[0].response_ids, sampled[1].response_ids)
    rollout = sampled[0]
    T = rollout.response_ids.shape[1]
    with torch.no_grad():
        logits = hf_response_logits(model, rollout)[:, :T].float() / sampling.temperature
    expected = logits.log_softmax(-1).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    mask = rollout.response_mask.bool()
    torch.testing.assert_close(rollout.logprobs[mask], expected[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("recipe", ["dapo", "grpo", "ppo"])  # dynamic sampling; KL to a reference; critic + GAE
def test_training_runs_on_cuda(recipe, model_dir, tmp_path):
    trainer = Controller.from_config(load(f"recipes/{recipe}.yaml", [*tiny_run(model_dir, tmp_path, steps=3), "rollout.max_new_tokens=12", "run.device=cuda"]))
    assert next(trainer.policy.workers[0].module.parameters()).is_cuda
    trainer.run()
    rows = [line for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line]
    assert len(rows) >= 3


@pytest.mark.parametrize("static", [True, False])
def test_bf16_mixed_on_cuda(model_dir, tmp_path, static):
    """The same bf16 autocast regions on CUDA: lean logits as transformers rounds them, CUDA-graph
    and eager rollouts, and a training step with fp32 master weights and the mismatch logged."""
    from reasonrl.precision import compute_context

    model = build("qwen2").cuda().eval()
    rollout = on_cuda(grouped_rollout())
    mask = rollout.response_mask.bool()
    with torch.no_grad(), compute_context("bf16-mixed", "cuda"):
        hidden, T = response_hidden(LeanDecoder(model), rollout, torch.arange(8, device="cuda"))
        ours = torch.nn.functional.linear(hidden, model.lm_head.weight, model.lm_head.bias).float()
        theirs = hf_response_logits(model, rollout)[:, :T].float()
        m = mask[:, :T]
        assert float((ours - theirs)[m].abs().max()) <= 0.02 * float(theirs.abs().max())
        params = SamplingParams(temperature=0.0, max_new_tokens=6)
        out = FastGenerator(model, 0, 1, None if static else False).generate([[3, 9, 14], [7, 2, 30, 4, 5]], 1, params,
                                                                             seeds([0, 1]))
    assert out.logprobs.dtype == torch.float32 and bool(out.response_mask.any())
    trainer = Controller.from_config(load("recipes/grpo.yaml", [*tiny_run(model_dir, tmp_path, steps=1), "run.device=cuda",
                                                    "train.precision=bf16-mixed"]))
    metrics = trainer.step()
    assert next(trainer.policy.workers[0].module.parameters()).dtype == torch.float32
    assert metrics["rollout/logprob_diff_mean"] > 0 and metrics["perf/max_memory_gb"] > 0
