"""The Generator protocol: every rollout backend turns token prompts into a RolloutBatch."""

from __future__ import annotations

from typing import Protocol

import torch

from reasonrl.types import RolloutBatch, SamplingParams


class Generator(Protocol):
    """Samples ``n`` responses for each prompt.

    ``prompts`` are token id lists (no padding). The result's row ``i * n + j`` is sample
    j of prompt i; ``generator`` seeds all sampling so that a call is reproducible.
    ``model`` is the trainer's module: the built-in backends (``fast``, ``hf``) sample with
    it, so they see every update without a weight sync; the vLLM backend copies its
    parameters into its own engine when they changed (:mod:`reasonrl.rollout.vllm`).
    """

    model: torch.nn.Module
    samples_with_model: bool
    """True when sampling runs ``model`` itself: the sampling log-probs are then the
    trainer's own (``train.old_logprobs=auto`` reuses them in fp32)."""

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> RolloutBatch: ...
