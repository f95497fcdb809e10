"""Log-probs of response tokens under a model (shared by policy, old policy and reference).

The model sees ``prompt_ids ++ response_ids`` with the attention mask of both and
position ids counted from the first real prompt token, exactly the inputs the generator
saw, so log-probs recomputed here equal the sampling log-probs for the same weights.
Rows are trimmed to their own longest prompt and response, which saves most of the
padding in a micro-batch.
"""

from __future__ import annotations

import torch

from reasonrl.algo import entropy_from_logits, token_logprobs
from reasonrl.types import RolloutBatch


def sequence_inputs(rollout: RolloutBatch, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], int, int]:
    """Model inputs for ``rows`` trimmed to their padding, plus (prompt length P', response length T')."""
    prompt_mask = rollout.prompt_mask[rows]
    response_mask = rollout.response_mask[rows]
    P = int(prompt_mask.sum(-1).max().item())
    T = max(int(response_mask.sum(-1).max().item()), 1)
    ids = torch.cat([rollout.prompt_ids[rows][:, -P:], rollout.response_ids[rows][:, :T]], dim=1)
    attention = torch.cat([prompt_mask[:, -P:], response_mask[:, :T].long()], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attention, "position_ids": positions}, P, T


def response_logits(model: torch.nn.Module, rollout: RolloutBatch, rows: torch.Tensor, temperature: float) -> tuple[torch.Tensor, int]:
    """``(logits / temperature at the positions that predict each response token [b, T', V], T')``."""
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


@torch.no_grad()
def compute_logprobs(model: torch.nn.Module, rollout: RolloutBatch, temperature: float, micro_batch_size: int) -> torch.Tensor:
    """Log-probs [B, T] of every response token (0 on padding), in micro-batches, without gradients."""
    was_training = model.training
    model.eval()
    out = torch.zeros_like(rollout.response_mask)
    try:
        for rows in torch.arange(rollout.size).split(micro_batch_size):
            logprobs, _, T = policy_logprobs(model, rollout, rows, temperature, with_entropy=False)
            out[rows, :T] = logprobs
    finally:
        model.train(was_training)
    return out * rollout.response_mask
