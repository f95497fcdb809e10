"""The in-memory snapshot of the resumable state: what a restarted trainer resumes from when
it is newer than the last checkpoint, so a crash costs the step in progress, not a
checkpoint interval.

    store = SnapshotStore(directory)               # a tmpfs directory the supervisor owns
    store.save(step, tensors, state, meta)         # StateRegistry.capture() after each step
    found = store.load()                           # Snapshot(step, tensors, state, meta), or None
    store.problem                                  # why the last load found none ("" when it did)

It holds exactly what a checkpoint holds (:class:`~reasonrl.checkpoint.registry.StateRegistry`)
in one file, ``snapshot.pt``::

    MAGIC (8 bytes) | CRC-32 of the payload (4 bytes) | payload length (8 bytes, big-endian) | payload

the payload being ``torch.save({"step", "tensors", "state", "meta"})``. A save writes the spare
file ``.snapshot-next.pt`` and renames it over the old one, so a kill in the middle of a save
leaves the previous snapshot whole; the old one's file then becomes the spare, which the next
save overwrites in place: its memory pages are reused rather than freed and allocated again
(the whole save of a 19 MB state: about 15 ms, half of it with a fresh file each time and a
sha256). A file whose length or CRC does not match (torn, or damaged) is ignored, and the
trainer resumes from its checkpoint instead. The CRC guards against an accident, not an
attacker: the directory is the supervisor's own.

It is no checkpoint: it lives in memory (``/dev/shm``) and dies with the machine; nothing is
fsynced and the checkpoint interval and its guarantees stay as they are.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import torch

MAGIC = b"RRSNAP2\n"
SNAPSHOT_FILE = "snapshot.pt"
SPARE_FILE = ".snapshot-next.pt"
_HEADER = struct.Struct(">IQ")


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
        spare, old = self.directory / SPARE_FILE, self.directory / ".snapshot-old.pt"
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, MAGIC + _HEADER.pack(zlib.crc32(payload), len(payload)))
            view, done = memoryview(payload), 0
            while done < len(view):
                done += os.write(fd, view[done:])
            os.ftruncate(fd, len(MAGIC) + _HEADER.size + len(payload))
        finally:
            os.close(fd)
        old.unlink(missing_ok=True)
        if self.path.exists():
            os.link(self.path, old)  # the old snapshot's pages, kept for the next save
        os.replace(spare, self.path)
        if old.exists():
            os.replace(old, spare)

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
        crc, length = _HEADER.unpack_from(data, len(MAGIC))
        payload = memoryview(data)[start:]
        if len(payload) != length:
            self.problem = f"{self.path}: torn ({len(payload)} bytes of payload, the header says {length})"
            return None
        if zlib.crc32(payload) != crc:
            self.problem = f"{self.path}: damaged (its CRC-32 does not match the header's)"
            return None
        try:
            found = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
            return Snapshot(int(found["step"]), found["tensors"], found["state"], dict(found["meta"]))
        except Exception as err:  # noqa: BLE001 - a snapshot that verifies but cannot be read is skipped the same way
            self.problem = f"{self.path}: cannot be loaded ({type(err).__name__}: {err})"
            return None
