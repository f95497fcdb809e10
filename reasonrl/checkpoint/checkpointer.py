"""One run directory's checkpoints: save, resume, roll back, and the check that a checkpoint
belongs to this run.

    ckpt = Checkpointer(cfg, run_dir, registry, writer, events, fingerprint, log, snapshots=store)
    step = ckpt.resume()                  # 0 for a new run; ResumeError before anything is restored
    ckpt.emit_resume(step)                # its events, once the run may write
    ckpt.snapshot(step, last, due)        # after a step: the in-memory snapshot (with snapshots)
    last = ckpt.catch_up(step, last)      # after a resume from a snapshot: its checkpoint, if one was due
    if ckpt.due(step, last): ckpt.save(step, final=...)
    ckpt.rollback(step, reason)           # restore the newest valid checkpoint's weights and optimizers

The registry's ``run`` entry is the checkpointer itself (:meth:`state_dict`): the config hash
and the data fingerprint a resume must match, and ``updates_applied``, the count of updates
that stand (a rollback restores it with the weights).

With a :class:`~reasonrl.checkpoint.snapshot.SnapshotStore`, :meth:`resume` takes the snapshot
when it is at least as new as the newest committed checkpoint, without reading the checkpoint's
files; a snapshot that does not verify is skipped (a ``snapshot_skipped`` event).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from reasonrl.checkpoint.registry import StateRegistry
from reasonrl.checkpoint.snapshot import Snapshot, SnapshotStore
from reasonrl.checkpoint.store import (CheckpointCorruptError, CheckpointInfo, CheckpointWriteError, CheckpointWriter,
                                      find_latest, latest_committed_step, list_checkpoints, load_checkpoint,
                                      load_state)
from reasonrl.config import RESUME_MAY_CHANGE, Config, config_hash
from reasonrl.data.sources import source_name
from reasonrl.errors import LimitError, ResumeError, error_line
from reasonrl.metrics import EventLog
from reasonrl.types import Prompt

RUN_ENTRY = "controller"
"""The registry name of the checkpointer's own state (kept for the checkpoints on disk)."""


def data_fingerprint(prompts: list[Prompt]) -> str:
    """sha256 (hex) of the training prompts (id, text, ground truth, in order): what a
    checkpoint was trained on, so a resume on other data is noticed."""
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(json.dumps([p.id, p.text, p.ground_truth], sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def check_data(cfg: Config, run_dir: Path, fingerprint: str, recorded: str) -> bool:
    """Whether the training data of ``fingerprint`` differs from the ``recorded`` one a
    checkpoint of ``run_dir`` was trained on; ResumeError when it does and
    ``resume.allow_data_change`` is off (the resume's refusal, and ``--dry-run``'s)."""
    if recorded == fingerprint:
        return False
    if not cfg.resume.allow_data_change:
        raise ResumeError(
            f"{run_dir}: the training data differs from the data the checkpoint was trained on "
            f"({source_name(cfg.data.source)}: fingerprint {fingerprint[:12]}, checkpoint "
            f"{recorded[:12]}); to continue on the new data anyway, add "
            "resume.allow_data_change=true; otherwise use a new run.dir")
    return True


def recorded_fingerprint(checkpoint: Path) -> str | None:
    """The data fingerprint the valid checkpoint directory ``checkpoint`` was trained on (its
    state file alone, tensors memory-mapped, not read); None when it records none."""
    return load_state(checkpoint).get(RUN_ENTRY, {}).get("data_fingerprint")


class Checkpointer:
    """Checkpoints of ``run_dir`` holding ``registry`` (restored in its order, this object's
    state first), written by ``writer``; ``fingerprint`` identifies the training data;
    ``beat(stage)`` tells the hang watchdog a checkpoint is being written; ``snapshots`` keeps
    the in-memory snapshot (None: none)."""

    def __init__(self, cfg: Config, run_dir: Path, registry: StateRegistry, writer: CheckpointWriter, events: EventLog,
                 fingerprint: str, log: Callable[[str], None] = print, beat: Callable[[str], None] = lambda stage: None,
                 initial: str = "the initial weights", snapshots: SnapshotStore | None = None) -> None:
        self.cfg, self.run_dir, self.registry, self.writer, self.events = cfg, Path(run_dir), registry, writer, events
        self.fingerprint, self.log, self.beat, self.initial = fingerprint, log, beat, initial
        self.snapshots = snapshots
        self.from_snapshot: dict[str, Any] | None = None
        """The ``meta`` of the snapshot :meth:`resume` loaded, if it loaded one."""
        self.snapshot_problem = ""
        """Why :meth:`resume` skipped a snapshot that was there but did not verify."""
        self.root = self.run_dir / "checkpoints"
        self.updates_applied = 0
        """Steps whose update was applied and not undone by a rollback."""
        self.resumed_from: Path | None = None
        """The checkpoint :meth:`resume` loaded, if any."""
        self.skipped: list = []
        """Newer checkpoints :meth:`resume` found invalid (events once the resume check passed)."""
        self.data_changed: str | None = None
        """The checkpoint's data fingerprint when it differs and resume.allow_data_change allowed it."""
        registry.add(RUN_ENTRY, self)

    def due(self, step: int, last_checkpoint: float) -> bool:
        """After ``step``: every checkpoint.every_steps steps, every checkpoint.every_minutes
        minutes of training, and at the last step."""
        c = self.cfg.checkpoint
        return (
            step == self.cfg.train.total_steps
            or (c.every_steps > 0 and step % c.every_steps == 0)
            or (c.every_minutes > 0 and time.time() - last_checkpoint >= 60 * c.every_minutes)
        )

    def save(self, step: int, final: bool) -> None:
        """Save the registry at ``step``. A failed write (disk full, permissions, the
        serialiser) leaves the previous checkpoints intact and is a ``checkpoint_failed`` event
        with its cause in words; training goes on. The final one is tried
        checkpoint.final_retries times (waiting 1 s, 2 s, ...) and then a LimitError."""
        attempts = self.cfg.checkpoint.final_retries if final else 1
        for attempt in range(1, attempts + 1):
            self.beat("checkpoint")
            try:
                path = self.writer.save(step, *self.registry.capture())
            except CheckpointWriteError as err:
                self.events.emit("checkpoint_failed", step, error=str(err), cause=err.cause, attempt=attempt, final=final)
                print(f"reasonrl: {err}; {self.left()}", file=sys.stderr)
                if attempt == attempts:
                    if final:
                        raise LimitError(f"the final checkpoint could not be written in {attempts} attempts ({err.cause}): "
                                         f"{err}; {self.left()}") from err
                    return
                time.sleep(2 ** (attempt - 1))
                continue
            self.events.emit("checkpoint", step, path=str(path))
            return

    def left(self) -> str:
        """What a rerun would resume from, in words: the newest committed checkpoint, or none."""
        latest = find_latest(self.root) if self.root.exists() else None
        if latest is None:
            return "no checkpoint of this run has been written, so a rerun starts from the beginning"
        return f"the previous checkpoint ({latest}) is intact and a rerun resumes from it"

    def resume(self) -> int:
        """Load the newer of the snapshot and the newest committed checkpoint that verifies and
        loads, and return its step (0: neither); refuse an incompatible config or changed data
        (ResumeError) before anything is restored or written. A snapshot at least as new as the
        newest committed checkpoint is taken without reading any checkpoint. A newer checkpoint
        that is damaged, or whose files match their hashes but do not load (``state.pt`` refused
        by ``torch.load``), is passed over for the one before it (a ``checkpoint_skipped`` event
        each, once the resume passed its check); when every checkpoint is passed over, none is
        older than a snapshot, and one of them verified, a ResumeError names it (a restart would
        meet it again)."""
        snapshot = self.snapshots.load() if self.snapshots is not None else None
        if self.snapshots is not None and snapshot is None and self.snapshots.path.exists():
            self.snapshot_problem = self.snapshots.problem
        if snapshot is not None and snapshot.step >= latest_committed_step(self.root):
            return self._restore_snapshot(snapshot)
        infos = list_checkpoints(self.root) if self.root.exists() else []
        self.skipped = [i for i in infos if not i.valid]
        path, step, tensors, state, unloadable = self._load_newest(infos)
        self.skipped += unloadable
        self.skipped.sort(key=lambda info: info.step)
        if snapshot is not None and (path is None or step < snapshot.step):
            self.skipped = []
            return self._restore_snapshot(snapshot)
        self.resumed_from = path
        if path is None:
            if unloadable:
                raise ResumeError(f"{unloadable[-1].reason}; its files match their manifest, and no earlier checkpoint "
                                  f"loads either: move {unloadable[-1].path} aside to start this run over, or use a new run.dir")
            return 0
        self._restore(path, tensors, state)
        return step

    def _restore_snapshot(self, snapshot: Snapshot) -> int:
        self.resumed_from = self.snapshots.path
        self._restore(self.snapshots.path, snapshot.tensors, snapshot.state)
        self.from_snapshot = snapshot.meta
        return snapshot.step

    def _restore(self, path: Path, tensors: dict, state: dict) -> None:
        if RUN_ENTRY not in state:
            raise ResumeError(f"{path}: written by an older reasonrl (no '{RUN_ENTRY}' state); use a new run.dir")
        try:
            self.registry.restore(tensors, state)
        except (RuntimeError, KeyError, ValueError) as err:  # in memory: a restart would meet it again
            raise ResumeError(f"{path}: does not fit this run ({error_line(err)}); it was written for another model "
                              "(another model.path, or a warm start of another reasonrl version); use a new run.dir") from err

    def snapshot(self, step: int, last_checkpoint: float, due: bool) -> None:
        """Replace the in-memory snapshot with the registry after ``step``, with the time of the last checkpoint and whether one is ``due`` at this step (so that a
        resume from it keeps the checkpoint schedule: :meth:`catch_up`). A failed write (a full
        tmpfs) is a ``snapshot_failed`` event and training goes on. Nothing without snapshots."""
        if self.snapshots is None:
            return
        meta = {"time": time.time(), "checkpoint_time": last_checkpoint, "checkpoint_due": bool(due)}
        try:
            self.snapshots.save(step, *self.registry.capture(), meta)
        except OSError as err:
            self.events.emit("snapshot_failed", step, error=f"{self.snapshots.path}: {error_line(err)}")

    def catch_up(self, step: int, last_checkpoint: float) -> float:
        """After :meth:`resume`: the time of the last checkpoint, for :meth:`due`. A resume from
        a snapshot gives the snapshot's, and writes the checkpoint that was due at its step when
        none of that step is committed (the trainer died before or while writing it): the
        checkpoint schedule is the one an uninterrupted run keeps."""
        meta = self.from_snapshot
        if meta is None:
            return last_checkpoint
        if meta["checkpoint_due"] and latest_committed_step(self.root) != step:
            self.save(step, final=step == self.cfg.train.total_steps)
            return time.time()
        return meta["checkpoint_time"]

    def _load_newest(self, infos: list[CheckpointInfo]):
        """``(path, step, tensors, state, passed over)`` of the newest checkpoint of ``infos``
        that verified and loads (path None when none does); ``passed over``: the verified ones
        newer than it that did not load, each with why."""
        unloadable = []
        for info in reversed([i for i in infos if i.valid]):
            try:
                step, tensors, state = load_checkpoint(info.path)
            except CheckpointCorruptError as err:
                unloadable.append(CheckpointInfo(info.step, info.path, False, str(err)))
                continue
            return info.path, step, tensors, state, unloadable
        return None, 0, {}, {}, unloadable

    def emit_resume(self, step: int) -> None:
        """The events of a resume that passed its check (nothing is written before it)."""
        for info in self.skipped:
            self.events.emit("checkpoint_skipped", info.step, path=str(info.path), reason=info.reason)
        if self.snapshot_problem:
            self.events.emit("snapshot_skipped", step, reason=self.snapshot_problem)
        if self.data_changed is not None:
            self.events.emit("data_changed", step, fingerprint=self.fingerprint, checkpoint=self.data_changed)
        if self.resumed_from is None:
            self.events.emit("resume", 0, from_step=0, path=None)
            return
        if self.from_snapshot is not None:
            self.events.emit("resume", step, from_step=step, path=str(self.resumed_from), source="snapshot",
                             state_time=self.from_snapshot["time"])
        else:
            self.events.emit("resume", step, from_step=step, path=str(self.resumed_from), source="checkpoint")
        self.log(f"resumed from {self.resumed_from} (step {step})")
        total = self.cfg.train.total_steps
        if step >= total:
            self.log(f"{self.run_dir}: the run is already complete ({step} of {total} steps); nothing to train "
                     "(raise train.total_steps to go on)")

    def rollback(self, step: int, reason: str) -> None:
        """Restore the weights and optimizers from the newest checkpoint that verifies and loads
        (or the initial weights), keeping the step counter, sampler and RNG: the offending
        batches are skipped."""
        began = time.time()
        path, from_step, tensors, state, unloadable = self._load_newest(list_checkpoints(self.root))
        for info in unloadable:
            self.events.emit("checkpoint_skipped", info.step, path=str(info.path), reason=info.reason)
        if path is None:
            for role in self.registry.rollback_entries:
                role.reset()
            self.updates_applied = 0
        else:
            self.registry.restore(tensors, state, rollback=True)
            self.updates_applied = state[RUN_ENTRY]["updates_applied"]
        self.events.emit("rollback", step, reason=reason, to=str(path or self.initial), from_step=from_step,
                         recover_s=time.time() - began)

    def state_dict(self) -> dict[str, Any]:
        """``config_hash`` and ``data_fingerprint``: a resume must match them;
        ``updates_applied``: the count of updates that stand."""
        return {"config_hash": config_hash(self.cfg), "data_fingerprint": self.fingerprint,
                "updates_applied": self.updates_applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["config_hash"] != config_hash(self.cfg):
            raise ResumeError(
                f"{self.run_dir}: the checkpoint was written with a different configuration "
                f"(hash {state['config_hash'][:12]} vs {config_hash(self.cfg)[:12]}); a resume may change only "
                f"{', '.join(RESUME_MAY_CHANGE)}. Use a new run.dir."
            )
        if "data_fingerprint" not in state or "updates_applied" not in state:
            raise ResumeError(f"{self.run_dir}: the checkpoint was written by an older reasonrl (no data fingerprint); "
                              "use a new run.dir")
        if check_data(self.cfg, self.run_dir, self.fingerprint, state["data_fingerprint"]):
            self.data_changed = state["data_fingerprint"]
        self.updates_applied = int(state["updates_applied"])
