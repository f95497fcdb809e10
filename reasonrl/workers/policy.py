"""The policy worker: the trained model, its optimizer and its version."""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl.checkpoint.export import merged_model, training_tokenizer, write_model_dir
from reasonrl.config import Config
from reasonrl.models.lora import adapter_tensors, load_adapters, load_policy, merged_tensors, ships_adapters
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

    LoRA (``model.lora.rank > 0``): the module holds peft LoRA layers
    (:mod:`reasonrl.models.lora`) whose adapters alone train and sit in the optimizer; the
    state (checkpoints) holds the adapters, the frozen base weights are those of the model
    directory; :meth:`weights` publishes the adapters alone where the rollout backend loads
    them (:func:`~reasonrl.models.lora.ships_adapters`), else the merged weights; :meth:`export`
    writes the merged model.

    ``dp`` is None for a single-rank worker; a data-parallel rank
    (:class:`~reasonrl.workers.trainer_rank.TrainerRank`) sets its context there, and then
    :meth:`logprobs` and :meth:`update` are collectives: every rank calls them on the whole batch.
    """

    dp: DataParallel | None = None

    def __init__(self, cfg: Config, model_dir: str | Path) -> None:
        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.module = load_policy(self.model_dir, cfg, cfg.run.device)
        self.lora = cfg.model.lora.rank > 0
        if cfg.train.grad_checkpointing:
            enable_checkpointing(self.module)
        self.optimizer = self._new_optimizer()
        self.version = 0

    def _new_optimizer(self) -> torch.optim.Optimizer:
        t = self.cfg.train
        trained = [p for p in self.module.parameters() if p.requires_grad]  # LoRA: the adapters alone
        return torch.optim.AdamW(trained, lr=t.lr, weight_decay=t.weight_decay)

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
                return compute_logprobs(self.module, rollout, temperature, t.micro_batch_size, t.micro_batch_tokens,
                                        head_chunk=t.lm_head_chunk)
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
        """The current parameters (detached views, not copies) and the version; LoRA: the
        adapters (views) where the rollout backend loads them, else the merged weights (new
        tensors for the adapted projections), :attr:`~reasonrl.types.WeightsUpdate.kind` saying which."""
        if not self.lora:
            return WeightsUpdate(self.version, {name: p.detach() for name, p in self.module.named_parameters()})
        if ships_adapters(self.cfg):
            return WeightsUpdate(self.version, adapter_tensors(self.module), kind="adapters")
        return WeightsUpdate(self.version, merged_tensors(self.module), kind="merged")

    def params_finite(self) -> bool:
        """Whether every parameter is finite (:func:`~reasonrl.trainer.update.params_finite`)."""
        return params_finite(self.module)

    def state_dict(self) -> dict:
        """``weights`` (the module's state dict; LoRA: the adapters alone), ``optimizer`` and ``version``."""
        weights = adapter_tensors(self.module) if self.lora else self.module.state_dict()
        return {"weights": weights, "optimizer": self.optimizer.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        if self.lora:
            load_adapters(self.module, state["weights"])
        else:
            self.module.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])

    def reset(self) -> None:
        """Back to the weights of the model directory (version 0; LoRA: the adapters as
        initialised), with a fresh optimizer."""
        self.module.load_state_dict(load_policy(self.model_dir, self.cfg).state_dict())
        self.optimizer = self._new_optimizer()
        self.version = 0

    def export(self, out: str | Path) -> Path:
        """The policy as a Hugging Face model directory (LoRA: merged), with the tokenizer it was
        trained with: the same writer and layout as ``reasonrl export``
        (:func:`~reasonrl.checkpoint.export.write_model_dir`)."""
        source = {"base_model": str(self.model_dir), "checkpoint": None, "policy_version": self.version}
        module = merged_model(self.module, self.model_dir, self.cfg) if self.lora else self.module
        return write_model_dir(module, training_tokenizer(self.cfg, self.model_dir), out, source)
