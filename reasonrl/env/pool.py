"""Many environments stepped in parallel in worker processes, each call with a timeout.

    with EnvPool("grid", {"size": 4}, size=8, workers=2, step_timeout_s=10.0) as pool:
        firsts = pool.reset_many([0, 1, 2, 3, 4, 5, 6, 7])   # (observation, info) | EnvFailure, by slot
        steps = pool.step_many(["R", None, "D", "U", "L", "R", "R", "D"])   # Step | EnvFailure | None

The pool holds ``size`` episode slots; slot ``i`` lives in worker ``i % workers`` (each worker
process builds one env per slot it holds, by :func:`~reasonrl.env.registry.make_env`). A call
sends each worker the calls of its slots at once, so workers run in parallel while each runs
its own slots one after another; every result is checked by
:func:`~reasonrl.env.base.check_reset` / :func:`~reasonrl.env.base.check_step`. A slot whose
env raises, returns something malformed, or takes longer than ``step_timeout_s`` gets an
:class:`EnvFailure` instead of a result, and the other slots go on.

A call past the timeout (or a worker that dies) costs more than its own slot: the worker is
killed and replaced by a fresh one, and every episode it held is gone. That call fails
(kind ``timeout``, or ``died``), the worker's other calls not answered yet fail (kind
``died``), and its slots whose episodes were in progress fail at their next step (kind
``died``, without calling anything); the results it had already sent stand. Any slot can be reset after a failure and used again. A call may name fewer than
``size`` slots (the first ones: a last, smaller wave of episodes); ``size`` itself is fixed:
build a new pool for another (``EnvPool.from_config(cfg.env, size)``).

``workers=0`` runs the envs in this process: the same checks and failures, no timeouts.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal

from reasonrl.config.schema import EnvConfig, RoleConfig
from reasonrl.env.base import Env, EnvProtocolError, Reset, Step, check_reset, check_step
from reasonrl.env.registry import make_env
from reasonrl.env.tools import TOOL_CALL_PATTERN, TOOL_RESPONSE_FORMAT
from reasonrl.errors import InputError, error_line

START_TIMEOUT_S = 60.0
"""Seconds a new worker has to import and build its envs."""
STOP_TIMEOUT_S = 2.0
"""Seconds a worker asked to stop has to close its envs before it is killed."""


@dataclass(frozen=True)
class EnvFailure:
    """Why slot ``slot`` has no result: ``kind`` is ``error`` (the env raised), ``protocol``
    (it returned something malformed), ``timeout`` (it ran past ``step_timeout_s``) or ``died``
    (its worker process ended, or was replaced, under it)."""

    slot: int
    message: str
    kind: Literal["error", "timeout", "protocol", "died"]


@dataclass(frozen=True)
class _EnvSpec:
    """What a worker needs to build an env: :func:`~reasonrl.env.registry.make_env`'s arguments."""

    name: str
    args: dict[str, Any]
    tools: tuple[str, ...]
    tool_call_pattern: str
    tool_response_format: str

    def build(self) -> Env:
        """A new env, as :func:`~reasonrl.env.registry.make_env` builds it."""
        return make_env(self.name, self.args, self.tools, self.tool_call_pattern, self.tool_response_format)


def _call(env: Env, method: str, argument: Any) -> tuple[str, Any, float]:
    """Run ``env.reset(argument)`` or ``env.step(argument)``: ``("ok", checked result,
    seconds)``, or ``("error" | "protocol", message, seconds)``."""
    start = time.perf_counter()
    try:
        raw = env.reset(argument) if method == "reset" else env.step(argument)
    except EnvProtocolError as e:  # an adapter's check
        return "protocol", str(e), time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - the env's failure is its slot's, not the pool's
        return "error", f"{method}() raised {error_line(e)}", time.perf_counter() - start
    seconds = time.perf_counter() - start
    try:
        return "ok", (check_reset if method == "reset" else check_step)(raw), seconds
    except EnvProtocolError as e:
        return "protocol", str(e), seconds


def _outcome(slot: int, status: str, payload: Any) -> Any:
    """The result of a :func:`_call`: the checked tuple, or the slot's :class:`EnvFailure`."""
    return payload if status == "ok" else EnvFailure(slot, payload, status)


def _encode(slot: int, method: str, status: str, payload: Any, seconds: float) -> bytes:
    """The message ``(slot, status, payload, seconds)`` pickled as ``Connection.send`` pickles
    it; a result that does not pickle becomes a ``protocol`` failure."""
    try:
        return ForkingPickler.dumps((slot, status, payload, seconds))
    except Exception as e:  # noqa: BLE001 - whatever pickling raises (PicklingError, TypeError, ...)
        message = f"{method}() returned a result that cannot be sent from the env worker: {error_line(e)}"
        return ForkingPickler.dumps((slot, "protocol", message, seconds))


def _worker_main(conn, spec: _EnvSpec, slots: list[int]) -> None:
    """Worker loop: build one env per slot and send ``""`` (or why not), then receive lists of
    ``(slot, method, argument)`` and send ``(slot, status, payload, seconds)`` for each as it
    is done; ``None`` or a closed pipe ends it (closing the envs)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    try:
        envs = {slot: spec.build() for slot in slots}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send((str(e) if isinstance(e, InputError) else "") or error_line(e))
        return
    try:
        conn.send("")
        while (calls := conn.recv()) is not None:
            for slot, method, argument in calls:
                conn.send_bytes(_encode(slot, method, *_call(envs[slot], method, argument)))
    except (EOFError, OSError):
        pass
    finally:
        for env in envs.values():
            close = getattr(env, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):  # the process ends: nothing is left to tell
                    close()


class _Worker:
    """One worker process, its slots, the calls it was sent and has not answered yet (in
    order), and when the one it is running times out."""

    def __init__(self, ctx, spec: _EnvSpec, slots: list[int]) -> None:
        self.spec, self.slots = spec, slots
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, spec, slots), name="reasonrl-env",
                                daemon=True)
        self.proc.start()
        child_conn.close()
        self.pending: deque[tuple[int, str]] = deque()
        self.deadline = math.inf

    def wait_ready(self) -> None:
        """Return once the worker has built its envs; InputError with the worker's message
        when it could not, RuntimeError when it did not answer within START_TIMEOUT_S."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.stop(kill=True)
            raise RuntimeError(f"env worker for env.name = {self.spec.name!r}: no answer {START_TIMEOUT_S:g}s "
                               "after it started")
        try:
            error = self.conn.recv()
        except EOFError:
            self.proc.join(timeout=1.0)
            error = f"env.name = {self.spec.name!r}: the env worker exited with code {self.proc.exitcode}"
        if error:
            self.stop(kill=True)
            raise InputError(error)

    def stop(self, kill: bool) -> None:
        """End the process (asking first unless ``kill``), reap it and close the pipe."""
        if not kill:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(timeout=STOP_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def _start_method() -> str:
    """``forkserver`` (a worker never inherits the trainer's threads), else ``spawn``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class EnvPool:
    """``size`` episode slots of the env ``name`` (``env.name``, built with ``args`` and
    ``tools`` as :func:`~reasonrl.env.registry.make_env` builds it) over ``workers`` processes (at
    most ``size``), every call bounded by ``step_timeout_s`` (see the module).

    ``last_call_s[i]`` is how long slot ``i``'s env took in the last call that reached it
    (None when it timed out or its worker died); ``replacements`` counts replaced workers. An
    env that cannot be built is an InputError here, when the pool starts. Use as a context
    manager, or call ``close()``.
    """

    def __init__(self, name: str, args: dict[str, Any] | None = None, size: int = 1, workers: int = 1,
                 step_timeout_s: float = 10.0, tools: Sequence[str] = (),
                 tool_call_pattern: str = TOOL_CALL_PATTERN, tool_response_format: str = TOOL_RESPONSE_FORMAT):
        if type(size) is not int or size < 1:
            raise ValueError(f"EnvPool size: got {size!r}, expected an integer >= 1")
        if type(workers) is not int or workers < 0:
            raise InputError(f"runtime.roles.env.count = {workers!r}: expected an integer >= 0")
        if not step_timeout_s > 0:
            raise InputError(f"runtime.roles.env.timeout_s = {step_timeout_s!r}: expected a number > 0")
        self.size = size
        self.step_timeout_s = float(step_timeout_s)
        self.replacements = 0
        self.last_call_s: list[float | None] = [None] * size
        self._spec = _EnvSpec(name, dict(args or {}), tuple(tools), tool_call_pattern, tool_response_format)
        self._in_episode = [False] * size
        self._lost: list[str | None] = [None] * size
        self._envs: list[Env] = []
        self._workers: list[_Worker] = []
        if workers == 0:
            self._envs = [self._spec.build() for _ in range(size)]
            return
        self._ctx = multiprocessing.get_context(_start_method())
        count = min(workers, size)
        try:
            self._workers = [_Worker(self._ctx, self._spec, list(range(w, size, count))) for w in range(count)]
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, env: EnvConfig, role: RoleConfig, size: int) -> EnvPool:
        """The pool of ``env.*`` (``name``, ``args``, ``tools``, ``tool_call_pattern``,
        ``tool_response_format``) with ``size`` slots over ``role.count`` processes
        (``runtime.roles.env``), each call bounded by ``role.timeout_s``."""
        return cls(env.name, env.args, size, role.count, role.timeout_s, env.tools, env.tool_call_pattern,
                   env.tool_response_format)

    def reset_many(self, seeds: Sequence[int]) -> list[Reset | EnvFailure]:
        """Reset slot ``i`` with ``seeds[i]`` for the first ``len(seeds)`` slots (at most
        ``size``; the others are left as they are): one ``(observation, info)`` or
        :class:`EnvFailure` per seed."""
        calls = self._calls("reset_many", "seeds", [("reset", seed) for seed in seeds])
        for slot in range(len(seeds)):
            self._lost[slot] = None
        return self._run(calls)[: len(seeds)]

    def step_many(self, actions: Sequence[str | None]) -> list[Step | EnvFailure | None]:
        """Step slot ``i`` with ``actions[i]`` for the first ``len(actions)`` slots (at most
        ``size``): one 5-tuple, :class:`EnvFailure` or None per action, None where the action
        is None (the slot sits this call out, as do the slots past the actions). A slot given
        an action must have an episode in progress (reset, not ended, not failed), else
        ValueError before anything runs."""
        for slot, action in enumerate(actions):
            if action is not None and not (self._in_episode[slot] or self._lost[slot]):
                raise ValueError(f"EnvPool.step_many: slot {slot} has no episode in progress (reset it first)")
        lost = {slot: why for slot, (action, why) in enumerate(zip(actions, self._lost)) if action is not None and why}
        calls = self._calls("step_many", "actions", [
            None if action is None or slot in lost else ("step", action) for slot, action in enumerate(actions)])
        results: list[Any] = self._run(calls)[: len(actions)]
        for slot, message in lost.items():
            self._lost[slot] = None
            results[slot] = EnvFailure(slot, message, "died")
        return results

    def close(self) -> None:
        """Stop every worker (which closes its envs) and close the in-process envs (idempotent)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop(kill=False)
        envs, self._envs = self._envs, []
        for env in envs:
            close = getattr(env, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _calls(self, method: str, what: str, calls: list[tuple[str, Any] | None]) -> list[tuple[str, Any] | None]:
        """``calls`` padded with None to one per slot; ValueError when there are more than slots."""
        if len(calls) > self.size:
            raise ValueError(f"EnvPool.{method}: {len(calls)} {what} for {self.size} slots")
        return calls + [None] * (self.size - len(calls))

    def _run(self, calls: list[tuple[str, Any] | None]) -> list[Any]:
        """Every call's result by slot (None where there is no call), the slots' episode
        state brought up to date."""
        casualties: dict[int, str] = {}
        if self._workers:
            results = self._run_in_workers(calls, casualties)
        else:
            results = [None] * self.size
            for slot, call in enumerate(calls):
                if call is not None:
                    status, payload, self.last_call_s[slot] = _call(self._envs[slot], *call)
                    results[slot] = _outcome(slot, status, payload)
        for slot, call in enumerate(calls):
            if call is not None:
                result = results[slot]
                self._in_episode[slot] = not isinstance(result, EnvFailure) and (
                    call[0] == "reset" or not (result[2] or result[3]))
        for slot, why in casualties.items():
            if self._in_episode[slot]:
                self._in_episode[slot], self._lost[slot] = False, why
        return results

    def _run_in_workers(self, calls: list[tuple[str, Any] | None], casualties: dict[int, str]) -> list[Any]:
        """Send each worker its slots' calls, then collect the results as they come, failing
        (and replacing the worker of) a call that runs past the timeout."""
        results: list[Any] = [None] * self.size
        for worker in list(self._workers):
            batch = [(slot, *calls[slot]) for slot in worker.slots if calls[slot] is not None]
            if not batch:
                continue
            worker.pending.extend((slot, method) for slot, method, _ in batch)
            worker.deadline = time.monotonic() + self.step_timeout_s
            try:
                worker.conn.send(batch)
            except OSError:
                worker.proc.join(timeout=1.0)
                self._replace(worker, results, casualties, "died",
                              f"the env worker had ended (exit code {worker.proc.exitcode})")
        while busy := [w for w in self._workers if w.pending]:
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = wait([w.conn for w in busy], timeout)
            for worker in busy:
                if worker.conn in ready:
                    self._receive(worker, results, casualties)
                elif worker.deadline <= time.monotonic():
                    method = worker.pending[0][1]
                    self._replace(worker, results, casualties, "timeout",
                                  f"{method}() took longer than runtime.roles.env.timeout_s = {self.step_timeout_s:g}s")
        return results

    def _receive(self, worker: _Worker, results: list[Any], casualties: dict[int, str]) -> None:
        """Store every result the worker has sent; a worker that died fails the call it was on."""
        try:
            while worker.pending and worker.conn.poll():
                slot, status, payload, seconds = worker.conn.recv()
                worker.pending.popleft()
                results[slot] = _outcome(slot, status, payload)
                self.last_call_s[slot] = seconds
                worker.deadline = time.monotonic() + self.step_timeout_s
        except (EOFError, OSError):
            worker.proc.join(timeout=1.0)
            method = worker.pending[0][1]
            self._replace(worker, results, casualties, "died",
                          f"{method}() ended the env worker (exit code {worker.proc.exitcode})")

    def _replace(self, worker: _Worker, results: list[Any], casualties: dict[int, str], kind: str,
                 message: str) -> None:
        """Fail the call ``worker`` is on with ``message``, and the calls after it as lost;
        note its other slots as casualties (their episodes are gone); start a new worker in
        its place."""
        slot, method = worker.pending.popleft()
        results[slot] = EnvFailure(slot, message, kind)
        self.last_call_s[slot] = None
        why = (f"lost with its env worker, replaced after slot {slot}'s {method}() "
               f"{'timed out' if kind == 'timeout' else 'ended it'}; reset the slot")
        failed = {slot}
        for other, _ in worker.pending:
            results[other] = EnvFailure(other, why, "died")
            self.last_call_s[other] = None
            failed.add(other)
        worker.pending.clear()
        casualties.update({other: why for other in worker.slots if other not in failed})
        worker.stop(kill=True)
        index = self._workers.index(worker)
        self._workers[index] = _Worker(self._ctx, self._spec, worker.slots)
        self.replacements += 1
        self._workers[index].wait_ready()
