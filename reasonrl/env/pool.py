"""Many environments stepped in parallel in worker processes, each call with a timeout.

    with EnvPool("grid", {"size": 4}, size=8, workers=start) as pool:   # start: reasonrl.runtime.pool.PoolStart
        firsts = pool.reset_many([0, 1, 2, 3, 4, 5, 6, 7])   # (observation, info) | EnvFailure, by slot
        steps = pool.step_many(["R", None, "D", "U", "L", "R", "R", "D"])   # Step | EnvFailure | None

The pool holds ``size`` episode slots; slot ``i`` lives in worker ``i % workers`` (each worker
builds one env per slot it holds, by :func:`~reasonrl.env.registry.make_env`). ``workers`` is
how the workers start (a :class:`~reasonrl.runtime.pool.PoolStart`: ``count`` processes, at
most ``size`` used, each call bounded by its ``timeout_s``); the runtime's
:class:`~reasonrl.runtime.pool.WorkerPool` sends the calls and replaces a worker that hangs
or dies. A call sends each worker the calls of its slots at once, so workers run in parallel
while each runs its own slots one after another; every result is checked by
:func:`~reasonrl.env.base.check_reset` / :func:`~reasonrl.env.base.check_step`. A slot whose
env raises, returns something malformed, or takes longer than the timeout gets an
:class:`EnvFailure` instead of a result, and the other slots go on.

A call past the timeout (or a worker that dies) costs more than its own slot: the worker is
killed and replaced by a fresh one, and every episode it held is gone. That call fails
(kind ``timeout``, or ``died``), the worker's other calls not answered yet fail (kind
``died``), and its slots whose episodes were in progress fail at their next step (kind
``died``, without calling anything); the results it had already sent stand. Any slot can be
reset after a failure and used again. A call may name fewer than ``size`` slots (the first
ones: a last, smaller wave of episodes); ``size`` itself is fixed: build a new pool for
another (``EnvPool.from_config(cfg.env, size, workers)``).

``workers=None`` runs the envs in this process: the same checks and failures, no timeouts.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Literal

from reasonrl.config.schema import EnvConfig
from reasonrl.env.base import Env, EnvProtocolError, Reset, Step, check_reset, check_step
from reasonrl.env.registry import make_env
from reasonrl.env.tools import TOOL_CALL_PATTERN, TOOL_RESPONSE_FORMAT
from reasonrl.errors import InputError, error_line

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


def _sendable(method: str, status: str, payload: Any, seconds: float) -> tuple[str, Any, float]:
    """``(status, payload, seconds)`` if it pickles (it travels back to the pool); else a
    ``protocol`` failure saying so."""
    try:
        pickle.dumps(payload, protocol=5)
    except Exception as e:  # noqa: BLE001 - whatever pickling raises (PicklingError, TypeError, ...)
        why = f"{method}() returned a result that cannot be sent from the env worker: {error_line(e)}"
        return "protocol", why, seconds
    return status, payload, seconds


class EnvWorker:
    """What an env worker process runs: one env of ``spec`` per slot of ``slots``, on
    ``threads`` torch threads (the pool's :class:`~reasonrl.runtime.pool.PoolStart`). An env
    that cannot be built is an InputError (raised in the pool's process when the worker starts)."""

    def __init__(self, spec: _EnvSpec, slots: list[int], threads: int = 1) -> None:
        import torch  # loaded already in a worker process (forked from the zygote or the forkserver)

        torch.set_num_threads(threads)
        try:
            self.envs = {slot: spec.build() for slot in slots}
        except Exception as e:  # noqa: BLE001 - every failure to build an env is the env's input
            raise InputError(str(e) if isinstance(e, InputError) else error_line(e)) from None

    def call(self, slot: int, method: str, argument: Any) -> tuple[str, Any, float]:
        """``env.reset(argument)`` or ``env.step(argument)`` of slot ``slot``, checked:
        ``(status, checked result or message, seconds)``, status ``ok``, ``error`` or ``protocol``."""
        return _sendable(method, *_call(self.envs[slot], method, argument))

    def close(self) -> None:
        """Close every env (the process ends after: an env's failure to close is not reported)."""
        for env in self.envs.values():
            close = getattr(env, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()


class EnvPool:
    """``size`` episode slots of the env ``name`` (``env.name``, built with ``args`` and
    ``tools`` as :func:`~reasonrl.env.registry.make_env` builds it) over the workers ``workers``
    starts (a :class:`~reasonrl.runtime.pool.PoolStart`, at most ``size`` of its ``count``; None:
    in this process), every call bounded by the workers' timeout (see the module).

    ``last_call_s[i]`` is how long slot ``i``'s env took in the last call that reached it
    (None when it timed out or its worker died); ``replacements`` counts replaced workers;
    ``pids`` are the workers' process ids. An env that cannot be built is an InputError here,
    when the pool starts. Use as a context manager, or call ``close()``.
    """

    def __init__(self, name: str, args: dict[str, Any] | None = None, size: int = 1,
                 workers: Callable[..., Any] | None = None, tools: Sequence[str] = (),
                 tool_call_pattern: str = TOOL_CALL_PATTERN, tool_response_format: str = TOOL_RESPONSE_FORMAT):
        if type(size) is not int or size < 1:
            raise ValueError(f"EnvPool size: got {size!r}, expected an integer >= 1")
        self.size = size
        self.last_call_s: list[float | None] = [None] * size
        self._spec = _EnvSpec(name, dict(args or {}), tuple(tools), tool_call_pattern, tool_response_format)
        self._in_episode = [False] * size
        self._lost: list[str | None] = [None] * size
        self._envs: list[Env] = []
        self._pool = None
        if workers is None:
            self._envs = [self._spec.build() for _ in range(size)]
            return
        count = min(workers.count, size)
        self._slots = [list(range(w, size, count)) for w in range(count)]
        self._pool = workers(EnvWorker, [(self._spec, slots, workers.threads) for slots in self._slots])

    @classmethod
    def from_config(cls, env: EnvConfig, size: int, workers: Callable[..., Any] | None = None) -> EnvPool:
        """The pool of ``env.*`` (``name``, ``args``, ``tools``, ``tool_call_pattern``,
        ``tool_response_format``) with ``size`` slots over the workers ``workers`` starts
        (``runtime.roles.env``; None: in this process)."""
        return cls(env.name, env.args, size, workers, env.tools, env.tool_call_pattern, env.tool_response_format)

    @property
    def replacements(self) -> int:
        """How many workers were replaced so far."""
        return 0 if self._pool is None else self._pool.restarts_done

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (none when the envs run in this process)."""
        return [] if self._pool is None else self._pool.pids

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
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
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
        if self._pool is not None:
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
        """Send each worker its slots' calls, then collect the results as they come. A call
        that times out or ends its worker fails, and so do the calls lost with that worker;
        the worker's other slots become ``casualties`` (their episodes are gone)."""
        pool, results = self._pool, [None] * self.size
        for worker, slots in enumerate(self._slots):
            for slot in slots:
                if calls[slot] is not None:
                    pool.submit(worker, "call", slot, *calls[slot], key=(slot, calls[slot][0]))
        lost_why: dict[int, str] = {}
        while pool.busy:
            for done in pool.wait():
                (slot, method), worker = done.key, done.index
                self.last_call_s[slot] = None
                if done.outcome == "ok":
                    status, payload, self.last_call_s[slot] = done.value
                    results[slot] = _outcome(slot, status, payload)
                elif done.outcome == "error":
                    results[slot] = EnvFailure(slot, f"{method}() failed in the env worker: {error_line(done.value)}",
                                               "error")
                elif done.outcome == "lost":
                    results[slot] = EnvFailure(slot, lost_why[worker], "died")
                else:
                    if done.outcome == "timeout":
                        message = f"{method}() took longer than runtime.roles.env.timeout_s = {pool.timeout_s:g}s"
                        kind, what = "timeout", "timed out"
                    else:
                        message, kind, what = f"{method}() ended the env worker ({done.value})", "died", "ended it"
                    results[slot] = EnvFailure(slot, message, kind)
                    lost_why[worker] = (f"lost with its env worker, replaced after slot {slot}'s {method}() {what}; "
                                        "reset the slot")
        for worker, why in lost_why.items():
            casualties.update({slot: why for slot in self._slots[worker] if not isinstance(results[slot], EnvFailure)})
        return results
