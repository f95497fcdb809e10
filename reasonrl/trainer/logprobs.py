"""Log-probs of response tokens under a model (shared by policy, old policy and reference).

The model sees ``prompt ++ response`` with position ids counted from the first real prompt
token, exactly the inputs the generator saw, so log-probs recomputed here equal the
sampling log-probs for the same weights.

Two forward paths compute the same function: models that :class:`~reasonrl.models.decoder.LeanDecoder`
supports (Llama, Qwen2, Qwen3) encode each distinct prompt of a micro-batch once (the
``n`` samples of a prompt share it) and run the LM head only where a response token is
predicted, over chunks of ``head_chunk`` vocabulary columns where the vocabulary is wider
(``train.lm_head_chunk``, :mod:`reasonrl.models.lm_head`: no full logits); any other causal
LM, and a LoRA model in a training forward with adapter dropout (``model.lora.dropout > 0``),
runs through its ``transformers`` forward on the rows trimmed to their own longest prompt and
response.

:func:`micro_batches` splits a batch for forward/backward either into fixed-size slices or,
with a token budget, into length-sorted slices whose padded size stays under the budget:
far less padding when response lengths vary.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from reasonrl.algo import entropy_from_logits, token_logprobs
from reasonrl.config import TrainConfig
from reasonrl.models.decoder import LeanDecoder, unsupported_reason
from reasonrl.models.lm_head import chunked_head_logprobs
from reasonrl.models.lora import dropout_active
from reasonrl.types import RolloutBatch


def sequence_inputs(rollout: RolloutBatch, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], int, int]:
    """``transformers`` inputs for ``rows`` trimmed to their padding, plus (prompt length P', response length T')."""
    prompt_mask = rollout.prompt_mask[rows]
    response_mask = rollout.response_mask[rows]
    P = int(prompt_mask.sum(-1).max().item())
    T = max(int(response_mask.sum(-1).max().item()), 1)
    ids = torch.cat([rollout.prompt_ids[rows][:, -P:], rollout.response_ids[rows][:, :T]], dim=1)
    attention = torch.cat([prompt_mask[:, -P:], response_mask[:, :T].long()], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attention, "position_ids": positions}, P, T


def shared_prefix_inputs(rollout: RolloutBatch, rows: torch.Tensor):
    """``(prefix_ids [U, Pm], prefix_len [U], parent [b], response_ids [b, T'], T')`` for
    :meth:`~reasonrl.models.decoder.LeanDecoder.response_hidden`: the distinct prompts among ``rows``
    (real tokens first), the prompt of each row, the responses trimmed to the longest."""
    P = rollout.prompt_ids.shape[1]
    key = torch.cat([rollout.prompt_ids[rows], rollout.prompt_mask[rows].long()], 1)
    distinct, parent = torch.unique(key, dim=0, return_inverse=True)
    ids, real = distinct[:, :P], distinct[:, P:].bool()
    order = torch.sort((~real).to(torch.uint8), dim=1, stable=True).indices
    prefix_len = real.sum(-1)
    prefix_ids = ids.gather(1, order)[:, : int(prefix_len.max())]
    T = max(int(rollout.response_mask[rows].sum(-1).max()), 1)
    return prefix_ids, prefix_len, parent, rollout.response_ids[rows][:, :T], T


def response_hidden(decoder: LeanDecoder, rollout: RolloutBatch, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(final-norm hidden states [b, T', d] at the positions that predict each response token, T')``."""
    prefix_ids, prefix_len, parent, response_ids, T = shared_prefix_inputs(rollout, rows)
    return decoder.final_norm(decoder.response_hidden(prefix_ids, prefix_len, parent, response_ids)), T


def response_logits(model: torch.nn.Module, rollout: RolloutBatch, rows: torch.Tensor, temperature: float) -> tuple[torch.Tensor, int]:
    """``(logits / temperature at the positions that predict each response token [b, T', V], T')``."""
    if lean_scoring(model):
        decoder = LeanDecoder(model)
        hidden, T = response_hidden(decoder, rollout, rows)
        head = model.lm_head
        return F.linear(hidden, head.weight, head.bias).float() / temperature, T
    inputs, P, T = sequence_inputs(rollout, rows)
    logits = model(**inputs, use_cache=False).logits
    return logits[:, P - 1 : P - 1 + T].float() / temperature, T


def lean_scoring(model: torch.nn.Module) -> bool:
    """Whether ``model`` scores through the lean decoder (the module docstring's first path)."""
    return unsupported_reason(model) is None and not dropout_active(model)


def policy_logprobs(
    model: torch.nn.Module, rollout: RolloutBatch, rows: torch.Tensor, temperature: float, with_entropy: bool,
    head_chunk: int = TrainConfig.lm_head_chunk,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """``(logprobs [b, T'], entropy [b, T'] or None, T')`` for ``rows``, with gradients; through
    the chunked head where the lean decoder scores and the vocabulary is wider than
    ``head_chunk`` (> 0)."""
    head = getattr(model, "lm_head", None)
    if 0 < head_chunk < getattr(head, "out_features", 0) and lean_scoring(model):
        hidden, T = response_hidden(LeanDecoder(model), rollout, rows)
        logprobs, entropy = chunked_head_logprobs(hidden, head.weight, head.bias, rollout.response_ids[rows][:, :T],
                                                  temperature, head_chunk, with_entropy)
        return logprobs, entropy, T
    logits, T = response_logits(model, rollout, rows, temperature)
    logprobs = token_logprobs(logits, rollout.response_ids[rows][:, :T])
    return logprobs, entropy_from_logits(logits) if with_entropy else None, T


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int, max_tokens: int) -> list[torch.Tensor]:
    """Split ``rows`` for forward/backward passes.

    ``max_tokens == 0``: consecutive slices of ``size`` rows. Otherwise the rows sorted by
    ``lengths`` (prompt + response tokens), cut greedily so that each slice's padded size,
    ``rows x its longest row``, stays within ``max_tokens`` (a longer row goes alone).
    """
    if rows.numel() == 0:
        return []
    if max_tokens <= 0:
        return list(rows.split(size))
    order = torch.sort(lengths[rows], stable=True)
    out, start = [], 0
    for i, length in enumerate(order.values.tolist()):
        if i > start and (i + 1 - start) * length > max_tokens:
            out.append(rows[order.indices[start:i]])
            start = i
    out.append(rows[order.indices[start:]])
    return out


def sequence_lengths(rollout: RolloutBatch) -> torch.Tensor:
    """Real prompt + response tokens of every row ``[B]``."""
    return rollout.prompt_mask.sum(-1) + rollout.response_mask.sum(-1).long()


@torch.no_grad()
def per_token_scores(
    model: torch.nn.Module,
    rollout: RolloutBatch,
    score: Callable[[torch.Tensor], tuple[torch.Tensor, int]],
    micro_batch_size: int,
    micro_batch_tokens: int = 0,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, T]`` per response token (0 on padding, and on rows other than ``rows`` when given)
    from ``score(rows) -> ([b, T'], T')``, run on :func:`micro_batches` with ``model`` in eval
    mode (its mode restored after), without gradients."""
    was_training = model.training
    model.eval()
    out = torch.zeros_like(rollout.response_mask)
    try:
        if rows is None:
            rows = torch.arange(rollout.size, device=out.device)
        for micro in micro_batches(rows, sequence_lengths(rollout), micro_batch_size, micro_batch_tokens):
            values, T = score(micro)
            out[micro, :T] = values
    finally:
        model.train(was_training)
    return out * rollout.response_mask


def compute_logprobs(
    model: torch.nn.Module,
    rollout: RolloutBatch,
    temperature: float,
    micro_batch_size: int,
    micro_batch_tokens: int = 0,
    rows: torch.Tensor | None = None,
    head_chunk: int = TrainConfig.lm_head_chunk,
) -> torch.Tensor:
    """Log-probs [B, T] of every response token (0 on padding; only ``rows`` when given), in
    micro-batches, without gradients (``head_chunk``: :func:`policy_logprobs`)."""

    def score(rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        logprobs, _, T = policy_logprobs(model, rollout, rows, temperature, with_entropy=False, head_chunk=head_chunk)
        return logprobs, T

    return per_token_scores(model, rollout, score, micro_batch_size, micro_batch_tokens, rows)
