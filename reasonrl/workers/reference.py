"""The reference worker: the frozen initial policy that the KL loss measures against."""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl.config import Config
from reasonrl.models.loading import load_model
from reasonrl.precision import compute_context
from reasonrl.trainer.logprobs import compute_logprobs
from reasonrl.types import RolloutBatch


class ReferenceWorker:
    """The policy's initial weights, loaded from the model directory and never trained.

    Its state is the model directory itself (``model.path`` is part of the config hash
    that a resume must match), so :meth:`state_dict` is empty and a checkpoint costs
    nothing for it.
    """

    def __init__(self, cfg: Config, model_dir: str | Path) -> None:
        self.cfg = cfg
        self.module = load_model(model_dir, cfg.model.dtype, cfg.run.device).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    def logprobs(self, rollout: RolloutBatch) -> torch.Tensor:
        """[B, T] log-probs of the response tokens under the reference (0 on padding)."""
        t = self.cfg.train
        with compute_context(t.precision, self.cfg.run.device):
            return compute_logprobs(self.module, rollout, self.cfg.rollout.temperature, t.micro_batch_size, t.micro_batch_tokens,
                                    head_chunk=t.lm_head_chunk)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"ReferenceWorker.load_state_dict: the reference is frozen and has no state, got keys {sorted(state)}")
