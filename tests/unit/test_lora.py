"""LoRA adapters (reasonrl/models/lora.py) and the policy worker that trains them: what is
frozen and trained, the merged weights, adapter loading, the published versions."""

from __future__ import annotations

import pytest
import torch

from reasonrl.config import load
from reasonrl.config.schema import LoraConfig
from reasonrl.errors import InputError
from reasonrl.models.loading import load_model
from reasonrl.models.lora import adapter_tensors, apply_lora, load_adapters, merged_tensors
from reasonrl.rollout.base import copy_weights
from reasonrl.workers.policy import PolicyWorker
from reasonrl.workers.rollout import RolloutWorker
from tests.conftest import tiny_run


def lora_model(model_dir, rank=4, alpha=8.0, targets=("q_proj", "down_proj")):
    model = apply_lora(load_model(model_dir), LoraConfig(rank=rank, alpha=alpha, target_modules=targets), seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_only_the_adapters_train_and_the_merged_weight_is_w_plus_scaled_ba(model_dir):
    model = lora_model(model_dir)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == set(adapter_tensors(model)) and trained
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in trained)
    assert {n.split(".")[-4] for n in trained} == {"q_proj", "down_proj"}
    merged = merged_tensors(model)
    plain = load_model(model_dir)
    assert merged.keys() == dict(plain.named_parameters()).keys()
    layer = model.model.layers[1].self_attn.q_proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = layer.base_layer.weight + (8.0 / 4) * b @ a  # alpha / r = 2
    torch.testing.assert_close(merged["model.layers.1.self_attn.q_proj.weight"], expected, atol=1e-6, rtol=0)
    assert torch.equal(merged["model.layers.1.self_attn.k_proj.weight"], plain.model.layers[1].self_attn.k_proj.weight)
    copy_weights(plain, merged)
    ids = torch.tensor([[5, 9, 12, 7, 3]])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_adapters_start_from_the_seed_with_b_zero_and_leave_the_global_rng_alone(model_dir):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    one = apply_lora(load_model(model_dir), LoraConfig(rank=2), seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    two = apply_lora(load_model(model_dir), LoraConfig(rank=2), seed=7)
    other = apply_lora(load_model(model_dir), LoraConfig(rank=2), seed=8)
    a1, a2, a3 = adapter_tensors(one), adapter_tensors(two), adapter_tensors(other)
    assert all(torch.equal(a1[k], a2[k]) for k in a1)
    assert any(not torch.equal(a1[k], a3[k]) for k in a1 if ".lora_A." in k)
    assert all(not a1[k].any() for k in a1 if ".lora_B." in k)


def test_load_adapters_takes_exactly_the_adapters(model_dir):
    source, target = lora_model(model_dir), lora_model(model_dir)
    with torch.no_grad():
        for p in source.parameters():
            if p.requires_grad:
                p.add_(1.0)
    load_adapters(target, adapter_tensors(source))
    assert all(torch.equal(t, adapter_tensors(source)[k]) for k, t in adapter_tensors(target).items())
    tensors = adapter_tensors(source)
    name = next(iter(tensors))
    with pytest.raises(KeyError, match="adapters missing"):
        load_adapters(target, {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(KeyError, match="unknown"):
        load_adapters(target, {**tensors, "model.embed_tokens.weight": torch.zeros(1)})


def test_a_target_that_matches_no_module_names_the_key(model_dir):
    with pytest.raises(InputError, match=r"model.lora.target_modules = \['nope_proj'\]"):
        apply_lora(load_model(model_dir), LoraConfig(rank=2, target_modules=("nope_proj",)), seed=0)


@pytest.mark.parametrize(("backend", "kind"), [("fast", "adapters"), ("hf", "adapters"), ("sim", "merged")])
def test_the_policy_trains_its_adapters_and_publishes_them_or_the_merged_weights(model_dir, tmp_path, backend, kind):
    cfg = load(None, [*tiny_run(model_dir, tmp_path), "model.lora.rank=4", f"rollout.backend={backend}"])
    policy = PolicyWorker(cfg, model_dir)
    optimized = [p for group in policy.optimizer.param_groups for p in group["params"]]
    adapters = [p for n, p in policy.module.named_parameters() if ".lora_" in n]
    assert adapters and [id(p) for p in optimized] == [id(p) for p in adapters]
    state = policy.state_dict()
    assert state["weights"].keys() == adapter_tensors(policy.module).keys()
    update = policy.weights()
    assert update.kind == kind
    if kind == "adapters":
        assert update.tensors.keys() == state["weights"].keys()
    else:
        assert update.tensors.keys() == dict(load_model(model_dir).named_parameters()).keys()


def test_a_rollout_worker_of_its_own_loads_adapter_versions(model_dir, tmp_path):
    cfg = load(None, [*tiny_run(model_dir, tmp_path), "model.lora.rank=4"])
    policy = PolicyWorker(cfg, model_dir)
    with torch.no_grad():
        for p in policy.module.parameters():
            if p.requires_grad:
                p.normal_(0, 0.1)
    worker = RolloutWorker(cfg, model_dir)
    worker.load_weights(policy.weights())
    held = dict(worker.module.named_parameters())
    for name, t in adapter_tensors(policy.module).items():
        assert torch.equal(held[name], t), name
    ids = torch.tensor([[5, 9, 12, 7, 3]])
    with torch.no_grad():
        assert torch.equal(worker.module(input_ids=ids).logits, policy.module(input_ids=ids).logits)
