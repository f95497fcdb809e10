"""A zygote: a process forked from this one once it has imported torch, that forks each worker.

A worker process started by :mod:`multiprocessing`'s forkserver begins in a fresh interpreter
(the forkserver's), which imports torch, ``transformers`` and reasonrl's workers again: seconds
of CPU per trainer process (a restarted trainer included) for modules this process has already
imported. A zygote is this process forked at a moment it runs one thread: it holds every module
imported so far, and forks each worker from there, which then starts for the cost of a fork::

    if start_zygote():                 # this process, single-threaded, has imported torch
        proc = ZygoteProcess(target, (child_conn, ...), name="rollout")
        proc.start()                   # forked by the zygote; proc.pid, proc.exitcode, proc.kill()

It is started only where forking is safe (:func:`start_zygote` says why not, and the caller
starts the forkserver instead): on Linux, from a process with one Python thread and CUDA not
initialised, whose torch can still run a parallel region after a fork. GNU OpenMP keeps its
thread pool across a fork, and a child whose parent had run a parallel region waits forever for
the pool's threads at its first one, so the zygote first forks a probe that runs one: a probe
that does not end within :data:`PROBE_TIMEOUT_S` ends the zygote.

Right after the fork the zygote closes every file descriptor it does not need (a worker must
not hold the run directory's lock or a pipe of its trainer's caller), freezes the objects it
inherited out of the garbage collector (so none is finalised in a child, closing a descriptor
it no longer owns), and ignores SIGINT (Ctrl-C is the trainer's to handle). It ends when this
process closes its end of their socket, or dies: at once, with ``os._exit``, tearing nothing
down. The zygote reports each worker's pid when it forks it and its exit code when it reaps it,
through a pipe per worker (as the forkserver does): a worker forked by the zygote is its child,
not this process's.

A :class:`Template` is a zygote in an interpreter of its own, for a process that has not
imported what its children run: the supervisor, which stays small, starts one that imports a
trainer's modules once and forks each trainer from it as ``python -m reasonrl.cli ...`` would
have run in a process of its own.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import random
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import warnings
from multiprocessing import reduction, resource_tracker
from multiprocessing.connection import Connection
from typing import Any, Callable

from reasonrl.pids import pid_alive, signal_at_parent_death

PROBE_TIMEOUT_S = 3.0
"""How long the zygote's probe may take to run torch's parallel region (milliseconds where
forking is safe; forever where it is not)."""

START_TIMEOUT_S = 30.0
"""How long the zygote may take to answer a request with the new worker's pid."""

_INT = struct.Struct("q")


class _Zygote:
    """This process's end of a zygote: the socket requests go over, and the zygote's pid."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid, self.owner = sock, pid, os.getpid()
        self.lock = threading.Lock()  # one request on the socket at a time

    def request(self, message: bytes, fds: list[int]) -> None:
        with self.lock:
            reduction.sendfds(self.sock, fds)
            self.sock.sendall(_INT.pack(len(message)) + message)


_zygote: _Zygote | None = None
_probe_failed_in: int | None = None
"""The process whose zygote's probe did not end: it does not try again."""


def running() -> bool:
    """Whether this process has a zygote that is alive (a process forked from this one inherits
    none; one that died, killed, is forgotten, and the forkserver starts the workers after it)."""
    return _current() is not None


_STATE = threading.Lock()


def _current() -> _Zygote | None:
    """This process's live zygote, or None (see :func:`running`); safe from any thread."""
    global _zygote
    with _STATE:
        zygote = _zygote
        if zygote is None or zygote.owner != os.getpid():
            return None
        try:
            ended, _ = os.waitpid(zygote.pid, os.WNOHANG)
        except ChildProcessError:
            ended = zygote.pid
        if ended:
            zygote.sock.close()
            _zygote = None
            return None
        return zygote


def unsafe_reason(need_torch: bool = True) -> str | None:
    """Why this process cannot fork a zygote now (one whose workers use torch: ``need_torch``),
    or None."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return f"fork is not safe on {sys.platform}"
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads run"
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported" if need_torch else None
    if torch.cuda.is_initialized():
        return "CUDA is initialised"
    return None


def start_zygote() -> bool:
    """Fork this process's zygote, where :func:`unsafe_reason` finds none and its probe ends;
    whether one runs."""
    global _zygote, _probe_failed_in
    if running():
        return True
    if unsafe_reason() is not None or _probe_failed_in == os.getpid():
        return False
    gc.collect()  # what is garbage now is not inherited
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    keep = _inherited_fds_to_keep()
    with warnings.catch_warnings():
        # Python 3.12+ warns of a fork while the OS counts other threads: here those of native
        # pools (OpenBLAS's, which shuts them down around a fork), no Python thread, and the
        # probe checks torch's OpenMP.
        warnings.filterwarnings("ignore", message=r".*multi-threaded, use of fork\(\)", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the zygote
        ours.close()
        try:
            _zygote_main(theirs, keep)
        finally:
            os._exit(70)
    theirs.close()
    ready = _read_exact(ours, 1, PROBE_TIMEOUT_S + 5)
    if ready != b"1":
        ours.close()
        os.waitpid(pid, 0)
        _probe_failed_in = os.getpid()
        return False
    _zygote = _Zygote(ours, pid)
    return True


def _inherited_fds_to_keep() -> set[int]:
    """Descriptors the zygote and its workers keep: stdout, stderr, and multiprocessing's
    resource tracker (a worker's own groups register with it)."""
    keep = {1, 2}
    fd = getattr(resource_tracker._resource_tracker, "_fd", None)
    if fd is not None:
        keep.add(fd)
    return keep


def _close_inherited(keep: set[int]) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, already closed


def _probe() -> bool:
    """Whether a child of this process can run torch's parallel region (see the module docstring)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.set_num_threads(2)
            torch.ones(1 << 18).mul(2).sum()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def _zygote_main(sock: socket.socket, keep: set[int]) -> None:
    """The zygote: probe, say whether it is ready, then fork a worker per request and report
    its pid and exit code, until this process's end of ``sock`` closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.freeze()
    _close_inherited(keep | {sock.fileno()})
    if "torch" in sys.modules and not _probe():  # without torch, none of its threads to inherit
        sock.sendall(b"0")
        return
    sock.sendall(b"1")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, int] = {}  # worker pid -> the write end of its status pipe
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    conn_fd, status_fd = reduction.recvfds(sock, 2)
                except (EOFError, OSError, RuntimeError):
                    return  # the trainer is gone: its workers end when their pipes close
                (size,) = _INT.unpack(_read_exact(sock, _INT.size, None))
                payload = _read_exact(sock, size, None)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    sock.close()
                    os.close(wake_r), os.close(wake_w), os.close(status_fd)
                    for fd in children.values():
                        os.close(fd)
                    _worker_main(conn_fd, payload)
                os.close(conn_fd)
                os.write(status_fd, _INT.pack(pid))
                children[pid] = status_fd
            else:
                os.read(wake_r, 4096)
                _reap(children)


def _reap(children: dict[int, int]) -> None:
    """Report the exit code of every worker that ended, and forget it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, _INT.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # this process no longer reads it
            os.close(fd)


def _worker_main(conn_fd: int, payload: bytes) -> None:
    """A worker forked by the zygote: ``target(conn, *args)``, then exit (1 if it raised). It
    has no zygote of its own (:func:`running` checks the owner's pid)."""
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    multiprocessing.forkserver._forkserver = multiprocessing.forkserver.ForkServer()  # the trainer's is not this one's
    code = 0
    try:
        target, args, name = pickle.loads(payload)
        multiprocessing.current_process().name = name
        target(Connection(conn_fd), *args)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 - printed, as multiprocessing prints a target's error
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _read_exact(sock: socket.socket, size: int, timeout_s: float | None) -> bytes:
    sock.settimeout(timeout_s)
    data = bytearray()
    try:
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
    except (socket.timeout, OSError):
        pass
    finally:
        sock.settimeout(None)
    return bytes(data)


class ZygoteProcess:
    """A worker process the zygote forks: what :class:`multiprocessing.Process` offers a
    :class:`~reasonrl.runtime.process.ProcessGroup` (``start``, ``pid``, ``exitcode``,
    ``is_alive``, ``join``, ``kill``), safe to call from several threads. ``target`` gets
    ``args`` as they are, the first a :class:`~multiprocessing.connection.Connection` passed to
    the worker by descriptor; the rest travel pickled. ``zygote``: a :class:`Template`'s, else
    this process's."""

    def __init__(self, target: Callable[..., Any], args: tuple, name: str, zygote: _Zygote | None = None) -> None:
        self._target, self._args, self.name, self._zygote = target, args, name, zygote
        self.pid: int | None = None
        self.exitcode: int | None = None
        self._status: int | None = None  # the pipe the zygote writes the pid, then the exit code to
        self._orphaned = False  # the zygote ended before it reported the exit code
        self._lock = threading.Lock()

    def start(self) -> None:
        zygote = self._zygote or _current()
        if zygote is None:
            raise RuntimeError("this process has no zygote")
        conn, *rest = self._args
        payload = pickle.dumps((self._target, tuple(rest), self.name))
        status_r, status_w = os.pipe()
        try:
            zygote.request(payload, [conn.fileno(), status_w])
        finally:
            os.close(status_w)
        self._status = status_r
        pid = self._read_number(START_TIMEOUT_S)
        if pid is None:
            os.close(status_r)
            self._status = None
            raise OSError(f"{self.name}: the zygote did not start the worker within {START_TIMEOUT_S} s")
        self.pid = pid

    def _read_number(self, timeout_s: float | None) -> int | None:
        """The next number on the status pipe within ``timeout_s``; None without one, or when
        the zygote closed the pipe without it (it ended)."""
        ready, _, _ = select.select([self._status], [], [], timeout_s)
        if not ready:
            return None
        data = b""
        while len(data) < _INT.size:
            chunk = os.read(self._status, _INT.size - len(data))
            if not chunk:
                self._orphaned = self.pid is not None
                return None
            data += chunk
        return _INT.unpack(data)[0]

    def join(self, timeout: float | None = None) -> None:
        """Wait ``timeout`` seconds at most (None: for ever) for the worker to end. Where the
        zygote ended first, nobody reports the exit code: the worker is polled by its pid and
        counted as killed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self.exitcode is not None or self.pid is None:
                return
            if not self._orphaned:
                code = self._read_number(timeout)
                if code is None and not self._orphaned:
                    return  # still running
                os.close(self._status)
                self._status = None
                if code is not None:
                    self.exitcode = code
                    return
            while pid_alive(self.pid):
                if deadline is not None and time.monotonic() >= deadline:
                    return
                time.sleep(0.01)
            self.exitcode = -signal.SIGKILL

    def is_alive(self) -> bool:
        self.join(0)
        return self.pid is not None and self.exitcode is None

    def kill(self) -> None:
        if self.is_alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


TEMPLATE_START_TIMEOUT_S = 120.0
"""How long a :class:`Template` may take to import its modules and say it is ready (seconds on
an idle machine; more beside other work)."""

_TEMPLATE_MAIN = "from reasonrl.runtime.zygote import _serve_template; _serve_template()"


class Template:
    """A zygote in an interpreter of its own, for a caller that has not imported what its
    children run (the supervisor, whose trainers import torch and ``transformers``)::

        template, why_not = Template.start(("torch", "reasonrl.cli"))   # (None, reason) where it cannot
        child = template.run_module("reasonrl.cli", ["train", ...], env={...}, pass_fds=(fd,))
        child.pid; child.stderr.read(); child.poll(); child.wait(); child.send_signal(signal.SIGTERM)
        template.close()

    The template imports ``modules`` once, checks that forking is safe (:func:`unsafe_reason`,
    then the probe) and forks a child per :meth:`run_module`, which runs ``python -m module
    *argv`` as a process of :class:`subprocess.Popen` with ``start_new_session=True`` would: in a
    session of its own, ``env`` added to the environment (the template's: the caller's when the
    template started), the descriptors ``pass_fds`` at their numbers, stderr on a pipe of its
    own (``child.stderr``), stdout the caller's, stdin ``/dev/null``; its exit code is the
    module's, after the interpreter's exit handlers ran. Its parent is the template, not the
    caller. The template ends with :meth:`close`, or when the caller dies (``PR_SET_PDEATHSIG``
    on Linux, and the end of its socket); it ignores SIGINT and SIGHUP, which are the caller's
    to handle."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket) -> None:
        self._proc = proc
        self._zygote = _Zygote(sock, proc.pid)
        self.pid = proc.pid

    @classmethod
    def start(cls, modules: tuple[str, ...], shown: tuple[str, ...] = (),
              timeout_s: float = TEMPLATE_START_TIMEOUT_S) -> tuple[Template | None, str]:
        """A ready template and ``""``, or None and why there is none. ``shown``: words at the
        end of the template's command line, which is its children's too (what ``ps`` shows of
        them: the supervisor shows the trainer's command)."""
        if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
            return None, f"fork is not safe on {sys.platform}"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen([sys.executable, "-c", _TEMPLATE_MAIN, str(theirs.fileno()), str(os.getpid()),
                                     ",".join(modules), *shown], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        answer = _read_exact(ours, 1, timeout_s)
        if answer == b"1":
            return cls(proc, ours), ""
        if answer == b"0":
            why = _read_exact(ours, 4096, 5.0).decode(errors="replace") or "its probe of torch's threads after a fork did not end"
        elif answer:
            why = f"it answered {answer!r}"
        else:
            try:
                why = f"it exited with code {proc.wait(timeout=5.0)} while importing {', '.join(modules)}"
            except subprocess.TimeoutExpired:
                why = f"it did not start within {timeout_s:g} s"
        ours.close()
        proc.kill()
        proc.wait()
        return None, why

    def alive(self) -> bool:
        return self._proc.poll() is None

    def run_module(self, module: str, argv: list[str], env: dict[str, str] | None = None,
                   pass_fds: tuple[int, ...] = ()) -> TemplateChild:
        """Fork a child that runs ``python -m module *argv`` (the class docstring); OSError where
        the template does not answer within :data:`START_TIMEOUT_S`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        err_r, err_w = os.pipe()
        try:
            reduction.sendfds(ours, [err_w, *pass_fds])  # read by the child before anything else
            proc = ZygoteProcess(_run_module, (theirs, module, list(argv), dict(env or {}), [2, *pass_fds]),
                                 name="MainProcess", zygote=self._zygote)
            proc.start()
        except BaseException:
            os.close(err_r)
            raise
        finally:
            ours.close()
            theirs.close()
            os.close(err_w)
        return TemplateChild(proc, os.fdopen(err_r, "rb", buffering=0))

    def close(self, timeout_s: float = 10.0) -> None:
        """End the template (its children go on); kill it after ``timeout_s``."""
        self._zygote.sock.close()
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class TemplateChild:
    """A child of a :class:`Template`, with the part of :class:`subprocess.Popen` a caller of
    processes uses: ``pid``, ``stderr``, ``returncode`` (negative: killed by that signal),
    ``poll``, ``wait``, ``send_signal``, ``kill``; safe to call from several threads."""

    def __init__(self, proc: ZygoteProcess, stderr) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.stderr = stderr

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        self._proc.join(0)
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._proc.exitcode is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self._proc.join(0.1)  # a short wait at a time: poll() from another thread waits for the same lock
        return self._proc.exitcode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass  # it ended just now

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _serve_template() -> None:
    """A template's main (:meth:`Template.start`): end with the caller, import the modules,
    say whether forking is safe, then fork a child per request until the caller's end closes."""
    fd, caller, modules = sys.argv[1:4]
    sock = socket.socket(fileno=int(fd))
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal_at_parent_death(signal.SIGKILL)
    if os.getppid() != int(caller):
        os._exit(0)  # the caller died before the signal was armed
    for module in filter(None, modules.split(",")):
        importlib.import_module(module)
    reason = unsafe_reason(need_torch=False)
    if reason is not None:
        sock.sendall(b"0" + reason.encode())
        os._exit(0)
    try:
        _zygote_main(sock, {1, 2})
    finally:
        os._exit(0)


def _run_module(conn: Connection, module: str, argv: list[str], env: dict[str, str], targets: list[int]) -> None:
    """A template's child (:meth:`Template.run_module`): take its descriptors from ``conn`` and
    put them at ``targets`` (stderr first), then run ``python -m module *argv`` and exit as
    that interpreter would."""
    os.setsid()
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        received = reduction.recvfds(sock, len(targets))
    conn.close()
    above = max(targets) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in received]  # none may land on a target
    for fd in received:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.environ.update(env)
    random.seed()  # a fresh interpreter's, not the template's (which every child would share)
    sys.argv = [module, *argv]  # runpy puts the module's path first, as ``python -m`` does
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as err:
        code = _exit_code(err.code)
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports an uncaught error
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # what the interpreter does at exit: wait for non-daemon threads,
    atexit._run_exitfuncs()  # then run the exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(code: object) -> int:
    """The exit status of ``sys.exit(code)``, as the interpreter sets it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
