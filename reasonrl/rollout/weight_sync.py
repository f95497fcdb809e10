"""Delta weight sync: each version ships to a rollout worker only the elements that changed
since the version it holds.

    sender = WeightSender(torch.bfloat16)         # in the trainer's process, beside the fleet
    version = sender.version(update)              # the exact bf16 copy every worker is to hold
    message = sender.message(worker, version)     # a WeightsDelta, or the whole version
    sender.held(worker, version)                  # once the worker has it
    ... in the worker: held = apply_delta(held, message) or verify(message)

When the rollout side samples with bf16 weights (``model.dtype=bfloat16``, or
``train.precision=bf16-mixed``, whose fp32 parameters its matrix products see in bf16), most
of a version's elements are bit-identical to the last version's in bf16, even though the
trainer's fp32 parameters all moved: an element changes only when its AdamW step crosses a
bf16 rounding boundary. A version is then an exact bf16 copy of the trainer's parameters
(:func:`snapshot`) with a checksum (:func:`checksum`); the sender keeps the copy it shipped
last and encodes the next version against it (:func:`encode`), once per version, and gives
that delta to every worker that holds the base (by worker index and process id: a replaced
or new process holds nothing until it has loaded a whole version), the whole version to
every other worker. The worker applies the delta to the version it holds
(:func:`apply_delta`) and refuses it, with a :class:`WeightSyncError`, when it holds
another version or when the result's checksum is not the version's. Every worker thus
holds exactly the sender's copy, bit for bit.

Encoding, per parameter, over its elements' 16-bit patterns: the positions ``i`` where the
new pattern differs from the base's, split into blocks of ``BLOCK = 2^16`` elements::

    counts[b]  = |{i changed : i div 2^16 = b}|           int32, one per block
    offsets    = i mod 2^16 of each changed i, ascending   uint16 patterns (int16)
    values     = the new patterns at those i               int16
    bytes      = 4 * blocks + 4 * changed   (against 2 * size for the whole tensor)

so a changed element costs 4 bytes (an int32 index would make it 6), and a parameter whose
changes would cost at least its whole tensor ships whole. Other dtypes (fp32 rollout
weights, whose versions differ in nearly every element) ship whole as they are.
"""

from __future__ import annotations

import threading
import zlib
from typing import Hashable

import torch

from reasonrl.config import Config
from reasonrl.config.rules import ships_bf16_versions
from reasonrl.types import WeightsDelta, WeightsUpdate

BLOCK = 1 << 16
"""Elements per block of a delta: an element's position in its block fits 16 bits."""

SAME, DELTA, WHOLE = "same", "delta", "whole"
"""The kinds of a parameter in a :class:`~reasonrl.types.WeightsDelta`'s layout."""


class WeightSyncError(RuntimeError):
    """A delta that does not apply to the version a worker holds, or whose result is not the
    version it names (its checksum differs)."""


def sync_dtype(cfg: Config) -> torch.dtype | None:
    """The dtype the rollout weights ship in: bf16 when the rollout side samples with bf16
    weights (``model.dtype=bfloat16``, or ``train.precision=bf16-mixed``), so versions ship as
    deltas; None otherwise (the trainer's tensors, whole)."""
    return torch.bfloat16 if ships_bf16_versions(cfg) else None


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The flat 16-bit patterns of ``t`` (a view where ``t`` is contiguous)."""
    if t.element_size() != 2:
        raise ValueError(f"weight sync: a {t.dtype} tensor; deltas are made of 16-bit elements")
    return t.reshape(-1).view(torch.int16)


def checksum(tensors: dict[str, torch.Tensor]) -> int:
    """CRC-32 of a version: each parameter's name, shape and bytes, in name order."""
    crc = 0
    for name in sorted(tensors):
        t = tensors[name]
        crc = zlib.crc32(f"{name}{tuple(t.shape)}{t.dtype}".encode(), crc)
        crc = zlib.crc32(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def snapshot(update: WeightsUpdate, dtype: torch.dtype) -> WeightsUpdate:
    """An exact copy of ``update``'s tensors in ``dtype`` (round to nearest even), on the CPU
    and owned (never a view of the trainer's parameters), with its checksum."""
    tensors = {name: t.detach().to(device="cpu", dtype=dtype, copy=True).contiguous() for name, t in update.tensors.items()}
    return WeightsUpdate(update.version, tensors, checksum(tensors), update.kind)


def weights_bytes(message: WeightsUpdate | WeightsDelta) -> int:
    """The tensor bytes a message carries (names, shapes and pickling left out)."""
    if isinstance(message, WeightsDelta):
        return sum(t.numel() * t.element_size() for t in (message.counts, message.offsets, message.values))
    return sum(t.numel() * t.element_size() for t in message.tensors.values())


def _as_uint16_bits(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^16) as int16 tensors holding their unsigned bit patterns."""
    return (x - ((x >> 15) << 16)).to(torch.int16)


def encode(base: WeightsUpdate, new: WeightsUpdate) -> WeightsDelta:
    """``new`` as its changes from ``base`` (both checksummed versions of the same parameters,
    16-bit, on the CPU): see the module docstring."""
    if base.checksum is None or new.checksum is None:
        raise ValueError("weight sync: encode takes checksummed versions (snapshot())")
    if list(base.tensors) != list(new.tensors):
        raise ValueError(f"weight sync: version {new.version} has other parameters than version {base.version}")
    layout: list[tuple[str, str, int]] = []
    counts, offsets, values = [], [], []
    for name, t in new.tensors.items():
        old = base.tensors[name]
        if old.shape != t.shape or old.dtype != t.dtype:
            raise ValueError(f"weight sync: {name} is {t.dtype}{tuple(t.shape)} in version {new.version}, "
                             f"{old.dtype}{tuple(old.shape)} in version {base.version}")
        now = _bits(t)
        differs = _bits(old) != now
        size, k = now.numel(), int(differs.sum())
        blocks = -(-size // BLOCK)
        if k == 0:
            layout.append((name, SAME, 0))
        elif 4 * blocks + 4 * k < 2 * size:
            changed = torch.nonzero(differs).squeeze(1)
            layout.append((name, DELTA, k))
            counts.append(torch.bincount(changed >> 16, minlength=blocks).to(torch.int32))
            offsets.append(_as_uint16_bits(changed & (BLOCK - 1)))
            values.append(now[changed])
        else:
            layout.append((name, WHOLE, size))
            values.append(now)
    cat = lambda parts, dtype: torch.cat(parts) if parts else torch.empty(0, dtype=dtype)  # noqa: E731
    return WeightsDelta(new.version, new.checksum, base.version, base.checksum, layout,
                        cat(counts, torch.int32), cat(offsets, torch.int16), cat(values, torch.int16))


def apply_delta(held: WeightsUpdate | None, delta: WeightsDelta) -> WeightsUpdate:
    """The version ``delta`` makes from ``held`` (left as it is: changed parameters are new
    tensors, unchanged ones shared), its checksum verified. Raises WeightSyncError when
    ``held`` is not the delta's base or the result's checksum is not the version's."""
    holds = "no version" if held is None else f"version {held.version} (checksum {held.checksum})"
    if held is None or (held.version, held.checksum) != (delta.base, delta.base_checksum):
        raise WeightSyncError(f"weights version {delta.version}: a delta against version {delta.base} (checksum "
                              f"{delta.base_checksum}), but this worker holds {holds}; it needs the whole version")
    names = [name for name, _, _ in delta.layout]
    if sorted(names) != sorted(held.tensors):
        raise WeightSyncError(f"weights version {delta.version}: the delta's parameters are not those of {holds}")
    tensors: dict[str, torch.Tensor] = {}
    c = o = v = 0
    for name, kind, k in delta.layout:
        old = held.tensors[name]
        if kind == SAME:
            tensors[name] = old
        elif kind == WHOLE:
            tensors[name] = delta.values[v : v + k].view(old.dtype).view(old.shape)
            v += k
        else:
            blocks = -(-old.numel() // BLOCK)
            per_block = delta.counts[c : c + blocks].long()
            at = torch.repeat_interleave(torch.arange(blocks) * BLOCK, per_block) + (delta.offsets[o : o + k].long() & 0xFFFF)
            t = old.clone()
            _bits(t)[at] = delta.values[v : v + k]
            tensors[name] = t
            c, o, v = c + blocks, o + k, v + k
    made = WeightsUpdate(delta.version, tensors, checksum(tensors), held.kind)
    if made.checksum != delta.checksum:
        raise WeightSyncError(f"weights version {delta.version}: the delta applied to version {delta.base} gives "
                              f"checksum {made.checksum}, expected {delta.checksum}")
    return made


def verify(update: WeightsUpdate) -> WeightsUpdate:
    """``update`` when its tensors' checksum is the one it carries, else WeightSyncError."""
    got = checksum(update.tensors)
    if got != update.checksum:
        raise WeightSyncError(f"weights version {update.version}: checksum {got}, expected {update.checksum}")
    return update


class WeightSender:
    """The trainer's side of weight sync to rollout workers holding weights of their own.

    ``dtype`` (:func:`sync_dtype`): each version becomes an exact copy in it (:meth:`version`),
    the delta from the previous copy is encoded once, and :meth:`message` gives it to a
    worker recorded (:meth:`held`) as holding that previous copy, the whole copy to any
    other. None: versions ship as the trainer's tensors, whole (the fp32 path). Workers are
    named by ``(index, pid)``, so a replaced process is a new worker. Thread-safe.
    """

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.dtype = dtype
        self._latest: WeightsUpdate | None = None
        self._delta: WeightsDelta | None = None
        self._held: dict[Hashable, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def version(self, update: WeightsUpdate) -> WeightsUpdate:
        """The version to ship for the trainer's ``update``: its copy in ``dtype`` (the base of
        the next delta), or ``update`` itself without a dtype."""
        if self.dtype is None:
            return update
        copy = snapshot(update, self.dtype)
        with self._lock:
            base = self._latest
        delta = encode(base, copy) if base is not None else None
        with self._lock:
            self._latest, self._delta = copy, delta
        return copy

    def message(self, worker: Hashable, update: WeightsUpdate) -> WeightsUpdate | WeightsDelta:
        """What ``worker`` is sent for ``update`` (a :meth:`version`): the delta when ``update``
        is the newest version and the worker holds the one before it, else ``update`` whole."""
        with self._lock:
            delta = self._delta
            if (delta is not None and update is self._latest
                    and self._held.get(worker) == (delta.base, delta.base_checksum)):
                return delta
        return update

    def held(self, worker: Hashable, update: WeightsUpdate) -> None:
        """Record that ``worker`` holds ``update`` (it answered the call that sent it)."""
        if update.checksum is not None:
            with self._lock:
                self._held[worker] = (update.version, update.checksum)

    def keep(self, workers: list[Hashable]) -> None:
        """Forget every worker not in ``workers`` (processes that were replaced)."""
        with self._lock:
            self._held = {w: v for w, v in self._held.items() if w in workers}
