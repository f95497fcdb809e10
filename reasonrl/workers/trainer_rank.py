"""A data-parallel trainer rank: a PolicyWorker that belongs to a process group.

    rank = TrainerRank(cfg, model_dir, rank=1, world=2, trace_dir=run_dir / "trace")
    rank.connect("tcp://127.0.0.1:29511", incarnation)   # on every rank at once (a collective)
    metrics = rank.update(batch, lr, step=7)          # every rank, the whole batch: its share

Every method is called on every rank with the same arguments (the runtime's
:class:`~reasonrl.runtime.ranks.RankGroup` does that) and the caller keeps rank 0's result:
methods that need nothing from the others (``state_dict``, ``weights``, ``export`` under ddp)
answer None on the other ranks instead of sending a copy of rank 0's answer.

``train.strategy``:

- ``ddp``: every rank holds all parameters; the update all-reduces the gradients
  (:mod:`reasonrl.trainer.distributed`). Rank 0's parameters are broadcast at :meth:`connect`,
  so all ranks start identical; rank 0's state is the checkpoint, and every rank restores it.
- ``fsdp`` (CUDA only): FSDP2 (``fully_shard`` on each decoder layer and the root) shards the
  parameters, gradients and AdamW state; with ``model.dtype=bfloat16`` it computes in bf16 and
  reduces gradients in fp32 (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``).
  Forward passes go through the ``transformers`` modules, whose hooks gather the shards (the
  lean decoder reads parameters directly); gradients are summed, not averaged. ``weights``,
  ``state_dict``, ``export`` and ``params_finite`` gather from every rank. The rollout side
  cannot share a sharded module: it takes the published weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from reasonrl.checkpoint.export import training_tokenizer, write_model_dir
from reasonrl.config import Config
from reasonrl.models.loading import load_model
from reasonrl.errors import InputError
from reasonrl.trainer.distributed import DataParallel, Recorder, TraceWriter
from reasonrl.types import RolloutBatch, TrainBatch, WeightsUpdate
from reasonrl.workers.policy import PolicyWorker


class _TransformersForward(torch.nn.Module):
    """``inner``'s ``transformers`` forward, without its ``config``: the scoring code then takes
    the generic path (:func:`~reasonrl.trainer.logprobs.response_logits`), which calls the
    modules and so FSDP's hooks, instead of reading the (sharded) parameters directly."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **inputs):
        return self.inner(**inputs)


class TrainerRank(PolicyWorker):
    """Rank ``rank`` of ``world`` data-parallel policy ranks (see the module docstring).

    ``trace_dir`` (with ``runtime.trace_collectives``) receives ``rank<R>.jsonl``, the record
    of its collectives (:class:`~reasonrl.trainer.distributed.TraceWriter`). Nothing talks to
    the other ranks before :meth:`connect`, so the ranks can be built one after another.
    """

    def __init__(self, cfg: Config, model_dir: str | Path, rank: int, world: int, trace_dir: str | Path | None = None) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"TrainerRank: rank={rank}, world={world}; expected 0 <= rank < world")
        device = torch.device(cfg.run.device)
        if cfg.train.strategy == "fsdp" and device.type != "cuda":
            raise InputError(f"train.strategy: fsdp shards over CUDA devices (FSDP2 with nccl); run.device is "
                             f"{cfg.run.device!r}. Use train.strategy=ddp on {device.type}")
        if device.type == "cuda" and device.index is None:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        super().__init__(cfg, model_dir)
        self.rank, self.world = rank, world
        self.trace_dir = None if trace_dir is None else Path(trace_dir)
        self._forward: torch.nn.Module = self.module

    # ------------------------------------------------------------------ the group
    def connect(self, init_method: str, incarnation: str) -> int:
        """Join the process group at ``init_method`` (every rank at once), bounded by
        ``runtime.collective_timeout_s``; then ddp broadcasts rank 0's parameters (traced) and
        fsdp shards the module. ``incarnation`` names this group's records in the trace.
        Returns this process's id."""
        rt = self.cfg.runtime
        traced = rt.trace_collectives and self.trace_dir is not None
        recorder = TraceWriter(self.trace_dir, self.rank, self.world, incarnation) if traced else Recorder()
        self.dp = DataParallel.connect(self.rank, self.world, init_method, rt.collective_timeout_s, self.cfg.run.device,
                                       recorder, self.cfg.train.strategy)
        self.dp.begin(0, "connect")
        if self.cfg.train.strategy == "fsdp":
            self._shard()
        else:
            self.dp.broadcast_module(self.module)
        return os.getpid()

    def _shard(self) -> None:
        """FSDP2 over each decoder layer and the root, gradients summed over the ranks; a new
        optimizer over the sharded parameters."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if self.cfg.model.dtype == "bfloat16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in getattr(getattr(self.module, "model", None), "layers", []):
            fully_shard(layer, mp_policy=policy)
        fully_shard(self.module, mp_policy=policy)
        for module in self.module.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self._forward = _TransformersForward(self.module)
        self.optimizer = self._new_optimizer()

    def set_shares(self, weights: list[float]) -> None:
        """Each rank's part of every split, in proportion to ``weights`` (one per rank; every
        rank must get the same ones): a slow rank is given less."""
        self.dp.set_shares(weights)

    def close(self) -> None:
        """Leave the process group and close the trace."""
        if self.dp is not None:
            self.dp.close()
            self.dp = None

    # ------------------------------------------------------------------ collectives
    def compute_module(self) -> torch.nn.Module:
        return self._forward

    def _step(self, step: int | None) -> int:
        return self.version + 1 if step is None else step

    def logprobs(self, rollout: RolloutBatch, step: int | None = None) -> torch.Tensor | None:
        """The [B, T] log-probs, scored by the ranks together; rank 0 returns them, the others None.
        ``step`` (default: the version + 1) tags the trace."""
        self.dp.begin(self._step(step), "logprobs")
        out = super().logprobs(rollout)
        return out if self.rank == 0 else None

    def update(self, batch: TrainBatch, lr: float, step: int | None = None) -> dict[str, float]:
        """The rank's part of one PPO update on the whole ``batch``; every rank returns the
        global metrics. ``step`` (default: the version + 1) tags the trace."""
        self.dp.begin(self._step(step), "update")
        return super().update(batch, lr)

    def _fsdp(self) -> bool:
        return self.cfg.train.strategy == "fsdp"

    def _full_state(self) -> tuple[dict, dict]:
        """fsdp: the whole model and optimizer state dicts on CPU (rank 0; empty elsewhere)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return self.dp.traced("all_gather", "state", 0, lambda: get_state_dict(self.module, self.optimizer, options=options))

    def weights(self) -> WeightsUpdate | None:
        """Rank 0: the whole parameters and the version (ddp: detached views; fsdp: gathered
        copies); the other ranks None."""
        if not self._fsdp():
            return super().weights() if self.rank == 0 else None
        tensors = self.dp.traced("all_gather", "weights", 0, lambda: {
            name: p.detach().full_tensor() for name, p in self.module.named_parameters()})
        return WeightsUpdate(self.version, tensors) if self.rank == 0 else None

    def params_finite(self) -> bool:
        """Whether every parameter is finite (fsdp: every rank's shards, all-reduced)."""
        if not self._fsdp():
            return super().params_finite()
        shards = [p.to_local() for p in self.module.parameters()]
        bad = (~torch.stack([t.isfinite().all() for t in shards]).all()).float().reshape(1)
        return float(self.dp.all_reduce(bad, "finite")) == 0.0

    def state_dict(self) -> dict | None:
        """Rank 0: ``weights``, ``optimizer`` and ``version`` (fsdp: gathered whole, by name);
        the other ranks None."""
        if not self._fsdp():
            return super().state_dict() if self.rank == 0 else None
        weights, optimizer = self._full_state()
        return {"weights": weights, "optimizer": optimizer, "version": self.version} if self.rank == 0 else None

    def load_state_dict(self, state: dict) -> None:
        """Every rank restores rank 0's state."""
        if not self._fsdp():
            return super().load_state_dict(state)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        options = StateDictOptions(full_state_dict=True)
        self.optimizer.zero_grad(set_to_none=True)  # torch fills in missing AdamW state only for parameters without gradients
        self.dp.traced("broadcast", "state", 0, lambda: set_state_dict(
            self.module, self.optimizer, model_state_dict=state["weights"], optim_state_dict=state["optimizer"], options=options))
        self.version = int(state["version"])

    def reset(self) -> None:
        """Back to the model directory's weights (version 0) with a fresh optimizer, on every rank."""
        if not self._fsdp():
            return super().reset()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        weights = load_model(self.model_dir, self.cfg.model.dtype).state_dict()
        options = StateDictOptions(full_state_dict=True)
        self.dp.traced("broadcast", "weights", 0, lambda: set_model_state_dict(self.module, weights, options=options))
        self.optimizer = self._new_optimizer()
        self.version = 0

    def export(self, out: str | Path) -> Path | None:
        """Rank 0 writes the Hugging Face model directory (fsdp: from the gathered weights); the
        other ranks return None."""
        if not self._fsdp():
            return super().export(out) if self.rank == 0 else None
        weights, _ = self._full_state()
        if self.rank != 0:
            return None
        module = load_model(self.model_dir, self.cfg.model.dtype)
        module.load_state_dict(weights)
        source = {"base_model": str(self.model_dir), "checkpoint": None, "policy_version": self.version}
        return write_model_dir(module, training_tokenizer(self.cfg, self.model_dir), out, source)

