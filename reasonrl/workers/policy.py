"""The policy worker: the trained model, its optimizer and its version."""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl.checkpoint.export import training_tokenizer, write_model_dir
from reasonrl.config import Config
from reasonrl.models.loading import load_model
from reasonrl.precision import compute_context, enable_checkpointing
from reasonrl.trainer.distributed import DataParallel
from reasonrl.trainer.logprobs import compute_logprobs, sequence_lengths
from reasonrl.trainer.update import own_logprobs, params_finite, update_policy
from reasonrl.types import RolloutBatch, TrainBatch, WeightsUpdate


class PolicyWorker:
    """Owns the policy module and its AdamW optimizer; speaks in batches and versioned weights.

    ``version`` counts the updates the weights have had: 0 for the weights loaded from the
    model directory, +1 per :meth:`update`; a checkpoint restores it with the weights (a
    rollback to step c's checkpoint returns to version c). Rollout workers tag every
    sampled token with the version they held, and staleness is measured in versions.

    ``dp`` is None for a single-rank worker; a data-parallel rank
    (:class:`~reasonrl.workers.trainer_rank.TrainerRank`) sets its context there, and then
    :meth:`logprobs` and :meth:`update` are collectives: every rank calls them on the whole batch.
    """

    dp: DataParallel | None = None

    def __init__(self, cfg: Config, model_dir: str | Path) -> None:
        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.module = load_model(self.model_dir, cfg.model.dtype, cfg.run.device)
        if cfg.train.grad_checkpointing:
            enable_checkpointing(self.module)
        self.optimizer = self._new_optimizer()
        self.version = 0

    def _new_optimizer(self) -> torch.optim.Optimizer:
        t = self.cfg.train
        return torch.optim.AdamW(self.module.parameters(), lr=t.lr, weight_decay=t.weight_decay)

    def compute_module(self) -> torch.nn.Module:
        """The module that scoring and updates run through: :attr:`module` itself here."""
        return self.module

    def logprobs(self, rollout: RolloutBatch) -> torch.Tensor:
        """[B, T] log-probs of the response tokens under the current weights (0 on padding).
        With ``dp``: each rank scores its token-balanced share of the rows, and one all-reduce
        (SUM of disjoint rows) gives every rank all of them."""
        t, temperature = self.cfg.train, self.cfg.rollout.temperature
        with compute_context(t.precision, self.cfg.run.device):
            if self.dp is None:
                return compute_logprobs(self.module, rollout, temperature, t.micro_batch_size, t.micro_batch_tokens)
            rows = self.dp.own(torch.arange(rollout.size, device=rollout.response_mask.device), sequence_lengths(rollout))
            return self.dp.all_reduce(own_logprobs(self.compute_module(), rollout, temperature, t, rows, self.dp), "logprobs")

    def update(self, batch: TrainBatch, lr: float) -> dict[str, float]:
        """One PPO update on ``batch`` at learning rate ``lr`` (see
        :func:`~reasonrl.trainer.update.update_policy`); the version goes up by one."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        r, t = self.cfg.rollout, self.cfg.train
        with compute_context(t.precision, self.cfg.run.device):
            metrics = update_policy(self.compute_module(), self.optimizer, batch, self.cfg.algo, t, r.temperature,
                                    r.max_new_tokens, self.version, self.dp)
        self.version += 1
        return metrics

    def weights(self) -> WeightsUpdate:
        """The current parameters (detached views, not copies) and the version."""
        return WeightsUpdate(self.version, {name: p.detach() for name, p in self.module.named_parameters()})

    def params_finite(self) -> bool:
        """Whether every parameter is finite (:func:`~reasonrl.trainer.update.params_finite`)."""
        return params_finite(self.module)

    def state_dict(self) -> dict:
        """``weights`` (the module's state dict), ``optimizer`` and ``version``."""
        return {"weights": self.module.state_dict(), "optimizer": self.optimizer.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])

    def reset(self) -> None:
        """Back to the weights of the model directory (version 0), with a fresh optimizer."""
        self.module.load_state_dict(load_model(self.model_dir, self.cfg.model.dtype).state_dict())
        self.optimizer = self._new_optimizer()
        self.version = 0

    def export(self, out: str | Path) -> Path:
        """The policy as a Hugging Face model directory, with the tokenizer it was trained with:
        the same writer and layout as ``reasonrl export`` (:func:`~reasonrl.checkpoint.export.write_model_dir`)."""
        source = {"base_model": str(self.model_dir), "checkpoint": None, "policy_version": self.version}
        return write_model_dir(self.module, training_tokenizer(self.cfg, self.model_dir), out, source)
