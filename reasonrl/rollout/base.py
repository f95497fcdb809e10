"""The RolloutBackend protocol: every rollout backend turns token prompts into a RolloutBatch
and declares what else it can do (its row of :data:`reasonrl.config.capabilities.BACKENDS`)."""

from __future__ import annotations

from dataclasses import fields
from typing import Callable, Protocol, Sequence, TypeVar

import torch

from reasonrl.config.capabilities import BACKENDS, Capabilities
from reasonrl.types import Prompt, RolloutBatch, SamplingParams


class RolloutBackend(Protocol):
    """Samples ``n`` responses for each prompt.

    ``prompts`` are token id lists (no padding). The result's row ``i * n + j`` is sample
    j of prompt i. ``seeds`` holds one integer per prompt group (``len(seeds) == len(prompts)``,
    else a ValueError): sample j of group i draws its ``t``-th token with
    ``uniforms(row seed (seeds[i], j), t)`` (:mod:`reasonrl.rollout.seeds`), so a group's
    samples are the same whichever worker serves it and whatever else shares the call.

    The capability attributes below are declared in one table,
    :data:`reasonrl.config.capabilities.BACKENDS`, which the config rules read too; a backend
    class takes its row with :func:`declares`.
    """

    continues: bool
    """True when a multi-turn session continues a sequence with an environment's tokens
    (``start(prompts, n, capacity, rows, eos_ids) -> Continuation``; ``env.name`` needs it)."""
    interrupts: bool
    """True when a generation can be interrupted by new weights and go on with them
    (``rollout.interrupt``: :class:`~reasonrl.rollout.partial.PartialRollouts` wraps it)."""
    streams: bool
    """True when it also has ``generate_stream(prompts, n, params, seeds, on_groups_done)``
    (groups reported as they complete, early stop)."""
    trainer_numerics: bool
    """True when sampling runs the trainer's own forward code over the weights (the built-in
    ``fast`` and ``hf`` backends): in fp32 the sampling log-probs are then the trainer's
    (``train.old_logprobs=auto`` reuses them). False for another engine (vLLM)."""

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        seeds: Sequence[int],
    ) -> RolloutBatch: ...

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Sample with these parameters (name -> tensor, as ``named_parameters``) from now on."""

    # A backend with the ``adapters`` capability also has
    # ``load_adapters(tensors)``: sample with these LoRA adapters (name -> tensor, the adapter
    # parameters of its module, :func:`reasonrl.models.lora.load_adapters`) from now on.


def generate_for(generator, prompts: list[Prompt], ids: list[list[int]], n: int, params: SamplingParams,
                 seeds: Sequence[int]) -> RolloutBatch:
    """``generator.generate(ids, n, params, seeds)`` (one seed per prompt group); an episodic
    generator (one whose ``episodic`` is True: the multi-turn rollout worker, which resets an
    environment per prompt) also gets the prompts themselves as ``states``."""
    if getattr(generator, "episodic", False):
        return generator.generate(ids, n, params, seeds, states=prompts)
    return generator.generate(ids, n, params, seeds)


_Class = TypeVar("_Class", bound=type)


def declares(backend: str) -> Callable[[_Class], _Class]:
    """Class decorator: the class is ``rollout.backend=<backend>`` and takes the capability
    attributes of that row of :data:`~reasonrl.config.capabilities.BACKENDS`."""
    row = BACKENDS[backend]

    def apply(cls: _Class) -> _Class:
        for f in fields(Capabilities):
            setattr(cls, f.name, getattr(row, f.name))
        return cls

    return apply


@torch.no_grad()
def copy_weights(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy ``tensors`` into the parameters of ``module`` by name; every parameter must be given
    (a name missing from either side is a KeyError naming it)."""
    params = dict(module.named_parameters())
    if params.keys() != tensors.keys():
        missing, extra = sorted(params.keys() - tensors.keys()), sorted(tensors.keys() - params.keys())
        raise KeyError(f"load_weights: parameters missing {missing[:5]}, unknown {extra[:5]}")
    for name, p in params.items():
        p.copy_(tensors[name])
