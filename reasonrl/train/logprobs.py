"""Log-probs of response tokens under a model (shared by policy, old policy and reference).

The model sees ``prompt ++ response`` with position ids counted from the first real prompt
token, exactly the inputs the generator saw, so log-probs recomputed here equal the
sampling log-probs for the same weights.

Two forward paths compute the same function: models that :class:`~reasonrl.decoder.LeanDecoder`
supports (Llama, Qwen2, Qwen3) are scored on right-padded rows (each row's real tokens
first, so causal attention needs no mask) and the LM head runs only where a response token
is predicted; any other causal LM runs through its ``transformers`` forward on the rows
trimmed to their own longest prompt and response.

:func:`micro_batches` splits a batch for forward/backward either into fixed-size slices or,
with a token budget, into length-sorted slices whose padded size stays under the budget:
far less padding when response lengths vary.
"""

from __future__ import annotations

import torch

from reasonrl.algo import entropy_from_logits, token_logprobs
from reasonrl.decoder import LeanDecoder, unsupported_reason
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


def right_padded(rollout: RolloutBatch, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(ids [b, S], positions [b, T'], T')`` for the lean path: each row's real prompt and
    response tokens moved to the front (order kept), ``S`` the longest such row, and
    ``positions[i, j]`` the index whose output predicts response token ``j`` of row ``i``
    (``prompt_len_i - 1 + j``, clamped into the row for padding)."""
    prompt_mask = rollout.prompt_mask[rows].bool()
    response_mask = rollout.response_mask[rows].bool()
    ids = torch.cat([rollout.prompt_ids[rows], rollout.response_ids[rows]], 1)
    real = torch.cat([prompt_mask, response_mask], 1)
    order = torch.sort((~real).to(torch.uint8), dim=1, stable=True).indices
    S = int(real.sum(-1).max())
    T = max(int(response_mask.sum(-1).max()), 1)
    prompt_len = prompt_mask.sum(-1, keepdim=True)
    positions = (prompt_len - 1 + torch.arange(T, device=ids.device)).clamp(max=S - 1)
    return ids.gather(1, order[:, :S]), positions, T


def response_hidden(decoder: LeanDecoder, rollout: RolloutBatch, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(final-norm hidden states [b, T', d] at the positions that predict each response token, T')``."""
    ids, positions, T = right_padded(rollout, rows)
    return decoder.final_norm(decoder.hidden_at(ids, positions)), T


def response_logits(model: torch.nn.Module, rollout: RolloutBatch, rows: torch.Tensor, temperature: float) -> tuple[torch.Tensor, int]:
    """``(logits / temperature at the positions that predict each response token [b, T', V], T')``."""
    if unsupported_reason(model) is None:
        ids, positions, T = right_padded(rollout, rows)
        return LeanDecoder(model).logits_at(ids, positions).float() / temperature, T
    inputs, P, T = sequence_inputs(rollout, rows)
    logits = model(**inputs, use_cache=False).logits
    return logits[:, P - 1 : P - 1 + T].float() / temperature, T


def policy_logprobs(
    model: torch.nn.Module, rollout: RolloutBatch, rows: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """``(logprobs [b, T'], entropy [b, T'] or None, T')`` for ``rows``, with gradients."""
    logits, T = response_logits(model, rollout, rows, temperature)
    logprobs = token_logprobs(logits, rollout.response_ids[rows][:, :T])
    return logprobs, entropy_from_logits(logits) if with_entropy else None, T


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int, max_tokens: int) -> list[torch.Tensor]:
    """Split ``rows`` for forward/backward passes.

    ``max_tokens == 0``: consecutive slices of ``size`` rows. Otherwise the rows sorted by
    ``lengths`` (prompt + response tokens), cut greedily so that each slice's padded size,
    ``rows x its longest row``, stays within ``max_tokens`` (a longer row goes alone).
    """
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
def compute_logprobs(
    model: torch.nn.Module, rollout: RolloutBatch, temperature: float, micro_batch_size: int, micro_batch_tokens: int = 0
) -> torch.Tensor:
    """Log-probs [B, T] of every response token (0 on padding), in micro-batches, without gradients."""
    was_training = model.training
    model.eval()
    out = torch.zeros_like(rollout.response_mask)
    try:
        rows = torch.arange(rollout.size)
        for micro in micro_batches(rows, sequence_lengths(rollout), micro_batch_size, micro_batch_tokens):
            logprobs, _, T = policy_logprobs(model, rollout, micro, temperature, with_entropy=False)
            out[micro, :T] = logprobs
    finally:
        model.train(was_training)
    return out * rollout.response_mask
