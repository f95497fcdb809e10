"""The one list of what a run's state is: saved by a checkpoint, restored by a resume and, for
the entries marked so, by a rollback.

    registry = StateRegistry()
    registry.add("policy", policy_worker, rollback=True)    # weights + optimizer
    registry.add("source", rollout_source)                   # sampler position, queued groups
    tensors, state = registry.capture()                      # -> CheckpointWriter.save(step, tensors, state)
    registry.restore(tensors, state)                         # resume: every entry
    registry.restore(tensors, state, rollback=True)          # rollback: the marked entries only

An entry is any object with ``state_dict()`` and ``load_state_dict(state)``. A ``"weights"``
key of its state (a flat dict of tensors) goes to the checkpoint's ``<name>.safetensors``;
the rest to ``state.pt``. Entries are restored in the order they were added.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class StateRegistry:
    """Named stateful objects, in the order they were added."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Stateful, bool]] = {}

    def add(self, name: str, obj: Stateful, rollback: bool = False) -> None:
        """Register ``obj`` under ``name``; ``rollback``: a rollback restores it too (the weights
        and optimizers), while the rest (sampler, RNGs, guards) keeps moving forward."""
        if name in self._entries:
            raise ValueError(f"StateRegistry: {name!r} is registered twice")
        self._entries[name] = (obj, rollback)

    @property
    def rollback_entries(self) -> list[Stateful]:
        return [obj for obj, rollback in self._entries.values() if rollback]

    def capture(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
        """``(tensors, state)``: each entry's ``weights`` by name, and everything else by name."""
        tensors, state = {}, {}
        for name, (obj, _) in self._entries.items():
            entry = dict(obj.state_dict())
            if "weights" in entry:
                tensors[name] = entry.pop("weights")
            state[name] = entry
        return tensors, state

    def restore(self, tensors: dict[str, dict[str, torch.Tensor]], state: dict[str, Any], rollback: bool = False) -> None:
        """Load every entry (only the rollback entries with ``rollback``) from a captured state;
        a name the checkpoint lacks is a KeyError naming it."""
        for name, (obj, restored_on_rollback) in self._entries.items():
            if rollback and not restored_on_rollback:
                continue
            if name not in state:
                raise KeyError(f"checkpoint: no state for {name!r} (it holds {', '.join(sorted(state))})")
            entry = dict(state[name])
            if name in tensors:
                entry["weights"] = tensors[name]
            obj.load_state_dict(entry)
