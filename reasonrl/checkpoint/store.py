"""Atomic, validated checkpoints of the whole resumable training state.

Layout of ``root`` (a run directory's ``checkpoints/``)::

    step_N/
      <part>.safetensors    one per entry of ``tensors`` ("policy", "reference", "critic")
      state.pt              everything else; torch.save, read back with weights_only=True
      manifest.json         format, format_version, step, parts, size and sha256 of each file
      COMMITTED             sha256 of manifest.json; written last
    .tmp-step_N-<pid>-<hex>/  a checkpoint being written, replaced or deleted by process <pid>

A checkpoint is *committed* when its ``COMMITTED`` marker holds the sha256 of its
``manifest.json``, and *valid* when, in addition, every file the manifest lists has the
recorded size and sha256. Only valid checkpoints are ever loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from reasonrl.errors import error_line
from reasonrl.pids import pid_alive

FORMAT = "reasonrl-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MARKER = "COMMITTED"
STATE_FILE = "state.pt"

_STEP_RE = re.compile(r"step_(0|[1-9][0-9]*)")
_TMP_RE = re.compile(r"\.tmp-step_[0-9]+-([0-9]+)-[0-9a-f]+")
_PART_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_CHUNK = 8 << 20
_LEAVES = frozenset(
    {type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device,
     torch.Size, torch.Tensor, torch.nn.Parameter}
)
_MAPPINGS = frozenset({dict, OrderedDict, Counter})
_SEQUENCES = frozenset({list, tuple, set})

log = logging.getLogger(__name__)

# ``.tmp-*`` directories this process is writing or deleting right now: the stale-directory
# sweep must spare them even though their pid (ours) is alive.
_in_flight: set[Path] = set()


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; every previously committed checkpoint is intact.
    ``cause`` says why in words ("no space left on device", "permission denied", ...)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def _cause(err: BaseException) -> str:
    """Why a write failed, in words: the OS error's text, or the exception's first line."""
    if isinstance(err, OSError) and err.errno is not None:
        return os.strerror(err.errno).lower()
    return error_line(err)


class _RecordingFile:
    """A binary file that remembers the first OSError of a write: ``torch.save`` turns a failed
    write (disk full) into an opaque ``RuntimeError: ... unexpected pos``; the recorded error
    is what the caller reports instead."""

    def __init__(self, f) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


class CheckpointCorruptError(RuntimeError):
    """A checkpoint is uncommitted, incomplete or damaged; the message names the file."""


class CheckpointInfo(NamedTuple):
    """One ``step_N`` directory as ``list_checkpoints`` sees it; ``reason`` is "" when valid."""

    step: int
    path: Path
    valid: bool
    reason: str


class CheckpointWriter:
    """Writes committed checkpoints ``root/step_N`` atomically, keeping the newest ``keep``."""

    def __init__(self, root: Path, keep: int) -> None:
        if type(keep) is not int or keep < 1:
            raise ValueError(f"keep: expected an int >= 1, got {keep!r}")
        self.root = Path(root)
        self.keep = keep

    def save(self, step: int, tensors: dict[str, dict[str, torch.Tensor]], state: dict[str, Any]) -> Path:
        """Write ``root/step_<step>`` atomically and return its path.

        ``tensors`` maps a part name to a state dict, saved as ``<part>.safetensors`` from
        contiguous CPU clones (so tied or shared tensors are saved once per name). ``state``
        holds everything else and may only contain what ``torch.load(weights_only=True)``
        reads back: tensors, dicts, lists, tuples, sets, str, int, float, bool, None (a
        TypeError names the first offending key before anything is written).

        Files go to a ``.tmp-`` directory, are fsynced, and the directory is renamed to
        ``step_<step>`` (an existing one is renamed aside first and deleted after); the
        ``COMMITTED`` marker is written last. Then retention keeps the newest ``keep``
        committed checkpoints with a step <= ``step``: older ones, uncommitted ones, and
        newer ones (left by a timeline the run rolled back from) are deleted, as are
        ``.tmp-`` directories of dead writers.

        On any failure while writing (an OSError such as a full disk or a missing permission, or
        an exception from the serialiser) the temporary directory is removed, earlier
        checkpoints are untouched, and CheckpointWriteError names the checkpoint path and the
        cause in words.
        """
        root = self.root
        _check_arguments(step, tensors, state)
        final = root / f"step_{step}"
        tmp = _new_tmp_path(root, step)
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            marker = self._write_contents(tmp, step, tensors, state)
            self._publish(tmp, step, marker)
        except Exception as err:  # noqa: BLE001 - any failure leaves the committed checkpoints as they were
            raise CheckpointWriteError(f"cannot write checkpoint {final}: {err}", _cause(err)) from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            _in_flight.discard(tmp)
        _apply_retention(root, step, self.keep)
        return final

    def write_file(self, path: Path, write: Callable[[Any], Any]) -> None:
        """Create ``path``, fill it with ``write(file)``, and fsync it; a failed write is raised
        as its OSError, whatever ``write`` made of it."""
        try:
            with self.open_file(path) as raw:
                f = _RecordingFile(raw)
                try:
                    write(f)
                except Exception:
                    if f.error is not None:
                        raise f.error from None
                    raise
                raw.flush()
                os.fsync(raw.fileno())
        except OSError as err:
            if err.filename is None:
                err.filename = str(path)
            raise

    def open_file(self, path: Path):
        """A new binary file at ``path`` for one part of a checkpoint (exclusive create)."""
        return open(path, "xb")

    def _write_contents(self, tmp: Path, step: int, tensors: dict, state: dict) -> bytes:
        """Write the parts, state.pt and manifest.json into ``tmp``; return the marker bytes."""
        for part, state_dict in tensors.items():
            clones = {
                name: t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
                for name, t in state_dict.items()
            }
            data = safetensors_bytes(clones)
            del clones
            self.write_file(tmp / f"{part}.safetensors", lambda f: f.write(data))
            del data
        self.write_file(tmp / STATE_FILE, lambda f: torch.save(state, f))
        names = [f"{part}.safetensors" for part in tensors] + [STATE_FILE]
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": step,
            "parts": sorted(tensors),
            "files": {name: _describe(tmp / name) for name in names},
        }
        raw = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
        self.write_file(tmp / MANIFEST, lambda f: f.write(raw))
        fsync_dir(tmp)
        return hashlib.sha256(raw).hexdigest().encode() + b"\n"

    def _publish(self, tmp: Path, step: int, marker: bytes) -> None:
        """Rename ``tmp`` to ``root/step_<step>`` and commit it; on failure restore the old one."""
        root = self.root
        final = root / f"step_{step}"
        aside = None
        if os.path.lexists(final):
            aside = _new_tmp_path(root, step)
            os.rename(final, aside)
        try:
            os.rename(tmp, final)
            try:
                self.write_file(final / MARKER, lambda f: f.write(marker))
                fsync_dir(final)
                fsync_dir(root)
            except BaseException:
                os.rename(final, tmp)
                raise
        except BaseException:
            if aside is not None:
                os.rename(aside, final)
                _in_flight.discard(aside)
            raise
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
            _in_flight.discard(aside)


def find_latest(root: Path) -> Path | None:
    """The newest ``step_N`` under ``root`` that is committed and valid, or None.

    Newer directories that are uncommitted or damaged are skipped; ``list_checkpoints``
    says why.
    """
    for step, path in _step_dirs(Path(root)):
        try:
            _verify(path, step)
        except CheckpointCorruptError:
            continue
        return path
    return None


def latest_committed_step(root: Path) -> int:
    """The step of the newest committed ``step_N`` under ``root`` (its marker matches its
    manifest; the files are not read), or -1 when there is none."""
    return next((step for step, path in _step_dirs(Path(root)) if _is_committed(path)), -1)


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Every ``step_N`` directory under ``root``, oldest first, fully validated."""
    infos = []
    for step, path in reversed(_step_dirs(Path(root))):
        try:
            _verify(path, step)
        except CheckpointCorruptError as err:
            infos.append(CheckpointInfo(step, path, False, str(err)))
        else:
            infos.append(CheckpointInfo(step, path, True, ""))
    return infos


def load_checkpoint(
    path: Path,
) -> tuple[int, dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """Validate and load a checkpoint directory: ``(step, tensors, state)``, all on CPU.

    Raises CheckpointCorruptError naming the file and what is wrong when the checkpoint
    is uncommitted, incomplete or damaged.
    """
    path = Path(path)
    manifest = _verify(path)
    tensors = {}
    for part in manifest["parts"]:
        tensors[part] = _load(path / f"{part}.safetensors", load_file)
    state = _load(
        path / STATE_FILE, lambda f: torch.load(f, map_location="cpu", weights_only=True)
    )
    return manifest["step"], tensors, state


def load_state(path: Path) -> dict[str, Any]:
    """The state file of the checkpoint directory ``path`` alone (its tensors memory-mapped, not
    read; the caller verified the checkpoint, e.g. with :func:`find_latest`)."""
    return _load(Path(path) / STATE_FILE,
                 lambda f: torch.load(f, map_location="cpu", weights_only=True, mmap=True))


def _check_arguments(step: int, tensors: dict, state: dict) -> None:
    """Reject bad arguments before anything touches the disk."""
    if type(step) is not int or step < 0:
        raise ValueError(f"step: expected an int >= 0, got {step!r}")
    for part, state_dict in tensors.items():
        if not isinstance(part, str) or not _PART_RE.fullmatch(part):
            raise ValueError(f"tensors: part name {part!r} must match {_PART_RE.pattern}")
        for name, tensor in state_dict.items():
            if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                raise TypeError(
                    f"tensors[{part!r}][{name!r}]: expected str -> torch.Tensor, "
                    f"got {type(name).__name__} -> {type(tensor).__name__}"
                )
    if not isinstance(state, dict):
        raise TypeError(f"state: expected a dict, got {type(state).__name__}")
    _check_loadable(state, "state")


def _check_loadable(obj: Any, where: str) -> None:
    """Raise TypeError unless torch.load(weights_only=True) can read ``obj`` back."""
    kind = type(obj)
    if kind in _LEAVES:
        return
    if kind in _MAPPINGS:
        for key, value in obj.items():
            _check_loadable(key, f"{where} (key {key!r})")
            _check_loadable(value, f"{where}[{key!r}]")
    elif kind in _SEQUENCES:
        for index, item in enumerate(obj):
            _check_loadable(item, f"{where}[{index}]")
    else:
        raise TypeError(
            f"{where}: {kind.__module__}.{kind.__qualname__} cannot be read back by "
            "torch.load(weights_only=True); expected tensors, dicts, lists, tuples, sets, "
            "str, int, float, bool or None (convert numpy arrays with torch.from_numpy or "
            ".tolist())"
        )


def _apply_retention(root: Path, step: int, keep: int) -> None:
    """Keep the newest ``keep`` committed checkpoints at or below ``step``; sweep the rest.

    Failures here are logged, not raised: the new checkpoint is already committed.
    """
    kept = 0
    for other, path in _step_dirs(root):
        if other <= step and kept < keep and _is_committed(path):
            kept += 1
            continue
        trash = _new_tmp_path(root, other)
        try:
            os.rename(path, trash)
        except OSError as err:
            log.warning("checkpoint retention: cannot remove %s: %s", path, err)
        _in_flight.discard(trash)
    for entry in root.iterdir():
        match = _TMP_RE.fullmatch(entry.name)
        if match and entry not in _in_flight and not _writer_alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            if os.path.lexists(entry):
                log.warning("checkpoint retention: cannot remove %s", entry)


def _writer_alive(pid: int) -> bool:
    """Whether the process that named a ``.tmp-`` directory may still be writing it.

    Our own pid counts as dead: our live directories are in ``_in_flight``, and a
    restarted run often gets the pid of the run that was killed (containers).
    """
    return pid != os.getpid() and pid_alive(pid)


def _new_tmp_path(root: Path, step: int) -> Path:
    """A fresh ``.tmp-step_N-<pid>-<hex>`` path, registered as in flight."""
    path = root / f".tmp-step_{step}-{os.getpid()}-{secrets.token_hex(6)}"
    _in_flight.add(path)
    return path


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_N`` entry under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_RE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def _is_committed(path: Path) -> bool:
    """Cheap check: the marker matches the manifest (file hashes are not read)."""
    try:
        _read_manifest(path)
    except CheckpointCorruptError:
        return False
    return True


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a committed checkpoint; CheckpointCorruptError otherwise."""
    marker_path, manifest_path = path / MARKER, path / MANIFEST
    if not marker_path.is_file():
        raise CheckpointCorruptError(f"{marker_path}: missing, the checkpoint was not committed")
    try:
        marker = marker_path.read_bytes().strip().decode("ascii", "replace")
        raw = manifest_path.read_bytes()
    except OSError as err:
        raise CheckpointCorruptError(f"{path}: cannot read: {err}") from err
    if hashlib.sha256(raw).hexdigest() != marker:
        raise CheckpointCorruptError(
            f"{marker_path}: {marker!r} is not the sha256 of {manifest_path}"
        )
    try:
        manifest = json.loads(raw)
        if manifest["format"] != FORMAT or manifest["format_version"] != FORMAT_VERSION:
            raise CheckpointCorruptError(
                f"{manifest_path}: format {manifest['format']!r} version "
                f"{manifest['format_version']!r}, expected {FORMAT!r} version {FORMAT_VERSION}"
            )
        files = manifest["files"]
        expected = {f"{part}.safetensors" for part in manifest["parts"]} | {STATE_FILE}
        if (
            set(files) != expected
            or type(manifest["step"]) is not int
            or any(type(m["size"]) is not int or type(m["sha256"]) is not str
                   for m in files.values())
        ):
            raise CheckpointCorruptError(f"{manifest_path}: malformed: {manifest!r:.200}")
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointCorruptError(f"{manifest_path}: malformed: {err!r}") from err
    return manifest


def _verify(path: Path, step: int | None = None) -> dict[str, Any]:
    """Full validation: committed, the expected step, every file's size and sha256."""
    manifest = _read_manifest(path)
    if step is not None and manifest["step"] != step:
        raise CheckpointCorruptError(
            f"{path / MANIFEST}: step {manifest['step']}, expected {step} from the directory name"
        )
    files = manifest["files"]
    for name, meta in files.items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{path / name}: missing") from None
        if size != meta["size"]:
            raise CheckpointCorruptError(
                f"{path / name}: {size} bytes, the manifest says {meta['size']}"
            )
    for name, meta in files.items():
        digest = _describe(path / name)["sha256"]
        if digest != meta["sha256"]:
            raise CheckpointCorruptError(
                f"{path / name}: sha256 {digest} does not match the manifest's {meta['sha256']}"
            )
    return manifest


def _load(path: Path, reader: Callable[[Path], Any]) -> Any:
    """Run ``reader`` on a verified file, reporting any failure as corruption of that file (its
    message on one line: torch.load's run over several)."""
    try:
        return reader(path)
    except Exception as err:
        raise CheckpointCorruptError(f"{path}: cannot be loaded: {' '.join(str(err).split())}") from err


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _describe(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}
