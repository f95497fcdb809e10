"""Atomic save/load of the whole resumable training state, retention and find_latest()."""

from reasonrl.checkpoint.rng import capture_rng, restore_rng
from reasonrl.checkpoint.store import (
    CheckpointCorruptError,
    CheckpointInfo,
    CheckpointWriteError,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointWriteError",
    "capture_rng",
    "find_latest",
    "list_checkpoints",
    "load_checkpoint",
    "restore_rng",
    "save_checkpoint",
]
