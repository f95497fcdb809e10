"""The in-memory snapshot of the resumable state: what a restarted trainer resumes from when
it is newer than the last checkpoint, so a crash costs the step in progress, not a
checkpoint interval.

    store = SnapshotStore(directory)               # a tmpfs directory the supervisor owns
    store.save(step, tensors, state, meta)         # StateRegistry.capture() after each step
    found = store.load()                           # Snapshot(step, tensors, state, meta), or None
    store.problem                                  # why the last load found none ("" when it did)

It holds exactly what a checkpoint holds (:class:`~reasonrl.checkpoint.registry.StateRegistry`)
in one file, ``snapshot.pt``::

    MAGIC (8 bytes) | sha256 of the payload (32 bytes) | payload length (8 bytes, big-endian) | payload

the payload being ``torch.save({"step", "tensors", "state", "meta"})``. A save writes a
temporary file beside it and renames it over the old one, so a kill in the middle of a save
leaves the previous snapshot whole; a file whose length or hash does not match (torn, or
damaged) is ignored, and the trainer resumes from its checkpoint instead.

It is no checkpoint: it lives in memory (``/dev/shm``) and dies with the machine; nothing is
fsynced and the checkpoint interval and its guarantees stay as they are.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

MAGIC = b"RRSNAP1\n"
SNAPSHOT_FILE = "snapshot.pt"
_HEADER = struct.Struct(">32sQ")


class Snapshot(NamedTuple):
    """A loaded snapshot: the step it was taken after, the registry's ``(tensors, state)`` and
    ``meta`` (the controller's own: when it was taken, when the last checkpoint was written)."""

    step: int
    tensors: dict[str, dict[str, torch.Tensor]]
    state: dict[str, Any]
    meta: dict[str, Any]


class SnapshotStore:
    """The snapshot file of ``directory`` (which must exist)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / SNAPSHOT_FILE
        self.problem = ""
        """Why the last :meth:`load` returned None ("" when it returned a snapshot)."""

    def save(self, step: int, tensors: dict[str, dict[str, torch.Tensor]], state: dict[str, Any],
             meta: dict[str, Any]) -> None:
        """Replace the snapshot with the state after ``step`` (an OSError, such as a full
        tmpfs, leaves the previous one)."""
        buffer = io.BytesIO()
        torch.save({"step": step, "tensors": tensors, "state": state, "meta": meta}, buffer)
        payload = buffer.getbuffer()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".snapshot-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + _HEADER.pack(hashlib.sha256(payload).digest(), len(payload)))
                f.write(payload)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> Snapshot | None:
        """The snapshot, or None (``problem`` says why) when there is none or it does not
        verify (short, torn, a wrong hash, unreadable)."""
        self.problem = ""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self.problem = f"{self.path}: no snapshot"
            return None
        except OSError as err:
            self.problem = f"{self.path}: cannot read ({os.strerror(err.errno or 0)})"
            return None
        start = len(MAGIC) + _HEADER.size
        if len(data) < start or data[: len(MAGIC)] != MAGIC:
            self.problem = f"{self.path}: not a snapshot ({len(data)} bytes, no header)"
            return None
        digest, length = _HEADER.unpack_from(data, len(MAGIC))
        payload = memoryview(data)[start:]
        if len(payload) != length:
            self.problem = f"{self.path}: torn ({len(payload)} bytes of payload, the header says {length})"
            return None
        if hashlib.sha256(payload).digest() != digest:
            self.problem = f"{self.path}: damaged (its sha256 does not match the header's)"
            return None
        try:
            found = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
            return Snapshot(int(found["step"]), found["tensors"], found["state"], dict(found["meta"]))
        except Exception as err:  # noqa: BLE001 - a snapshot that verifies but cannot be read is skipped the same way
            self.problem = f"{self.path}: cannot be loaded ({type(err).__name__}: {err})"
            return None
