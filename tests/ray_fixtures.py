"""Worker classes for the Ray runtime tests, importable by the actors' processes."""

from __future__ import annotations

import torch

from reasonrl.types import WeightsUpdate


class Refused(Exception):
    """An exception type of the test's own, to check it crosses the actor boundary unchanged."""


class Receiver:
    """A rollout-like worker: keeps the last weights update it was handed."""

    def __init__(self) -> None:
        self.update: WeightsUpdate | None = None

    def load_weights(self, update: WeightsUpdate) -> tuple[int, dict[str, torch.Tensor]]:
        self.update = update
        return update.version, {k: v.clone() for k, v in update.tensors.items()}

    def refuse(self, why: str) -> None:
        raise Refused(why)
