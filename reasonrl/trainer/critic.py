"""The PPO critic: the policy's transformer body with a scalar value head.

It is initialised from the same model directory as the policy (the language-model head
is dropped) and predicts V(s_t), the value of the state before response token t.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModel

from reasonrl.models.loading import torch_dtype
from reasonrl.models.decoder import LeanDecoder, unsupported_reason
from reasonrl.trainer.logprobs import per_token_scores, response_hidden, sequence_inputs
from reasonrl.types import RolloutBatch


class Critic(torch.nn.Module):
    def __init__(self, path: str | Path, dtype: str = "float32") -> None:
        super().__init__()
        self.body = AutoModel.from_pretrained(str(path), dtype=torch_dtype(dtype), local_files_only=True)
        self.value_head = torch.nn.Linear(self.body.config.hidden_size, 1, dtype=torch_dtype(dtype))
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, rollout: RolloutBatch, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``(values [b, T'] for the response tokens of rows, T')``."""
        if unsupported_reason(self.body) is None:
            hidden, T = response_hidden(LeanDecoder(self.body), rollout, rows)
        else:
            inputs, P, T = sequence_inputs(rollout, rows)
            hidden = self.body(**inputs, use_cache=False).last_hidden_state[:, P - 1 : P - 1 + T]
        return self.value_head(hidden).squeeze(-1).float(), T

    def values(self, rollout: RolloutBatch, micro_batch_size: int, micro_batch_tokens: int = 0) -> torch.Tensor:
        """Values [B, T] of every response position (0 on padding), without gradients."""
        return per_token_scores(self, rollout, lambda rows: self(rollout, rows), micro_batch_size, micro_batch_tokens)
