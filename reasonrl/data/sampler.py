"""Deterministic, resumable prompt sampling in epochs."""

from __future__ import annotations

import hashlib

import torch


class PromptSampler:
    """Yields prompt indices, ``next(k)`` at a time, epoch after epoch.

    Epoch ``e`` is a permutation of ``range(num_items)`` drawn from a ``torch.Generator``
    seeded with a hash of ``(seed, e)`` (or ``range(num_items)`` itself when
    ``shuffle=False``), so batches depend on nothing but the seed and the position. A
    batch that crosses an epoch boundary takes the rest of the current epoch and goes on
    with the next one: every index appears exactly once per epoch. ``state_dict()`` /
    ``load_state_dict()`` save and restore the position exactly.
    """

    def __init__(self, num_items: int, seed: int, shuffle: bool = True):
        if num_items < 1:
            raise ValueError(f"PromptSampler: num_items must be >= 1, got {num_items}")
        self.num_items = num_items
        self.seed = seed
        self.shuffle = shuffle
        self._epoch = 0
        self._position = 0
        self._order = self._permutation(0)

    def next(self, k: int) -> list[int]:
        """The next ``k`` indices."""
        batch: list[int] = []
        while len(batch) < k:
            take = self._order[self._position : self._position + k - len(batch)]
            batch.extend(take)
            self._position += len(take)
            if self._position == self.num_items:
                self._set(self._epoch + 1, 0)
        return batch

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position"}``: the next index is ``position`` in epoch ``epoch``'s order."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a ``state_dict()``; ValueError when it does not fit this sampler."""
        epoch, position = state.get("epoch"), state.get("position")
        if not (isinstance(epoch, int) and epoch >= 0):
            raise ValueError(f"PromptSampler state: 'epoch' must be an int >= 0, got {epoch!r}")
        if not (isinstance(position, int) and 0 <= position < self.num_items):
            raise ValueError(
                f"PromptSampler state: 'position' must be an int in [0, {self.num_items}), got {position!r}"
            )
        self._set(epoch, position)

    def _set(self, epoch: int, position: int) -> None:
        if epoch != self._epoch:
            self._order = self._permutation(epoch)
        self._epoch, self._position = epoch, position

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_items))
        digest = hashlib.sha256(f"{self.seed}:{epoch}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return torch.randperm(self.num_items, generator=generator).tolist()
