"""HFGenerator on a tiny random Qwen2: shapes, masks, log-probs, seeding, greedy, EOS flags.

The helpers at the top (``tiny_qwen2``, ``recompute_logits``, ``PROMPTS``...) are shared
with ``test_rollout_fast.py``.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from reasonrl.rollout.hf import HFGenerator, pad_prompts
from reasonrl.rollout.seeds import group_seed
from reasonrl.types import RolloutBatch, SamplingParams

PAD, EOS, TRIGGER = 0, 1, 5
# Different lengths; the second prompt ends with TRIGGER, so with a trigger bias its
# greedy response is EOS at once.
PROMPTS = [[3, 9, 14], [7, 2, 30, 41, TRIGGER], [22, 8], [11, 12, 13, 17, 19, 23]]


def seeds(prompts: list, run: int = 0) -> list[int]:
    """One group seed per prompt: ``group_seed(run, i)`` for prompt ``i``, as a run seeded
    ``run`` draws them."""
    return [group_seed(run, i) for i in range(len(prompts))]


def tiny_qwen2(seed: int = 0, eos_bias: float = 0.0, trigger_bias: float = 0.0, attention: str = "sdpa"):
    """A ~100k-parameter random Qwen2 (weights drawn wider than the default so that greedy
    paths vary instead of repeating the last token) whose EOS logit gets ``eos_bias`` everywhere, plus
    about ``trigger_bias`` at positions whose input token is ``TRIGGER``.

    Both live in the weights, so every implementation of the forward pass sees them: the
    EOS bias is an LM-head bias; the trigger uses a residual dimension ``j`` that only
    ``TRIGGER``'s embedding writes (100, while no layer writes to it), so at a trigger
    position the final norm makes ``h_j ~ sqrt(hidden)`` and the EOS row of the LM head reads it.
    ``attention`` is the ``transformers`` attention implementation.
    """
    torch.manual_seed(seed)
    hidden = 64
    config = transformers.Qwen2Config(
        vocab_size=48,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        initializer_range=0.2,
        attn_implementation=attention,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        bias = torch.zeros(config.vocab_size)
        bias[EOS] = eos_bias
        model.lm_head.bias = torch.nn.Parameter(bias)
        if trigger_bias:
            j = hidden - 1
            model.model.embed_tokens.weight[:, j] = 0.0
            model.model.embed_tokens.weight[TRIGGER, j] = 100.0
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight[j] = 0.0
                layer.mlp.down_proj.weight[j] = 0.0
            model.lm_head.weight[:, j] = 0.0
            model.lm_head.weight[EOS, j] = trigger_bias / hidden**0.5
    return model


def recompute_logits(model, batch: RolloutBatch) -> torch.Tensor:
    """[B, T, V] float logits predicting each response token, from one full forward pass."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask.long()], 1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits.float()
    P, T = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    return logits[:, P - 1 : P - 1 + T]


def recomputed_logprobs(model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """[B, T] log-probs of the response tokens at ``temperature``, 0 on padding."""
    logp = torch.log_softmax(recompute_logits(model, batch) / temperature, -1)
    return logp.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * batch.response_mask


def check_contract(batch: RolloutBatch, prompts: list[list[int]], n: int, max_new_tokens: int) -> None:
    """Every shape, mask and flag rule of the RolloutBatch contract."""
    B, P = len(prompts) * n, max(len(p) for p in prompts)
    T = batch.response_ids.shape[1]
    assert batch.prompt_ids.shape == batch.prompt_mask.shape == (B, P)
    assert batch.response_mask.shape == batch.logprobs.shape == (B, T)
    assert batch.eos.shape == batch.truncated.shape == batch.group_ids.shape == (B,)
    assert batch.response_mask.dtype == batch.logprobs.dtype == torch.float32
    assert batch.eos.dtype == batch.truncated.dtype == torch.bool
    assert batch.group_ids.tolist() == [i // n for i in range(B)]
    for row in range(B):
        prompt = prompts[row // n]
        assert batch.prompt_ids[row, P - len(prompt) :].tolist() == prompt
        assert batch.prompt_ids[row, : P - len(prompt)].eq(PAD).all()
        assert batch.prompt_mask[row].tolist() == [0] * (P - len(prompt)) + [1] * len(prompt)
        length = int(batch.lengths[row])
        assert batch.response_mask[row].tolist() == [1.0] * length + [0.0] * (T - length)
        assert batch.response_ids[row, length:].eq(PAD).all()
        assert batch.logprobs[row, length:].eq(0).all()
        assert (batch.logprobs[row, :length] <= 0).all()
        tokens = batch.response_ids[row, :length].tolist()
        if batch.eos[row]:
            assert tokens[-1] == EOS and EOS not in tokens[:-1]
        else:
            assert EOS not in tokens and length == max_new_tokens
    assert torch.equal(batch.truncated, ~batch.eos)
    assert T == int(batch.lengths.max())


def test_pad_prompts_repeats_and_left_pads():
    ids, mask = pad_prompts([[5, 6], [7]], 2, PAD)
    assert ids.tolist() == [[5, 6], [5, 6], [PAD, 7], [PAD, 7]]
    assert mask.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    with pytest.raises(ValueError, match="n:"):
        pad_prompts([[5]], 0, PAD)


def test_shapes_masks_and_flags():
    model = tiny_qwen2(eos_bias=2.5)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    batch = HFGenerator(model, PAD, EOS).generate(PROMPTS, 4, params, seeds(PROMPTS))
    check_contract(batch, PROMPTS, 4, 8)
    assert batch.eos.any() and batch.truncated.any()
    assert len(set(batch.lengths.tolist())) > 2


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=10, max_new_tokens=10),
    ],
)
def test_logprobs_match_full_forward(params):
    model = tiny_qwen2(eos_bias=1.5)
    batch = HFGenerator(model, PAD, EOS).generate(PROMPTS, 3, params, seeds(PROMPTS, 1))
    expected = recomputed_logprobs(model, batch, params.temperature)
    torch.testing.assert_close(batch.logprobs, expected, atol=1e-5, rtol=0)


def test_greedy_is_argmax_with_eos_and_truncated_rows():
    model = tiny_qwen2(trigger_bias=30.0)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    batch = HFGenerator(model, PAD, EOS).generate(PROMPTS, 2, params, seeds(PROMPTS))
    check_contract(batch, PROMPTS, 2, 12)
    assert batch.eos.any() and batch.truncated.any()
    logits = recompute_logits(model, batch)
    mask = batch.response_mask.bool()
    assert torch.equal(logits.argmax(-1)[mask], batch.response_ids[mask])
    torch.testing.assert_close(batch.logprobs, recomputed_logprobs(model, batch, 1.0), atol=1e-5, rtol=0)
    # Greedy rows of the same prompt are identical.
    assert torch.equal(batch.response_ids[0::2], batch.response_ids[1::2])


def test_top_k_respected():
    model = tiny_qwen2()
    params = SamplingParams(temperature=1.5, top_k=3, max_new_tokens=6)
    batch = HFGenerator(model, PAD, EOS).generate(PROMPTS, 8, params, seeds(PROMPTS, 2))
    top3 = recompute_logits(model, batch).topk(3, -1).indices
    chosen = (top3 == batch.response_ids.unsqueeze(-1)).any(-1)
    assert chosen[batch.response_mask.bool()].all()


def test_checkpoint_generation_config_is_overridden():
    model = tiny_qwen2()
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    model.generation_config.min_new_tokens = 4
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    batch = HFGenerator(model, PAD, EOS).generate(PROMPTS, 1, params, seeds(PROMPTS))
    mask = batch.response_mask.bool()
    assert torch.equal(recompute_logits(model, batch).argmax(-1)[mask], batch.response_ids[mask])
