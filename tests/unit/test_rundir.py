"""The run lock: exclusive, shared with the supervisor's child, never kept by a forked child."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from reasonrl.errors import RunDirError
from reasonrl.resilience.rundir import RunLock

ADOPT = """
import sys
from reasonrl.resilience.rundir import RunLock
RunLock(sys.argv[1], "trainer").acquire()
print("adopted")
"""


def test_the_lock_is_exclusive_and_names_its_holders(tmp_path):
    first = RunLock(tmp_path, "supervisor").acquire()
    with pytest.raises(RunDirError, match=rf"in use by another reasonrl trainer \(supervisor pid {os.getpid()}\)"):
        RunLock(tmp_path, "trainer").acquire()
    first.release()
    RunLock(tmp_path, "trainer").acquire().release()


def test_the_supervisors_child_adopts_the_lock_and_a_stranger_is_refused(tmp_path):
    lock = RunLock(tmp_path, "supervisor").acquire()
    fds, env = lock.inherit()
    child = subprocess.run([sys.executable, "-c", ADOPT, str(tmp_path)], pass_fds=fds, env={**os.environ, **env},
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "adopted", child.stderr
    stranger = subprocess.run([sys.executable, "-c", ADOPT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert stranger.returncode != 0 and "in use by another reasonrl trainer" in stranger.stderr
    lock.release()


def test_a_forked_child_that_lingers_does_not_keep_the_lock(tmp_path):
    lock = RunLock(tmp_path, "trainer").acquire()
    pid = os.fork()
    if pid == 0:  # a reward worker stuck in its function after the trainer is gone
        time.sleep(3)
        os._exit(0)
    try:
        time.sleep(0.5)  # the child is running
        lock.release()
        RunLock(tmp_path, "trainer").acquire().release()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_new_snapshot_directory_sweeps_those_of_dead_supervisors(tmp_path, monkeypatch):
    from reasonrl.resilience import rundir

    monkeypatch.setattr(rundir, "snapshot_root", lambda: tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"reasonrl-snapshot-{int(gone.stdout)}-abc"
    alive = tmp_path / f"reasonrl-snapshot-{os.getppid()}-def"
    for d in (dead, alive):
        d.mkdir()
        (d / "snapshot.pt").write_bytes(b"x")
    made = rundir.new_snapshot_dir()
    assert made.parent == tmp_path and made.name.startswith(f"reasonrl-snapshot-{os.getpid()}-")
    assert not dead.exists() and alive.exists()
