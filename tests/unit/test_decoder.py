"""LeanDecoder computes the transformers forward: logits, gradients and incremental decoding.

Each supported family is checked on a random model with its distinguishing parts: Qwen2
(q/k/v biases, grouped-query attention), Llama (multi-head, with and without attention
biases incl. the output projection), Qwen3 (per-head q/k RMSNorm, explicit head_dim).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from reasonrl.models.decoder import LeanDecoder, unsupported_reason
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.trainer.logprobs import compute_logprobs, micro_batches, policy_logprobs, response_hidden, shared_prefix_inputs
from reasonrl.types import SamplingParams
from tests.conftest import synthetic_rollout
from tests.unit.test_rollout_hf import seeds

COMMON = dict(vocab_size=32, hidden_size=32, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=64,
              initializer_range=0.2, pad_token_id=0, eos_token_id=1)


def build(family: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "qwen2":
        config = transformers.Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, **COMMON)
        return transformers.Qwen2ForCausalLM(config)
    if family == "llama":
        config = transformers.LlamaConfig(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False, **COMMON)
        return transformers.LlamaForCausalLM(config)
    if family == "llama-bias":
        config = transformers.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                          rope_theta=500.0, **COMMON)
        model = transformers.LlamaForCausalLM(config)
        with torch.no_grad():  # biases start at 0: make them matter
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.5)
        return model
    if family == "qwen3":
        config = transformers.Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **COMMON)
        model = transformers.Qwen3ForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
        return model
    raise ValueError(family)


FAMILIES = ["qwen2", "llama", "llama-bias", "qwen3"]


def grouped_rollout():
    """synthetic_rollout(B=8) whose rows 0-2 share row 0's prompt and rows 4-7 row 4's."""
    rollout = synthetic_rollout(B=8)
    for src, dst in ((0, [1, 2]), (4, [5, 6, 7])):
        rollout.prompt_ids[dst] = rollout.prompt_ids[src].clone()
        rollout.prompt_mask[dst] = rollout.prompt_mask[src].clone()
    return rollout


def hf_response_logits(model, rollout):
    """[B, T, V] logits predicting each response token, from the transformers forward."""
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.response_mask.long()], 1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    return logits[:, P - 1 : P - 1 + T]


@pytest.mark.parametrize("family, lora", [*((f, False) for f in FAMILIES), ("qwen2", True), ("llama-bias", True)])
def test_logits_and_gradients_match_transformers(family, lora):
    """With LoRA: the fused W + (alpha / r) B A gives peft's forward and the adapters' gradients;
    the frozen base gets none."""
    model = (with_lora(build(family)) if lora else build(family)).eval()
    assert unsupported_reason(model) is None
    rollout = grouped_rollout()
    mask = rollout.response_mask.bool()
    hidden, T = response_hidden(LeanDecoder(model), rollout, torch.arange(8))
    ours = torch.nn.functional.linear(hidden, model.lm_head.weight, model.lm_head.bias)
    theirs = hf_response_logits(model, rollout)[:, :T]
    torch.testing.assert_close(ours[mask[:, :T]], theirs[mask[:, :T]], atol=1e-5, rtol=1e-5)
    if lora:
        moved = (hf_response_logits(build(family).eval(), rollout)[:, :T] - theirs)[mask[:, :T]].abs().max()
        assert moved > 1e-2  # the adapters change the function

    weights = torch.randn(theirs.shape, generator=torch.Generator().manual_seed(1))
    grads = []
    for logits in (ours, theirs):
        model.zero_grad()
        (logits.log_softmax(-1) * weights * mask[:, :T, None]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    trained = {n for n, p in model.named_parameters() if ".lora_" in n or not lora}
    assert set(grads[0]) == set(grads[1]) == trained
    for name, theirs_grad in grads[1].items():  # fp32 rounding, relative to each gradient's scale
        scale = float(theirs_grad.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(grads[0][name], theirs_grad, atol=1e-5 * scale, rtol=0, msg=name)


@pytest.mark.parametrize("family, lora", [*((f, False) for f in FAMILIES), ("qwen2", True)])
def test_greedy_decoding_matches_transformers_generate(family, lora):
    model = (with_lora(build(family)) if lora else build(family)).eval()  # with LoRA: peft's layers in transformers
    prompts = [[3, 9, 14], [7, 2, 30, 4, 5], [22, 8], [11, 12, 13, 17, 19, 23]]
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    hf = HFGenerator(model, 0, 1).generate(prompts, 2, params, seeds(prompts))
    fast = FastGenerator(model, 0, 1).generate(prompts, 2, params, seeds(prompts))
    assert torch.equal(fast.response_ids, hf.response_ids)
    torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-5, rtol=0)


def test_shared_prefix_inputs():
    # Rows 0 and 2 share prompt [5, 6] (left-padded to 3); row 1 has [4, 4, 4].
    from reasonrl.types import RolloutBatch

    rollout = RolloutBatch(
        prompt_ids=torch.tensor([[0, 5, 6], [4, 4, 4], [0, 5, 6]]),
        prompt_mask=torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1]]),
        response_ids=torch.tensor([[7, 8, 1], [9, 0, 0], [1, 0, 0]]),
        response_mask=torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 0, 0]]),
        logprobs=torch.zeros(3, 3),
        eos=torch.tensor([True, False, True]),
        truncated=torch.tensor([False, False, False]),
        group_ids=torch.tensor([0, 1, 0]),
        versions=torch.zeros(3, 3, dtype=torch.long),
    )
    prefix_ids, prefix_len, parent, response_ids, T = shared_prefix_inputs(rollout, torch.tensor([0, 1, 2]))
    distinct = {tuple(prefix_ids[u, : prefix_len[u]].tolist()) for u in range(len(prefix_len))}
    assert distinct == {(5, 6), (4, 4, 4)} and prefix_ids.shape == (2, 3)
    assert parent[0] == parent[2] != parent[1]
    assert prefix_ids[parent[0], :2].tolist() == [5, 6]  # real tokens first
    assert T == 3 and response_ids.tolist() == [[7, 8, 1], [9, 0, 0], [1, 0, 0]]
    assert shared_prefix_inputs(rollout, torch.tensor([1]))[3].tolist() == [[9]]  # trimmed to the longest


def test_micro_batches_by_token_budget():
    rows = torch.arange(6)
    lengths = torch.tensor([10, 3, 7, 3, 12, 5])
    assert [m.tolist() for m in micro_batches(rows, lengths, 4, 0)] == [[0, 1, 2, 3], [4, 5]]
    # Sorted by length: 1(3) 3(3) 5(5) 2(7) 0(10) 4(12); budget 15: [1, 3, 5] = 3 x 5,
    # then 2 x 7 = 14, then 0 alone (2 x 12 > 15), then 4 alone.
    assert [m.tolist() for m in micro_batches(rows, lengths, 4, 15)] == [[1, 3, 5], [2], [0], [4]]
    # A row longer than the budget still goes, alone.
    assert [m.tolist() for m in micro_batches(rows[:2], lengths, 4, 4)] == [[1], [0]]
    assert micro_batches(rows[:0], lengths, 4, 0) == [] and micro_batches(rows[:0], lengths, 4, 15) == []


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_compute_logprobs_same_for_any_micro_batching(family):
    model = build(family)
    rollout = grouped_rollout()
    fixed = compute_logprobs(model, rollout, temperature=0.7, micro_batch_size=3)
    budget = compute_logprobs(model, rollout, temperature=0.7, micro_batch_size=3, micro_batch_tokens=24)
    torch.testing.assert_close(budget, fixed, atol=1e-5, rtol=0)
    logp = hf_response_logits(model, rollout).float().div(0.7).log_softmax(-1)
    expected = logp.gather(-1, rollout.response_ids[..., None]).squeeze(-1) * rollout.response_mask
    torch.testing.assert_close(fixed, expected, atol=1e-5, rtol=0)


def test_other_models_take_the_transformers_path():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    assert "model_type = 'gpt2'" in unsupported_reason(model)
    with pytest.raises(ValueError, match="gpt2"):
        LeanDecoder(model)
    rollout = synthetic_rollout(B=4)
    got = compute_logprobs(model, rollout, temperature=1.0, micro_batch_size=4)
    logp = hf_response_logits(model, rollout).log_softmax(-1)
    expected = logp.gather(-1, rollout.response_ids[..., None]).squeeze(-1) * rollout.response_mask
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_bfloat16_models_stay_close_to_transformers():
    # Norms and softmax run in fp32 as transformers does; the products in bf16.
    model = build("qwen2").to(torch.bfloat16).eval()
    rollout = grouped_rollout()
    mask = rollout.response_mask.bool()
    hidden, T = response_hidden(LeanDecoder(model), rollout, torch.arange(8))
    ours = torch.nn.functional.linear(hidden, model.lm_head.weight, model.lm_head.bias).float()
    theirs = hf_response_logits(model, rollout)[:, :T].float()
    assert (ours - theirs)[mask[:, :T]].abs().max() < 0.1 * theirs.abs().max()
    prompts = [[3, 9, 14], [7, 2, 30, 4, 5]]
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    fast = FastGenerator(model, 0, 1).generate(prompts, 1, params, seeds(prompts))
    hf = HFGenerator(model, 0, 1).generate(prompts, 1, params, seeds(prompts))
    assert fast.logprobs.dtype == torch.float32
    # bf16 rounding may flip a near tie late in a sequence: the first tokens agree.
    assert torch.equal(fast.response_ids[:, :2], hf.response_ids[:, :2])


def with_lora(model: torch.nn.Module, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
              dropout: float = 0.0) -> torch.nn.Module:
    """``model`` with rank-4 LoRA adapters (alpha 8) on ``targets``, B drawn at random (peft
    starts it at 0, where an adapter would change nothing)."""
    from reasonrl.config.schema import LoraConfig
    from reasonrl.models.lora import apply_lora

    apply_lora(model, LoraConfig(rank=4, alpha=8.0, dropout=dropout, target_modules=tuple(targets)), seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_lora_outside_the_fused_projections_or_with_dropout_takes_the_transformers_path():
    head = with_lora(build("qwen2"), targets=("q_proj", "lm_head"))
    assert "a LoRA adapter on lm_head" in unsupported_reason(head)
    rollout = grouped_rollout()
    model = with_lora(build("qwen2"), dropout=0.5)
    assert unsupported_reason(model) is None  # generation (eval mode) fuses the adapters
    model.eval()
    first = compute_logprobs(model, rollout, temperature=1.0, micro_batch_size=8)
    torch.testing.assert_close(compute_logprobs(model, rollout, temperature=1.0, micro_batch_size=8), first)
    model.train()  # a training forward with dropout: the transformers path, other draws each pass
    torch.manual_seed(0)
    rows = torch.arange(8)
    a, _, T = policy_logprobs(model, rollout, rows, 1.0, with_entropy=False)
    b, _, _ = policy_logprobs(model, rollout, rows, 1.0, with_entropy=False)
    mask = rollout.response_mask[:, :T].bool()
    assert not torch.equal(a[mask], b[mask]) and not torch.equal(a[mask], first[:, :T][mask])
    model.eval()  # without dropout the same call takes the fused path again
    c, _, _ = policy_logprobs(model, rollout, rows, 1.0, with_entropy=False)
    torch.testing.assert_close(c.detach() * mask, first[:, :T], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_chunked_head_scores_as_the_full_logits_with_the_same_gradients(family):
    """train.lm_head_chunk narrower than the vocabulary (32): log-probs, entropy and every
    parameter's gradient (tied embeddings included) as with the full logits."""
    rollout, rows = grouped_rollout(), torch.arange(8)
    grads, outs = [], []
    for chunk in (0, 7):
        model = build(family)
        logprobs, entropy, T = policy_logprobs(model, rollout, rows, 0.7, with_entropy=True, head_chunk=chunk)
        mask = rollout.response_mask[:, :T]
        ((logprobs * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
        outs.append((logprobs * mask, entropy * mask))
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert grads[1].keys() == grads[0].keys()
    for name, g in grads[0].items():
        # float sums in another order: 1e-5 of the gradient's scale (tied embeddings reach 20)
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-5 * float(g.abs().max()), msg=name)
    assert compute_logprobs(build(family), rollout, 0.7, 8, head_chunk=7).shape == rollout.response_mask.shape
