"""One trainer per run directory, and a trainer that never outlives its supervisor.

    check_run_dir(run_dir)              RunDirError: a file, not writable, or someone else's files
    lock = RunLock(run_dir).acquire()   RunDirError naming the holder's pid when another trainer has it
    env = lock.inherit()                pass_fds and environment for the trainer child
    follow_supervisor()                 in the child: stop (checkpoint, exit) when the supervisor dies
    snapshot_dir()                      in the child: where the supervisor keeps its snapshots (or None)
    await_go()                          in a standby child: wait, built, until the supervisor needs it

The lock is an OS file lock (``flock``) on ``run_dir/run.lock``: the kernel releases it when
the last process holding the open file dies, so it cannot go stale the way a pid file does. The
supervisor takes it and hands the same open file to its trainer child, so the two hold it
together, and a second ``reasonrl train`` on the directory is refused whichever of the two is
still alive. The file's text names the holders; it also marks the directory as a reasonrl run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from reasonrl.errors import RunDirError
from reasonrl.pids import pid_alive, signal_at_parent_death

LOCK_FILE = "run.lock"
LOCK_FD_ENV = "REASONRL_RUN_LOCK_FD"
"""The inherited file descriptor of the run lock, set by the supervisor for its child."""
SUPERVISOR_ENV = "REASONRL_SUPERVISOR_PID"
"""The supervisor's pid, set for its child: the child stops when that process is gone."""
ATTEMPT_ENV = "REASONRL_ATTEMPT"
"""Which of the supervisor's children this is, set for each: "1" for the first, which checks the
run (:mod:`reasonrl.preflight`) before it trains; a restart does not check it again."""
OURS = ("config.yaml", LOCK_FILE)
"""A non-empty run directory holding neither of these was not written by reasonrl."""
SNAPSHOT_ENV = "REASONRL_SNAPSHOT_DIR"
"""The memory directory the supervisor made for its trainers' snapshots (resilience.snapshot_every)."""
STANDBY_ENV = "REASONRL_STANDBY_FD"
"""Set for a standby trainer: the pipe it waits on, once built, for the supervisor's go."""
ORPHAN_GRACE_S = 10.0
"""After its supervisor died, a trainer gets this long to checkpoint and exit before it ends itself."""
_POLL_S = 0.2


def check_run_dir(run_dir: Path) -> None:
    """RunDirError unless ``run_dir`` can hold this run: a directory (or a path that can become
    one), writable, and either empty or a reasonrl run directory (``config.yaml`` or
    ``run.lock`` in it)."""
    run_dir = Path(run_dir)
    where = f"run.dir = {str(run_dir)!r}"
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{where}: is a file, not a directory; choose a directory for the run")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{where}: cannot create the directory ({os.strerror(err.errno)})") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(f"{where}: the directory is not writable by this user; choose another run.dir")
    entries = sorted(p.name for p in run_dir.iterdir())
    if entries and not any(name in entries for name in OURS):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise RunDirError(f"{where}: holds files reasonrl did not write ({shown}); choose an empty or new directory")


class RunLock:
    """The exclusive lock of a run directory, held for the life of the run (see the module)."""

    def __init__(self, run_dir: Path, role: str) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.role = role
        self.fd: int | None = None
        self._adopted = self._claimed = False

    def acquire(self) -> RunLock:
        """Take the lock, or adopt the one the supervisor handed down; RunDirError when another
        trainer holds it."""
        inherited = _inherited_fd(self.path)
        try:
            fd = inherited if inherited is not None else os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise RunDirError(f"run.dir = {str(self.path.parent)!r}: cannot create {LOCK_FILE} ({os.strerror(err.errno)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holders = _read_holders(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunDirError(f"{self.path}: cannot lock ({os.strerror(err.errno)})") from None
            raise RunDirError(
                f"run.dir = {str(self.path.parent)!r} is in use by another reasonrl trainer ({holders}); "
                "wait for it to end or stop it, or choose another run.dir"
            ) from None
        self.fd = fd
        self._adopted = inherited is not None
        if STANDBY_ENV not in os.environ:  # a standby is named a holder once it goes (claim)
            self.claim()
        os.register_at_fork(after_in_child=self._forget)
        return self

    def claim(self) -> None:
        """Name this process in the lock's text as its ``role`` (once: again is a no-op)."""
        if not self._claimed:
            self._write_holder(self._adopted)
            self._claimed = True

    def _forget(self) -> None:
        """In a forked child (reward workers): drop our copy of the lock's file, so a child
        that outlives the trainer cannot keep the directory locked (the parent's lock stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _write_holder(self, adopted: bool) -> None:
        holders = _holders(self.fd) if adopted else {}
        holders[self.role] = os.getpid()
        text = json.dumps({**holders, "since": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n"
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, text.encode(), 0)
        except OSError as err:  # a full disk: the lock holds all the same, its text names nobody
            print(f"reasonrl: cannot name the holder in {self.path} ({os.strerror(err.errno).lower()}); "
                  "the lock holds all the same", file=sys.stderr, flush=True)

    def inherit(self) -> tuple[tuple[int, ...], dict[str, str]]:
        """``(pass_fds, env)`` that hand this lock and our pid to a child process."""
        os.set_inheritable(self.fd, True)
        return (self.fd,), {LOCK_FD_ENV: str(self.fd), SUPERVISOR_ENV: str(os.getpid())}

    def release(self) -> None:
        """Give the lock up (closing our file; a child that shares it keeps it held)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _inherited_fd(path: Path) -> int | None:
    """The lock file descriptor the supervisor handed down, when it is the lock of ``path``."""
    text = os.environ.get(LOCK_FD_ENV)
    if not text:
        return None
    try:
        fd = int(text)
        same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except (ValueError, OSError):
        return None
    if not same:
        return None
    os.environ.pop(LOCK_FD_ENV)  # processes started later (rollout, rewards) must not adopt it,
    os.set_inheritable(fd, False)  # nor hold it: a lingering one would lock the restart out
    return fd


def _holders(fd: int) -> dict[str, int]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def _read_holders(fd: int) -> str:
    holders = _holders(fd)
    return ", ".join(f"{role} pid {pid}" for role, pid in holders.items()) or "pid unknown"


def follow_supervisor() -> None:
    """In a trainer started by the supervisor: when the supervisor dies (``kill -9``, a closed
    terminal), stop as after SIGTERM (checkpoint after the current step, exit), with stdout and
    stderr sent to /dev/null (their reader is gone); end at once after ``ORPHAN_GRACE_S``.

    On Linux the kernel signals the death (``PR_SET_PDEATHSIG``); a thread that watches the
    parent pid covers other systems and the moment before the signal was armed.
    """
    text = os.environ.pop(SUPERVISOR_ENV, "")
    if not text:
        return
    supervisor = int(text)
    orphaned = threading.Event()

    def on_orphan(*_) -> None:
        if orphaned.is_set():
            return
        orphaned.set()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        deadline = threading.Timer(ORPHAN_GRACE_S, os._exit, args=(128 + signal.SIGTERM,))
        deadline.daemon = True  # a clean exit before the deadline does not wait for it
        deadline.start()
        os.kill(os.getpid(), signal.SIGTERM)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, on_orphan)
        signal_at_parent_death(signal.SIGHUP)

    def watch() -> None:
        while not orphaned.is_set():
            if os.getppid() != supervisor:
                on_orphan()
                return
            time.sleep(_POLL_S)

    threading.Thread(target=watch, name="reasonrl-lifeline", daemon=True).start()


SNAPSHOT_PREFIX = "reasonrl-snapshot-"


def snapshot_root() -> Path:
    """Where the supervisor makes its snapshot directory: ``/dev/shm`` (memory) where it exists,
    else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def new_snapshot_dir() -> Path:
    """A fresh snapshot directory for this supervisor (``reasonrl-snapshot-<pid>-*`` under
    :func:`snapshot_root`), after removing those of supervisors that died without removing
    theirs (killed with SIGKILL)."""
    root = snapshot_root()
    for old in root.glob(f"{SNAPSHOT_PREFIX}*-*"):
        pid = old.name[len(SNAPSHOT_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SNAPSHOT_PREFIX}{os.getpid()}-", dir=root))


def snapshot_dir() -> Path | None:
    """The directory the supervisor made for this run's snapshots, or None (no supervisor, or
    snapshots off)."""
    text = os.environ.get(SNAPSHOT_ENV, "")
    return Path(text) if text and Path(text).is_dir() else None


def is_standby() -> bool:
    """Whether this trainer is a standby the supervisor started ahead (:func:`await_go`)."""
    return STANDBY_ENV in os.environ


def await_go() -> bool:
    """In a standby trainer (the supervisor started it ahead, :data:`STANDBY_ENV`): block until
    the supervisor says go (True) or closes the pipe, retiring the standby or gone itself
    (False). Without the variable, True at once."""
    text = os.environ.pop(STANDBY_ENV, "")
    if not text:
        return True
    fd = int(text)
    try:
        return os.read(fd, 1) == b"g"
    finally:
        os.close(fd)
