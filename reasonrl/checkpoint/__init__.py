"""Atomic save/load of the whole resumable training state, retention and find_latest()."""

from reasonrl.checkpoint.registry import StateRegistry
from reasonrl.checkpoint.rng import ProcessRNG, capture_rng, restore_rng
from reasonrl.checkpoint.store import (
    CheckpointCorruptError,
    CheckpointInfo,
    CheckpointWriteError,
    CheckpointWriter,
    CheckpointWriter,
    find_latest,
    list_checkpoints,
    load_checkpoint,
)

__all__ = [
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointWriteError",
    "CheckpointWriter",
    "ProcessRNG",
    "StateRegistry",
    "CheckpointWriter",
    "ProcessRNG",
    "StateRegistry",
    "capture_rng",
    "find_latest",
    "list_checkpoints",
    "load_checkpoint",
    "restore_rng",
]
