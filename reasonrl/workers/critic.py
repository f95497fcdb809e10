"""The critic worker: the value model of PPO with GAE, and its optimizer."""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl.config import Config
from reasonrl.precision import compute_context, enable_checkpointing
from reasonrl.trainer.critic import Critic
from reasonrl.trainer.update import update_critic
from reasonrl.types import RolloutBatch, TrainBatch


class CriticWorker:
    """Owns the critic (the policy's body with a zero-initialised value head) and its AdamW."""

    def __init__(self, cfg: Config, model_dir: str | Path) -> None:
        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.module = Critic(self.model_dir, cfg.model.dtype).to(cfg.run.device)
        if cfg.train.grad_checkpointing:
            enable_checkpointing(self.module.body)
        self.optimizer = self._new_optimizer()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        t = self.cfg.train
        return torch.optim.AdamW(self.module.parameters(), lr=t.critic_lr, weight_decay=t.weight_decay)

    def values(self, rollout: RolloutBatch) -> torch.Tensor:
        """[B, T] values V(s_t) of every response position (0 on padding)."""
        t = self.cfg.train
        with compute_context(t.precision, self.cfg.run.device):
            return self.module.values(rollout, t.micro_batch_size, t.micro_batch_tokens)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One update of the clipped value loss (:func:`~reasonrl.trainer.update.update_critic`)."""
        with compute_context(self.cfg.train.precision, self.cfg.run.device):
            return update_critic(self.module, self.optimizer, batch, self.cfg.algo, self.cfg.train, self.cfg.rollout.max_new_tokens)

    def state_dict(self) -> dict:
        """``weights`` (the critic's state dict) and ``optimizer``."""
        return {"weights": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])

    def reset(self) -> None:
        """Back to the initial critic (the model directory's body, a zero value head)."""
        self.module.load_state_dict(Critic(self.model_dir, self.cfg.model.dtype).state_dict())
        self.optimizer = self._new_optimizer()
