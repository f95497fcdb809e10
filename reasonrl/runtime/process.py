"""Workers in processes of their own: the same worker classes, called over a pipe with futures.

    group = ProcessGroup(build_rollout_worker, [(cfg, model_dir, 0), (cfg, model_dir, 1)], name="rollout",
                         concurrent=("offer_weights",))
    future = group.submit_to(1, "generate", ...)   # returns at once; the child works on another core
    ...
    batch = future.result(timeout=600)          # or WorkerDied if the child died meanwhile

Each worker runs in a child process built by ``factory(*args)``, one entry of
``args_per_worker`` each, that never inherits the parent's threads: forked by this process's
zygote where it has one (:mod:`reasonrl.runtime.zygote`, which :func:`start_worker_processes`
forks while this process runs one thread: ``reasonrl train`` does before it trains), else
started by multiprocessing's ``forkserver`` (``spawn`` where there is none). It does not
import the parent's main module (a script needs no ``if __name__ == "__main__":`` guard). Calls
run one after another, in the order submitted, in the child's main thread; a method named in
``concurrent`` runs at once in the child's reader thread instead, beside a running call (it
must be thread-safe: e.g. leaving new weights for the running call to pick up). Arguments
and results travel pickled, one message each (tensors by value).

The parent reads results in a thread of its own, so a child never blocks on a full pipe
while the parent is busy. When a child dies, every pending and later call fails with
:class:`~reasonrl.runtime.group.WorkerDied`; when the parent dies, the child sees its pipe
close and exits. Nothing waits without a timeout: starting a child has ``start_timeout_s``,
:meth:`call` the group's ``timeout_s``, and callers of :meth:`submit` pass their own to
:func:`~reasonrl.runtime.group.gather` or ``Future.result``.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import traceback
from concurrent.futures import Future
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator

from reasonrl.runtime import zygote
from reasonrl.runtime.group import WorkerDied, WorkerTimeout, gather

_CLOSE = "close"

PRELOAD = ("torch", "transformers.models.llama.modeling_llama", "reasonrl.workers")
"""Modules a worker begins with: imported by this process before it forks its zygote, else by
the forkserver before it forks the first child (with the factory's module), where this process
has imported torch itself (a trainer, a worker, a test session: its groups hold models). Every
child then begins with torch, transformers' model classes (which :mod:`reasonrl.models.loading`
imports only when it loads a model; Llama: the embedded model's) and the worker classes loaded
instead of importing them again within its start timeout (seconds each). A process without
torch (``reasonrl env-check``, whose environment workers need none of it) preloads the
factory's module only."""


def _context():
    """How this process starts a worker: by its zygote where it has one
    (:mod:`reasonrl.runtime.zygote`), else by multiprocessing's forkserver (``spawn`` where
    there is none)."""
    if zygote.running():
        return _ZYGOTE
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    global _forkserver_owner
    if _forkserver_owner is None:
        _forkserver_owner = os.getpid()
        atexit.register(_end_forkserver)
    return multiprocessing.get_context("forkserver")


class _ZygoteStart:
    """The part of a multiprocessing context a :class:`_Child` uses, for a zygote's workers."""

    Pipe = staticmethod(multiprocessing.Pipe)

    @staticmethod
    def Process(target, args, name, daemon):  # noqa: N802 - a context's spelling
        return zygote.ZygoteProcess(target, args, name)

    @staticmethod
    def get_start_method() -> str:
        return "zygote"


_ZYGOTE = _ZygoteStart()


_forkserver_owner: int | None = None
"""The process whose exit ends its forkserver (:func:`_end_forkserver`); a process forked from
it inherits the value and leaves the forkserver alone."""


def _forkserver_pid() -> int | None:
    """The pid of this process's forkserver, or None where it has not started one."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def _end_forkserver() -> None:
    """At this process's exit: end the forkserver it started with SIGTERM, which a forkserver
    does not handle, so it dies at once. Left to notice the exit itself, it would tear down its
    imports (torch, ``transformers``: about a second of CPU) after this process is gone."""
    pid = _forkserver_pid()
    if pid and os.getpid() == _forkserver_owner:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass  # already gone


def _stop_forkserver() -> None:
    """End this process's forkserver now (SIGTERM, then reaped), so that the next worker it
    starts starts a new one with the preload set then."""
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid is None:
        return
    try:
        os.kill(server._forkserver_pid, signal.SIGTERM)
    except OSError:
        pass  # gone already
    try:
        server._stop()  # closes this end of its pipe, reaps it and forgets its address
    except OSError:  # reaped already
        server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None


def start_worker_processes(factory_modules: tuple[str, ...]) -> None:
    """Prepare this process to start workers, now, while it runs one thread: import
    :data:`PRELOAD` and the modules of the factories its groups will use, then fork the zygote
    that starts each worker for the cost of a fork (:func:`~reasonrl.runtime.zygote.start_zygote`).
    Where forking is not safe, start the forkserver with those modules preloaded: its imports
    (seconds) then run beside the caller's own instead of when the first group starts."""
    modules = list(dict.fromkeys([*PRELOAD, *factory_modules]))
    for module in modules:
        importlib.import_module(module)
    if zygote.start_zygote():
        return
    ctx = _context()
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(modules)
        multiprocessing.forkserver.ensure_running()


def _send(conn, lock: threading.Lock, message: Any) -> None:
    """One message: its pickle (protocol 5) and the sizes of its out-of-band buffers (the raw
    bytes of NumPy arrays, such as a WeightsUpdate's), then each buffer written to the socket
    straight from where it lies, never copied into the pickle."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    sizes = b"".join(v.nbytes.to_bytes(8, "little") for v in views)
    with lock:
        conn.send_bytes(len(views).to_bytes(4, "little") + sizes + data)
        if views:
            with socket.socket(fileno=os.dup(conn.fileno())) as raw:
                for view in views:
                    raw.sendall(view)


def _receive(conn) -> Any:
    """A message :func:`_send` sent: each buffer read from the socket into one bytearray of its
    size (a pipe read at a time into a fresh object would cost an allocation per read)."""
    head = conn.recv_bytes()
    count = int.from_bytes(head[:4], "little")
    sizes = [int.from_bytes(head[4 + 8 * i : 12 + 8 * i], "little") for i in range(count)]
    buffers = []
    if count:
        with socket.socket(fileno=os.dup(conn.fileno())) as raw:
            for size in sizes:
                buffer = bytearray(size)
                view, got = memoryview(buffer), 0
                while got < size:
                    n = raw.recv_into(view[got:])
                    if n == 0:
                        raise EOFError("the other end closed the pipe in the middle of a message")
                    got += n
                buffers.append(buffer)
    return pickle.loads(head[4 + 8 * count :], buffers=buffers)


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling, else a RuntimeError with its text; the child's
    traceback is attached as a note either way."""
    note = "".join(traceback.format_exception(err)).rstrip()
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001 - any failure to round-trip
        err = RuntimeError(f"{type(err).__name__}: {err}")
    if hasattr(err, "add_note"):  # Python 3.11+
        err.add_note(f"in the worker process {os.getpid()}:\n{note}")
    return err


def _child_main(conn, factory: Callable[..., Any], args: tuple, concurrent: frozenset[str]) -> None:
    """The child: build the worker, then serve calls until the parent closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # A worker may start processes of its own (a rollout worker's environment pool); it ends
    # them when it closes, and ends itself when the parent's pipe closes.
    multiprocessing.current_process().daemon = False
    lock = threading.Lock()
    try:
        worker = factory(*args)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
        _send(conn, lock, ("failed", _portable(err)))
        return
    _send(conn, lock, ("ready", os.getpid()))
    calls: queue.Queue = queue.Queue()

    def run(call_id: int, method: str, call_args: tuple, kwargs: dict) -> None:
        try:
            result = ("ok", call_id, getattr(worker, method)(*call_args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - delivered through the future
            result = ("error", call_id, _portable(err))
        _send(conn, lock, result)

    def read() -> None:
        while True:
            try:
                message = _receive(conn)
            except (EOFError, OSError):
                os._exit(1)  # the parent is gone: nobody is waiting for results
            if message == _CLOSE:
                calls.put(None)
                return
            if message[1] in concurrent:
                run(*message)
            else:
                calls.put(message)

    threading.Thread(target=read, name="reasonrl-worker-reader", daemon=True).start()
    while (message := calls.get()) is not None:
        run(*message)
    close = getattr(worker, "close", None)
    if close is not None:
        close()


_MAIN_SWAP = threading.Lock()


@contextmanager
def _main_module_left_out() -> Iterator[None]:
    """While a child starts, ``__main__`` is a bare module, so the child does not run the
    caller's main module again. (A spawn or forkserver child imports the parent's script, or
    ``python -m`` module, as ``__mp_main__`` before it unpickles its target; a worker is built
    from reasonrl's factories and arguments, never from the script, and a script that calls
    ``reasonrl.train`` without an ``if __name__ == "__main__":`` guard would otherwise start
    training again in every worker, or fail there.)"""
    with _MAIN_SWAP:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


class _Child:
    """One child process, its pipe and the futures of its unanswered calls."""

    def __init__(self, ctx, factory, args, concurrent: frozenset[str], name: str, start_timeout_s: float) -> None:
        self.name = name
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child_conn, factory, args, concurrent), name=name, daemon=True)
        with _main_module_left_out():
            self.proc.start()
        child_conn.close()
        self.lock = threading.Lock()  # one message on the pipe at a time
        self.state = threading.Lock()  # pending and dead change together
        self.pending: dict[int, Future] = {}
        self.dead: WorkerDied | None = None
        self.pid = self._handshake(start_timeout_s)
        self.reader = threading.Thread(target=self._read, name=f"reasonrl-{name}-results", daemon=True)
        self.reader.start()

    def _handshake(self, timeout_s: float) -> int:
        if not self.conn.poll(timeout_s):
            self.kill()
            raise WorkerTimeout(f"{self.name}: the worker process did not start within {timeout_s} s")
        try:
            kind, value = _receive(self.conn)
        except (EOFError, OSError):
            self.proc.join(timeout=5)
            raise WorkerDied(f"{self.name}: the worker process exited while starting (exit code {self.proc.exitcode})") from None
        if kind == "failed":
            self.proc.join(timeout=5)
            raise value
        return value

    def _read(self) -> None:
        while True:
            try:
                kind, call_id, value = _receive(self.conn)
            except (EOFError, OSError):
                break
            with self.state:
                future = self.pending.pop(call_id)
            if kind == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)
        with self.state:
            self.dead = self._ended()
            orphans, self.pending = list(self.pending.values()), {}
        for future in orphans:
            future.set_exception(self.dead)

    def submit(self, call_id: int, method: str, args: tuple, kwargs: dict) -> Future:
        future: Future = Future()
        with self.state:
            dead = self.dead
            if dead is None:
                self.pending[call_id] = future
        if dead is not None:
            future.set_exception(dead)
            return future
        try:
            _send(self.conn, self.lock, (call_id, method, args, kwargs))
        except (OSError, ValueError):
            with self.state:
                orphan = self.pending.pop(call_id, None)
            if orphan is not None:
                orphan.set_exception(self._ended())
        return future

    def _ended(self) -> WorkerDied:
        self.proc.join(timeout=5)
        return WorkerDied(f"{self.name}: the worker process (pid {self.pid}) ended, exit code {self.proc.exitcode}")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)

    def close(self, timeout_s: float) -> None:
        try:
            _send(self.conn, self.lock, _CLOSE)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=timeout_s)
        self.kill()
        self.release()

    def release(self) -> None:
        """Close the pipe once the reader thread is done with it (the process has ended). A
        descriptor closed under a thread that reads it is free for the next file this process
        opens, and the thread, reading on by its number, would take that file's bytes: the
        pipe's socket is shut down first (the thread reads its end), then closed."""
        try:
            with socket.socket(fileno=os.dup(self.conn.fileno())) as raw:
                raw.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass  # closed already
        if self.reader is not threading.current_thread():  # a future's callback may close the group
            self.reader.join(timeout=10)
        self.conn.close()


class ProcessGroup:
    """One worker per entry of ``args_per_worker``, each built by ``factory(*args)`` in a
    process of its own: the WorkerGroup protocol, plus :meth:`submit_to`, :meth:`restart`,
    :meth:`kill` and ``pids`` (as :class:`~reasonrl.runtime.ray.RayGroup`).

    ``timeout_s`` bounds :meth:`call`; ``start_timeout_s`` starting a worker (at start and in
    :meth:`restart`); ``concurrent`` names the methods that run beside a running call (see the
    module docstring). ``pids`` are the children's process ids. ``preload_models=False``: the
    workers hold no model (the pre-start check's graders), so a forkserver this group starts
    preloads the factory's module only, not :data:`PRELOAD` (seconds of imports), and ends
    when the group closes, leaving the next group to start one with its own preload.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        args_per_worker: list[tuple],
        *,
        name: str = "worker",
        timeout_s: float = 600.0,
        start_timeout_s: float = 300.0,
        concurrent: tuple[str, ...] = (),
        preload_models: bool = True,
    ) -> None:
        if len(args_per_worker) < 1:
            raise ValueError(f"ProcessGroup {name}: expected at least one worker")
        self.name = name
        self.size = len(args_per_worker)
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._factory, self._args = factory, [tuple(a) for a in args_per_worker]
        self._concurrent = frozenset(concurrent)
        self._preload_models = preload_models
        self._own_forkserver = False
        self._ids = itertools.count()
        self._children: list[_Child] = []
        try:
            for rank in range(self.size):
                self._children.append(self._start(rank))
        except BaseException:
            self.kill()
            raise

    def _start(self, index: int) -> _Child:
        label = self.name if self.size == 1 else f"{self.name}[{index}]"
        ctx = _context()  # asked at each start: a zygote that died leaves the restarts to the forkserver
        if ctx.get_start_method() != "forkserver":
            return _Child(ctx, self._factory, self._args[index], self._concurrent, label, self.start_timeout_s)
        heavy = PRELOAD if self._preload_models and "torch" in sys.modules else ()
        ctx.set_forkserver_preload(list(dict.fromkeys([*heavy, self._factory.__module__])))
        running = _forkserver_pid()
        child = _Child(ctx, self._factory, self._args[index], self._concurrent, label, self.start_timeout_s)
        if not self._preload_models and _forkserver_pid() != running:
            self._own_forkserver = True  # started for this group's preload: it ends with the group
        return child

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self._children]

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        return [child.submit(next(self._ids), method, args, kwargs) for child in self._children]

    def submit_to(self, index: int, method: str, *args: Any, **kwargs: Any) -> Future:
        """Call ``method`` on worker ``index`` only."""
        return self._children[index].submit(next(self._ids), method, args, kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return gather(self.submit(method, *args, **kwargs), self.timeout_s, f"{self.name}.{method}")

    def restart(self, index: int) -> None:
        """SIGKILL worker ``index`` and start a new one from the same arguments, within
        ``start_timeout_s``; its calls in flight fail with WorkerDied, for the caller to submit again."""
        old = self._children[index]
        old.kill()
        old.release()
        self._children[index] = self._start(index)

    def grow(self, args: tuple) -> None:
        """Start one more worker, ``factory(*args)``, as index ``size`` (within ``start_timeout_s``)."""
        self._args.append(tuple(args))
        try:
            child = self._start(len(self._args) - 1)
        except BaseException:
            self._args.pop()
            raise
        self._children.append(child)
        self.size += 1

    def shrink(self, timeout_s: float = 10.0) -> None:
        """Close the last worker (it finishes its running call, then ends; killed after
        ``timeout_s``) and drop it."""
        if self.size <= 1:
            raise ValueError(f"ProcessGroup {self.name}: cannot shrink below one worker")
        child = self._children.pop()
        self._args.pop()
        self.size -= 1
        child.close(timeout_s)

    def kill(self) -> None:
        """SIGKILL every child (a hung one included) and reap it; pending calls fail with WorkerDied."""
        for child in self._children:
            child.kill()

    def close(self, timeout_s: float = 10.0) -> None:
        """Let each child finish its running call and close its worker, then end it (killed
        after ``timeout_s``); then the forkserver, where this group started it for its own preload."""
        for child in self._children:
            child.close(timeout_s)
        if self._own_forkserver:
            _stop_forkserver()
            self._own_forkserver = False
