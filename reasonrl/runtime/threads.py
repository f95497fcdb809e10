"""Torch's process-wide settings for a worker process (or the trainer's own), and the cores a
process may use (read without torch: the run's plan asks for them before anything trains)."""

from __future__ import annotations

import os


def setup_torch(threads: int, deterministic: bool) -> None:
    """Torch threads: ``threads``, else the cores this process may run on; deterministic kernels."""
    import torch

    torch.set_num_threads(threads or available_cores())
    torch.use_deterministic_algorithms(deterministic)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 2)
