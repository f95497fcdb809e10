"""The Generator protocol: every rollout backend turns token prompts into a RolloutBatch."""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from reasonrl.types import Prompt, RolloutBatch, SamplingParams


class Generator(Protocol):
    """Samples ``n`` responses for each prompt.

    ``prompts`` are token id lists (no padding). The result's row ``i * n + j`` is sample
    j of prompt i. ``seeds`` holds one integer per prompt group (``len(seeds) == len(prompts)``,
    else a ValueError): sample j of group i draws its ``t``-th token with
    ``uniforms(row seed (seeds[i], j), t)`` (:mod:`reasonrl.rollout.seeds`), so a group's
    samples are the same whichever worker serves it and whatever else shares the call.
    Streaming backends also have ``generate_stream(prompts, n, params, seeds, on_groups_done)``.
    """

    trainer_numerics: bool
    """True when sampling runs the trainer's own forward code over the weights (the built-in
    ``fast`` and ``hf`` backends): in fp32 the sampling log-probs are then the trainer's
    (``train.old_logprobs=auto`` reuses them). False for another engine (vLLM)."""
    streams: bool
    """True when it also has ``generate_stream`` (groups reported as they complete, early stop)."""

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        seeds: Sequence[int],
    ) -> RolloutBatch: ...

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Sample with these parameters (name -> tensor, as ``named_parameters``) from now on."""


def generate_for(generator, prompts: list[Prompt], ids: list[list[int]], n: int, params: SamplingParams,
                 seeds: Sequence[int]) -> RolloutBatch:
    """``generator.generate(ids, n, params, seeds)`` (one seed per prompt group); an episodic
    generator (one whose ``episodic`` is True: the multi-turn rollout worker, which resets an
    environment per prompt) also gets the prompts themselves as ``states``."""
    if getattr(generator, "episodic", False):
        return generator.generate(ids, n, params, seeds, states=prompts)
    return generator.generate(ids, n, params, seeds)


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
