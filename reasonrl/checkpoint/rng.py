"""Capture and restore every random number generator a training step draws from.

The captured state holds only tuples, lists, ints, floats, strs, None and tensors, so it
survives ``torch.load(weights_only=True)`` inside a checkpoint's ``state.pt``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng(extra_generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """The states of python ``random``, numpy's global RNG, torch's CPU RNG, every CUDA
    device's RNG (an empty list without CUDA) and each named ``torch.Generator``."""
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": numpy_state["state"]["key"].tolist(),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: g.get_state() for name, g in (extra_generators or {}).items()},
    }


def restore_rng(
    state: dict[str, Any], extra_generators: dict[str, torch.Generator] | None = None
) -> None:
    """Put every generator back to the state ``capture_rng`` returned.

    ``extra_generators`` must name exactly the generators that were captured, and CUDA
    states need the same number of visible devices: anything else raises ValueError,
    since a partial restore would silently break bit-identical resumption.
    """
    generators = extra_generators or {}
    if set(generators) != set(state["generators"]):
        raise ValueError(
            f"restore_rng: captured generators {sorted(state['generators'])}, "
            f"given {sorted(generators)}"
        )
    cuda = state["cuda"]
    if cuda and (not torch.cuda.is_available() or torch.cuda.device_count() != len(cuda)):
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(
            f"restore_rng: state has CUDA RNG states for {len(cuda)} devices, {visible} visible"
        )
    numpy_state = state["numpy"]
    random.setstate(state["python"])
    np.random.set_state(
        {
            "bit_generator": numpy_state["bit_generator"],
            "state": {"key": np.asarray(numpy_state["key"], dtype=np.uint32),
                      "pos": numpy_state["pos"]},
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    for device, device_state in enumerate(cuda):
        torch.cuda.set_rng_state(device_state, device)
    for name, generator in generators.items():
        generator.set_state(state["generators"][name])


class ProcessRNG:
    """This process's global generators (python, numpy, torch CPU and CUDA) as a registry entry."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state)
