"""The memory estimate of a step (reasonrl.memory) and the measured peak of one."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from reasonrl.config import load
from reasonrl.errors import LimitError
from reasonrl.memory import GB, ModelShape, PeakMemory, activation_bytes_per_token_layer, check_fits, estimate_memory
from tests.unit.test_decoder import FAMILIES, build


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_from_the_config_alone(family):
    model = build(family)
    assert ModelShape.from_config(model.config.to_dict()).parameters() == sum(p.numel() for p in model.parameters())


SHAPE = ModelShape(vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, tied=True)


def test_estimate_parts_by_hand():
    cfg = load(None, ["data.max_prompt_len=32", "rollout.max_new_tokens=32", "rollout.n=4", "train.prompts_per_step=8",
                      "train.mini_batch_size=32", "train.micro_batch_size=8", "train.micro_batch_tokens=0",
                      "algo.kl_loss_coef=0", "algo.dynamic_sampling=false", "runtime.roles.rollout.colocate=policy"])
    N = SHAPE.parameters()
    assert N == 1000 * 64 + 2 * (64 * 8 * 16 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    e = estimate_memory(cfg, SHAPE, prompt_len=16)
    context = 16 + 32
    assert e.tokens_per_micro_batch == 8 * context
    assert e.parts["weights"] == 4 * N and e.parts["gradients+AdamW"] == 12 * N and e.parts["bf16 copies"] == 0
    assert e.parts["generation"] == 32 * context * 2 * 2 * 2 * 16 * 4 + 32 * 1000 * 12
    a = 2 * 64 * 4 + (2 * 64 + 64 + 128) * 4 + (8 * 16 + 64) * 4 + 2 * 6 * 16 * 4 + 3 * 128 * 4
    assert activation_bytes_per_token_layer(SHAPE, 4, 4) == a
    assert e.parts["activations"] == 8 * context * 2 * a
    head_grads = 2 * 1000 * 64 * 4  # the head's and the embedding's gradients, each [V, d] in fp32
    assert e.parts["LM head"] == 8 * 32 * 1000 * 22 + head_grads  # 8 rows x 32 response tokens
    fixed = 16 * N + e.parts["runtime"]
    assert e.peak == fixed + max(e.parts["activations"] + e.parts["LM head"], e.parts["generation"])

    def with_train(**changes):
        return estimate_memory(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes)), SHAPE, 16)

    mixed = with_train(precision="bf16-mixed")
    assert mixed.parts["bf16 copies"] == 2 * N and mixed.parts["weights"] == 4 * N
    assert e.parts["kernel cache"] == 0 and mixed.parts["kernel cache"] == int(0.85 * GB)  # oneDNN's, on a CPU
    assert mixed.parts["activations"] < e.parts["activations"]
    chunked = with_train(lm_head_chunk=100)  # one chunk of 100 of the 1000 columns at a time
    assert chunked.parts["LM head"] == 8 * 32 * 100 * 22 + head_grads and with_train(lm_head_chunk=0).parts["LM head"] == e.parts["LM head"]
    generic = dataclasses.replace(SHAPE, lean=False)  # transformers scores it: the full logits whatever the chunk
    assert estimate_memory(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lm_head_chunk=100)), generic,
                           16).parts["LM head"] == e.parts["LM head"]
    ckpt = with_train(grad_checkpointing=True)
    assert ckpt.parts["activations"] == 8 * context * (2 * 64 * 4 + a) < e.parts["activations"]
    kl = estimate_memory(dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, kl_loss_coef=0.1)), SHAPE, 16)
    assert kl.parts["weights"] == 8 * N  # the reference
    # two rollout workers with weights of their own: each adds its weights, the runtime and half the generation
    roles = dataclasses.replace(cfg.runtime.roles, rollout=dataclasses.replace(cfg.runtime.roles.rollout, colocate="none",
                                                                               count=2))
    own = estimate_memory(dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, roles=roles)), SHAPE, 16)
    half = math.ceil(e.parts["generation"] / 2)
    assert own.parts["generation"] == half and own.parts["rollout workers"] == 2 * (4 * N + e.parts["runtime"])
    assert own.peak == fixed + e.parts["activations"] + e.parts["LM head"] + 2 * (4 * N + half + e.parts["runtime"])
    assert e.parts["weight sync"] == own.parts["weight sync"] == mixed.parts["weight sync"] == 0  # fp32 ships whole
    own_mixed = estimate_memory(dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, roles=roles),
                                                    train=dataclasses.replace(cfg.train, precision="bf16-mixed")), SHAPE, 16)
    assert own_mixed.parts["weight sync"] == 2 * N  # the bf16 version last shipped, the next delta's base


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_lora_parameter_counts_are_peft_s(family):
    from reasonrl.config.schema import LoraConfig
    from reasonrl.models.lora import apply_lora

    model = build(family)
    shape = ModelShape.from_config(model.config.to_dict())
    targets = ("q_proj", "v_proj", "down_proj")
    apply_lora(model, LoraConfig(rank=3, target_modules=targets), seed=0)
    adapters = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    adapted = sum(p.numel() for n, p in model.named_parameters() if n.endswith("base_layer.weight"))
    assert shape.lora_parameters(3, targets) == (adapters, adapted)


def test_a_lora_policy_counts_its_adapters_and_trains_only_them():
    from reasonrl.config.schema import LoraConfig

    cfg = load(None, ["data.max_prompt_len=32", "rollout.max_new_tokens=32", "rollout.n=4", "train.prompts_per_step=8",
                      "train.mini_batch_size=32", "train.micro_batch_size=8", "train.micro_batch_tokens=0",
                      "algo.kl_loss_coef=0", "algo.dynamic_sampling=false", "runtime.roles.rollout.colocate=none",
                      "model.lora.rank=4"])
    N = SHAPE.parameters()
    # per layer: q 64 -> 64, k and v 64 -> 32, o 64 -> 64, gate and up 64 -> 128, down 128 -> 64
    A = 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    P = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)
    assert SHAPE.lora_parameters(4, cfg.model.lora.target_modules) == (A, P)
    lora = estimate_memory(cfg, SHAPE, 16)
    full = estimate_memory(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=LoraConfig())), SHAPE, 16)
    assert lora.parts["gradients+AdamW"] == 12 * A and full.parts["gradients+AdamW"] == 12 * N
    assert lora.parts["LoRA adapters+merged"] == 4 * (A + P) and full.parts["LoRA adapters+merged"] == 0
    assert lora.parts["weights"] == full.parts["weights"] == 4 * N
    assert lora.parts["rollout workers"] == full.parts["rollout workers"] + 4 * A  # the worker's own adapters (fast)
    assert full.parts["LM head"] - lora.parts["LM head"] == 2 * 1000 * 64 * 4  # a frozen head and embedding: no gradients
    assert lora.peak - full.peak == 12 * A - 12 * N + 4 * (A + P) + 4 * A - 2 * 1000 * 64 * 4


def test_a_step_that_cannot_fit_is_an_error_naming_what_to_change():
    cfg = load(None, ["train.prompts_per_step=100000", "train.mini_batch_size=800000", "rollout.n=8"])
    big = ModelShape(vocab=150000, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=11008, tied=False)
    estimate = estimate_memory(cfg, big)
    assert estimate.peak > 1000 * GB
    with pytest.raises(LimitError, match=r"train.grad_checkpointing=true .*train.memory_check=false"):
        check_fits(cfg, estimate)
    check_fits(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, memory_check=False)), estimate)
    check_fits(cfg, estimate_memory(load(None, []), SHAPE))  # the default fits


def test_peak_memory_of_a_span_resets():
    peak = PeakMemory("cpu")
    peak.reset()
    base = peak.peak_gb()
    block = torch.ones(64 * 1024 * 1024)  # 256 MiB, touched
    high = peak.peak_gb()
    assert high - base > 0.2
    del block
    peak.reset()
    if not peak.resets:
        pytest.skip("/proc/self/clear_refs is not writable here: the lifetime peak is reported")
    assert peak.peak_gb() < high - 0.2
