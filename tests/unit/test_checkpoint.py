"""Checkpoint store and RNG capture: round trips, retention, corruption, write failures."""

from __future__ import annotations

import errno
import os
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from reasonrl.checkpoint import (
    CheckpointCorruptError,
    CheckpointWriteError,
    capture_rng,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    CheckpointWriter,
)
from reasonrl.checkpoint import store


def _parts(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {
        "policy": {
            "w": torch.randn(4, 3, generator=g),
            "w_t": torch.randn(3, 5, generator=g).t(),
            "bf16": torch.randn(6, generator=g).to(torch.bfloat16),
            "ids": torch.arange(7, dtype=torch.int64),
            "mask": torch.tensor([True, False]),
            "scalar": torch.tensor(seed, dtype=torch.float64),
            "empty": torch.zeros(0, 2),
            "special": torch.tensor([float("nan"), -0.0, float("inf")]),
        },
        "reference": {"w": torch.randn(2, 2, generator=g)},
    }


def _state(seed: int) -> dict:
    return {
        "counters": {"step": seed, "samples": 10 * seed},
        "lr": 3e-4,
        "config_hash": "abc123",
        "done": False,
        "nothing": None,
        "betas": (0.9, 0.999),
        "nested": [{"t": torch.full((3,), float(seed))}, [1, 2.5, "x"], OrderedDict(a=1)],
        "int_keys": {0: torch.ones(2), 1: [torch.zeros(1)]},
        "blob": b"\x00\x01",
        "seen": {1, 2},
        "rng": capture_rng(),
    }


def _assert_same(a, b) -> None:
    """Recursive equality: tensors bit-equal with the same dtype and shape, types kept."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _save(root: Path, step: int, keep: int = 3) -> Path:
    return CheckpointWriter(root, keep).save(step, _parts(step), _state(step))


def test_round_trip_tensors_and_state(tmp_path: Path) -> None:
    parts, state = _parts(1), _state(1)
    path = CheckpointWriter(tmp_path, 2).save(1, parts, state)
    assert path == tmp_path / "step_1"
    assert sorted(p.name for p in path.iterdir()) == [
        "COMMITTED", "manifest.json", "policy.safetensors", "reference.safetensors", "state.pt"
    ]
    step, loaded_parts, loaded_state = load_checkpoint(path)
    assert step == 1
    assert sorted(loaded_parts) == sorted(parts)
    for part, state_dict in parts.items():
        assert sorted(loaded_parts[part]) == sorted(state_dict)
        for name, tensor in state_dict.items():
            _assert_same(loaded_parts[part][name], tensor)
    _assert_same(loaded_state, state)


def test_adamw_resume_is_bit_identical(tmp_path: Path) -> None:
    def build() -> tuple:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def train(model, opt, sched, steps: int, gen: torch.Generator) -> None:
        for _ in range(steps):
            x = torch.randn(4, 8, generator=gen)
            loss = (model(x) - torch.rand(4, 1)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()

    model, opt, sched = build()
    gen = torch.Generator().manual_seed(1)
    train(model, opt, sched, 3, gen)
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "rng": capture_rng({"data": gen})}
    path = CheckpointWriter(tmp_path, 1).save(3, {"policy": model.state_dict()}, state)
    train(model, opt, sched, 3, gen)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    model2, opt2, sched2 = build()
    gen2 = torch.Generator()
    torch.manual_seed(123)  # whatever the fresh process did, restore must win
    _, tensors, loaded = load_checkpoint(path)
    model2.load_state_dict(tensors["policy"])
    opt2.load_state_dict(loaded["optimizer"])
    sched2.load_state_dict(loaded["scheduler"])
    restore_rng(loaded["rng"], {"data": gen2})
    train(model2, opt2, sched2, 3, gen2)
    for name, tensor in model2.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_rng_round_trip_through_checkpoint(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.standard_normal()  # and in numpy's legacy state

    def draw() -> list:
        return [random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
                np.random.standard_normal(), torch.rand(3).tolist(),
                torch.rand(3, generator=gen).tolist()]

    CheckpointWriter(tmp_path, 1).save(0, {}, {"rng": capture_rng({"gen": gen})})
    first = draw()
    _, _, state = load_checkpoint(tmp_path / "step_0")
    draw()
    restore_rng(state["rng"], {"gen": gen})
    assert draw() == first


def test_restore_rng_rejects_mismatched_generators() -> None:
    state = capture_rng({"a": torch.Generator()})
    with pytest.raises(ValueError, match=r"captured generators \['a'\], given \['b'\]"):
        restore_rng(state, {"b": torch.Generator()})


def test_retention_keeps_newest_k(tmp_path: Path) -> None:
    for step in range(1, 6):
        _save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4", "step_5"]
    assert find_latest(tmp_path) == tmp_path / "step_5"


def test_saving_an_older_step_drops_newer_abandoned_ones(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _save(tmp_path, step)
    _save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2"]


def test_saving_an_existing_step_replaces_it(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    CheckpointWriter(tmp_path, 2).save(2, {"policy": {"w": torch.ones(2)}}, {"v": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2"]
    step, tensors, state = load_checkpoint(tmp_path / "step_2")
    assert step == 2 and list(tensors) == ["policy"] and state == {"v": 2}


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: _flip_byte(p / "policy.safetensors"), "policy.safetensors: sha256"),
        (lambda p: _truncate(p / "state.pt"), "state.pt: .* bytes, the manifest says"),
        (lambda p: (p / "reference.safetensors").unlink(), "reference.safetensors: missing"),
        (lambda p: (p / "COMMITTED").unlink(), "COMMITTED: missing"),
        (lambda p: (p / "COMMITTED").write_text("0123"), "is not the sha256"),
        (lambda p: (p / "manifest.json").unlink(), "manifest.json"),
    ],
    ids=["flipped-byte", "truncated", "missing-part", "no-marker", "bad-marker", "no-manifest"],
)
def test_damaged_newest_checkpoint_is_skipped(tmp_path: Path, damage, message: str) -> None:
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    damage(newest)
    assert find_latest(tmp_path) == tmp_path / "step_1"
    infos = list_checkpoints(tmp_path)
    assert [(i.step, i.valid) for i in infos] == [(1, True), (2, False)]
    assert message.split(":")[0] in infos[1].reason
    with pytest.raises(CheckpointCorruptError, match=message):
        load_checkpoint(newest)


def test_stale_tmp_dirs_are_ignored_then_swept(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    dead = tmp_path / ".tmp-step_2-999999999-ab12"  # above any pid_max
    own = tmp_path / f".tmp-step_2-{os.getpid()}-cd34"  # a killed run that had our pid
    live = tmp_path / ".tmp-step_2-1-ef56"  # pid 1 is alive: maybe still writing
    for d in (dead, own, live):
        d.mkdir()
        (d / "policy.safetensors").write_bytes(b"partial")
    assert find_latest(tmp_path) == tmp_path / "step_1"
    _save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "step_1", "step_2"]


_FAILURES = {
    "first-part": ("write_file", lambda path, write: path.name == "policy.safetensors"),
    "state": ("write_file", lambda path, write: path.name == "state.pt"),
    "manifest": ("write_file", lambda path, write: path.name == "manifest.json"),
    "marker": ("write_file", lambda path, write: path.name == "COMMITTED"),
    "fsync-published": ("fsync_dir", lambda path: path.name == "step_2"),
    "rename-publish": ("rename", lambda src, dst: Path(dst).name == "step_2"),
    "rename-aside": ("rename", lambda src, dst: Path(src).name == "step_2"),
}


def _snapshot(root: Path) -> dict[str, list[bytes]]:
    return {p.name: sorted(f.read_bytes() for f in p.iterdir()) for p in root.iterdir()}


@pytest.mark.parametrize(
    ("failure", "existing"),
    [(name, False) for name in _FAILURES if name != "rename-aside"]
    + [(name, True) for name in _FAILURES],
)
def test_write_failure_keeps_previous_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, existing: bool
) -> None:
    _save(tmp_path, 1)
    if existing:
        _save(tmp_path, 2)
    before = _snapshot(tmp_path)
    target, fails = _FAILURES[failure]
    owner = {"rename": store.os, "write_file": store.CheckpointWriter}.get(target, store)
    real = getattr(owner, target)
    failed = []
    method = target == "write_file"

    def flaky(*args):  # fails once: the rollback's own calls go through
        path_args = args[1:] if method else args
        if not failed and fails(Path(path_args[0]), *path_args[1:]):
            failed.append(args)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    monkeypatch.setattr(owner, target, flaky)
    with pytest.raises(CheckpointWriteError, match=r"checkpoint .*step_2: .*No space left"):
        CheckpointWriter(tmp_path, 1).save(2, {"policy": {"w": torch.zeros(3)}}, {"x": 1})
    monkeypatch.undo()
    assert failed
    assert _snapshot(tmp_path) == before
    assert find_latest(tmp_path) == tmp_path / ("step_2" if existing else "step_1")


def test_write_error_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(obj, f) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"No space left on device: '.*\.tmp-step_3-.*/state\.pt'"):
        CheckpointWriter(tmp_path, 1).save(3, {}, {})
    assert list(tmp_path.iterdir()) == []


def test_tied_and_shared_tensors_save_and_load(tmp_path: Path) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    base = torch.arange(12.0)
    tensors = {"policy": model.state_dict(), "views": {"all": base, "head": base[:4], "odd": base[1::2]}}
    CheckpointWriter(tmp_path, 1).save(0, tensors, {})
    _, loaded, _ = load_checkpoint(tmp_path / "step_0")
    assert torch.equal(loaded["policy"]["embed.weight"], model.embed.weight)
    assert torch.equal(loaded["policy"]["head.weight"], model.embed.weight)
    assert torch.equal(loaded["views"]["odd"], base[1::2])
    fresh = Tied()
    fresh.load_state_dict(loaded["policy"])
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.head.weight, model.embed.weight)


@pytest.mark.parametrize(
    ("state", "where"),
    [({"sampler": {"perm": np.arange(3)}}, r"state\['sampler'\]\['perm'\]: numpy.ndarray"),
     ({"n": [np.int64(1)]}, r"state\['n'\]\[0\]: numpy.int64"),
     ({"f": frozenset()}, r"state\['f'\]: builtins.frozenset")],
)
def test_unloadable_state_is_rejected_before_writing(tmp_path: Path, state: dict, where: str) -> None:
    with pytest.raises(TypeError, match=where):
        CheckpointWriter(tmp_path, 1).save(1, {}, state)
    assert not tmp_path.joinpath("step_1").exists()


def test_find_latest_on_missing_or_empty_root(tmp_path: Path) -> None:
    assert find_latest(tmp_path / "absent") is None
    assert find_latest(tmp_path) is None
    assert list_checkpoints(tmp_path) == []


def test_a_real_full_disk_is_reported_in_words_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """On a 1 MiB tmpfs: the first checkpoint fits, the second (torch.save of 2 MB of state)
    does not. torch reports the failed write as 'unexpected pos'; the error must say ENOSPC."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        writer = CheckpointWriter(disk / "checkpoints", keep=2)
        writer.save(1, {"policy": {"w": torch.zeros(1000)}}, {"optimizer": torch.zeros(1000)})
        with pytest.raises(CheckpointWriteError) as err:
            writer.save(2, {"policy": {"w": torch.zeros(1000)}}, {"optimizer": torch.zeros(500_000)})
        assert err.value.cause == "no space left on device" and "unexpected pos" not in str(err.value)
        assert find_latest(disk / "checkpoints") == disk / "checkpoints" / "step_1"
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["step_1"]  # nothing half-written left
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_an_exception_from_the_serialiser_is_a_write_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(obj, f) -> None:
        raise RuntimeError("pickler exploded")

    _save(tmp_path, 1)
    monkeypatch.setattr(store.torch, "save", broken)
    with pytest.raises(CheckpointWriteError, match="pickler exploded") as err:
        CheckpointWriter(tmp_path, 2).save(2, {}, {})
    assert err.value.cause == "RuntimeError: pickler exploded" and find_latest(tmp_path) == tmp_path / "step_1"


# ---------------------------------------------------------------- the in-memory snapshot
from reasonrl.checkpoint.checkpointer import Checkpointer  # noqa: E402
from reasonrl.checkpoint.registry import StateRegistry  # noqa: E402
from reasonrl.checkpoint.snapshot import SnapshotStore  # noqa: E402
from reasonrl.config import load  # noqa: E402
from reasonrl.metrics import EventLog, read_jsonl  # noqa: E402


def test_snapshot_round_trip_and_a_torn_or_damaged_one_is_ignored(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert store.load() is None and "no snapshot" in store.problem
    parts, state = _parts(2), _state(2)
    store.save(7, parts, state, {"time": 1.5})
    found = store.load()
    assert found.step == 7 and found.meta == {"time": 1.5} and store.problem == ""
    for part, state_dict in parts.items():
        for name, tensor in state_dict.items():
            _assert_same(found.tensors[part][name], tensor)
    _assert_same(found.state, state)
    assert [p.name for p in tmp_path.iterdir()] == ["snapshot.pt"]  # no temporary file left
    # The next save writes the spare file and renames it over; the old snapshot's file (its
    # inode: its memory pages) becomes the spare the save after overwrites in place.
    first = store.path.stat().st_ino
    store.save(8, parts, state, {"time": 2.5})
    assert store.load().step == 8 and (tmp_path / ".snapshot-next.pt").stat().st_ino == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [".snapshot-next.pt", "snapshot.pt"]
    store.save(9, parts, state, {"time": 3.5})
    assert store.path.stat().st_ino == first and store.load().step == 9
    whole = store.path.read_bytes()
    store.path.write_bytes(whole[:-100])  # cut short, as a write that died half way
    assert store.load() is None and "torn" in store.problem
    flipped = bytearray(whole)
    flipped[-10] ^= 0xFF
    store.path.write_bytes(bytes(flipped))
    assert store.load() is None and "damaged" in store.problem
    store.path.write_bytes(whole[:12])  # not even the header
    assert store.load() is None and "not a snapshot" in store.problem


WRITER = r"""
import sys, torch
from reasonrl.checkpoint.snapshot import SnapshotStore
store = SnapshotStore(sys.argv[1])
big = {"policy": {"w": torch.zeros(4_000_000)}}
step = 0
while True:
    step += 1
    big["policy"]["w"].fill_(step)
    store.save(step, big, {"step": step}, {"time": 0.0})
    print(step, flush=True)
"""


def test_a_kill_in_the_middle_of_a_snapshot_write_leaves_the_previous_one(tmp_path: Path) -> None:
    """A writer SIGKILLed while it writes 16 MB snapshots in a loop: what is left verifies and
    is one whole snapshot (its tensor holds its own step), and its temporary file is ignored."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # a few snapshots written: the kill lands in one of the next writes
            assert proc.stdout.readline(), "the writer died"
    finally:
        proc.kill()
        proc.wait(timeout=60)
    found = SnapshotStore(tmp_path).load()
    assert found is not None and found.step >= 3 and found.state == {"step": found.step}
    assert torch.equal(found.tensors["policy"]["w"], torch.full((4_000_000,), float(found.step)))


class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value, "weights": {"w": torch.full((2,), float(self.value))}}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]
        assert torch.equal(state["weights"]["w"], torch.full((2,), float(self.value)))


def _checkpointer(run_dir: Path, snapshots: Path) -> tuple[Checkpointer, _Counter]:
    cfg = load(None, [f"run.dir={run_dir}", "checkpoint.every_steps=4", "train.total_steps=10"])
    registry, counter = StateRegistry(), _Counter()
    ckpt = Checkpointer(cfg, run_dir, registry, CheckpointWriter(run_dir / "checkpoints", 2), EventLog(run_dir),
                        "data", log=lambda line: None, snapshots=SnapshotStore(snapshots))
    registry.add("counter", counter)
    return ckpt, counter


def _restarted_after_snapshot(tmp_path: Path, step: int, due: bool) -> tuple[Checkpointer, _Counter, Path, Path]:
    """A trainer checkpointed step 4 and snapshotted ``step`` (a checkpoint ``due`` there, at
    last_checkpoint 100.0), then died: the restarted trainer's checkpointer and counter, the run
    directory and the snapshot directory."""
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    shm.mkdir()
    ckpt, counter = _checkpointer(run_dir, shm)
    counter.value = 4
    ckpt.save(4, final=False)
    counter.value = step
    ckpt.snapshot(step, last_checkpoint=100.0, due=due)
    ckpt, counter = _checkpointer(run_dir, shm)
    return ckpt, counter, run_dir, shm


def test_resume_takes_the_newer_of_the_snapshot_and_the_checkpoint(tmp_path: Path) -> None:
    ckpt, counter, run_dir, shm = _restarted_after_snapshot(tmp_path, 6, due=False)
    assert ckpt.resume() == 6 and counter.value == 6 and ckpt.from_snapshot["checkpoint_time"] == 100.0
    assert ckpt.catch_up(6, 200.0) == 100.0  # no checkpoint was due at 6: the schedule goes on from the last one
    ckpt.emit_resume(6)
    resume = read_jsonl(run_dir / "events.jsonl")[-1]
    assert resume["source"] == "snapshot" and resume["from_step"] == 6 and resume["state_time"] > 0
    # A torn snapshot is skipped (an event says why): the checkpoint of step 4 is the resume.
    (shm / "snapshot.pt").write_bytes((shm / "snapshot.pt").read_bytes()[:-1])
    ckpt, counter = _checkpointer(run_dir, shm)
    assert ckpt.resume() == 4 and counter.value == 4 and ckpt.from_snapshot is None
    ckpt.emit_resume(4)
    skipped, resume = read_jsonl(run_dir / "events.jsonl")[-2:]
    assert skipped["kind"] == "snapshot_skipped" and "torn" in skipped["reason"] and resume["source"] == "checkpoint"
    # A snapshot older than the newest checkpoint loses to it.
    ckpt.snapshot(3, last_checkpoint=0.0, due=False)
    ckpt, counter = _checkpointer(run_dir, shm)
    assert ckpt.resume() == 4 and ckpt.from_snapshot is None


def test_a_checkpoint_due_at_the_snapshot_step_is_written_after_the_resume(tmp_path: Path) -> None:
    """The trainer died writing step 8's checkpoint (after step 8's snapshot): the restarted
    one resumes at 8 and writes that checkpoint first."""
    ckpt, _, run_dir, _ = _restarted_after_snapshot(tmp_path, 8, due=True)
    assert ckpt.resume() == 8
    assert ckpt.catch_up(8, 200.0) > 200.0
    assert find_latest(run_dir / "checkpoints") == run_dir / "checkpoints" / "step_8"
    assert load_checkpoint(run_dir / "checkpoints" / "step_8")[2]["counter"]["value"] == 8
