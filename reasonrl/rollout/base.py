"""The Generator protocol: every rollout backend turns token prompts into a RolloutBatch."""

from __future__ import annotations

from typing import Protocol

import torch

from reasonrl.types import RolloutBatch, SamplingParams


class Generator(Protocol):
    """Samples ``n`` responses for each prompt.

    ``prompts`` are token id lists (no padding). The result's row ``i * n + j`` is sample
    j of prompt i; ``generator`` seeds all sampling so that a call is reproducible.
    The built-in backends sample with the trainer's own module (``model``), so they see
    every update without a weight sync.
    """

    model: torch.nn.Module

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> RolloutBatch: ...
