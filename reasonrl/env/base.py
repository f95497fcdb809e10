"""The environment protocol (Gymnasium's, with text), its checks, and how ``env.name`` becomes an env.

    env = make_env("grid", {"size": 4})
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("R")

An :class:`Env` is anything with ``reset(seed)`` and ``step(action)`` returning Gymnasium's
tuples with text observations and actions; ``close()`` is optional. The ``info`` of an
episode's last step may carry ``"success": bool``; without it an episode succeeded when its
return (the sum of its rewards) is positive. :func:`make_env` builds one from a registry name
(:data:`ENVS`), ``module:Class`` or ``path/to/file.py:Class``, wraps a ``gymnasium.Env`` (or any env with Gymnasium's
``reset(seed=..., options=...)`` keywords, as GEM's are) in :class:`GymTextAdapter`, and wraps
it in :class:`~reasonrl.env.tools.ToolEnv` when tools are asked for.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reasonrl.env.arith import ToolArithEnv
from reasonrl.env.grid import GridEnv
from reasonrl.env.tools import TOOL_CALL_PATTERN, TOOL_RESPONSE_FORMAT, TOOLS, ToolEnv
from reasonrl.errors import InputError, error_line
from reasonrl.plugins import SPEC_FORMS, is_plugin_spec, load_object

Reset = tuple[str, dict[str, Any]]
"""``(observation, info)``."""
Step = tuple[str, float, bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)``."""


class Env(Protocol):
    """A text environment: Gymnasium's API with ``str`` observations and actions.

    ``terminated``: the episode reached an end state (won, lost); ``truncated``: it was cut
    (a step limit). Either ends it; the next call is ``reset``. ``close()``, when defined,
    releases what the env holds.
    """

    def reset(self, seed: int) -> Reset:
        """Start the episode of ``seed`` (the same seed, the same episode): the first
        observation and an info dict."""

    def step(self, action: str) -> Step:
        """Apply the policy's turn ``action``: the next observation, the turn's reward, whether
        the episode terminated or was truncated, and an info dict."""


class EnvProtocolError(InputError):
    """An environment returned something other than the protocol's tuples (the message names
    the method and the field)."""


ENVS: dict[str, Callable[..., Env]] = {"grid": GridEnv, "tool_arith": ToolArithEnv}
"""The shipped environments by ``env.name``."""


def check_reset(result: Any) -> Reset:
    """``result`` of ``reset`` as plain Python values, or an :class:`EnvProtocolError`
    (``reset() returned observation of type int, expected str``)."""
    observation, info = _unpack(result, "reset", ("observation", "info"))
    return _observation(observation, "reset"), _info(info, "reset")


def check_step(result: Any) -> Step:
    """``result`` of ``step`` as plain Python values (numpy numbers and bools become
    ``float`` and ``bool``), or an :class:`EnvProtocolError` naming the field: the observation
    must be a ``str``, the reward a finite real number, ``terminated`` and ``truncated`` bools,
    ``info`` a dict."""
    observation, reward, terminated, truncated, info = _unpack(
        result, "step", ("observation", "reward", "terminated", "truncated", "info"))
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise EnvProtocolError(f"step() returned reward of type {type(reward).__name__}, expected a number")
    if not math.isfinite(float(reward)):
        raise EnvProtocolError(f"step() returned reward {float(reward)}, expected a finite number")
    return (_observation(observation, "step"), float(reward), _flag(terminated, "terminated"),
            _flag(truncated, "truncated"), _info(info, "step"))


def _unpack(result: Any, method: str, names: tuple[str, ...]) -> tuple:
    if not isinstance(result, tuple) or len(result) != len(names):
        what = f"a tuple of {len(result)} items" if isinstance(result, tuple) else f"a {type(result).__name__}"
        raise EnvProtocolError(f"{method}() returned {what}, expected a tuple of {len(names)} ({', '.join(names)})")
    return result


def _observation(observation: Any, method: str) -> str:
    if not isinstance(observation, str):
        raise EnvProtocolError(f"{method}() returned observation of type {type(observation).__name__}, expected str")
    return observation


def _info(info: Any, method: str) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise EnvProtocolError(f"{method}() returned info of type {type(info).__name__}, expected dict")
    return info


def _flag(value: Any, name: str) -> bool:
    """A bool, or numpy's (``numpy.bool``, by the name of its type: numpy is not imported)."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    raise EnvProtocolError(f"step() returned {name} of type {type(value).__name__}, expected bool")


class GymTextAdapter:
    """A Gymnasium-style env (``reset(seed=..., options=...)``, text observations) as an
    :class:`Env`: ``reset(seed)`` calls ``inner.reset(seed=seed)``, ``step`` passes the action
    through, and both results go through :func:`check_reset` / :func:`check_step`."""

    def __init__(self, inner: Any):
        self.inner = inner

    def reset(self, seed: int) -> Reset:
        """``inner.reset(seed=seed)``, checked."""
        return check_reset(self.inner.reset(seed=seed))

    def step(self, action: str) -> Step:
        """``inner.step(action)``, checked."""
        return check_step(self.inner.step(action))

    def close(self) -> None:
        """``inner.close()``, if it has one."""
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


def speaks_gymnasium(env: Any) -> bool:
    """Whether ``env`` takes Gymnasium's keywords: a ``gymnasium.Env`` (looked up only when
    gymnasium is already imported, as it is wherever such an env was made), or an env whose
    ``reset`` has an ``options`` or a keyword-only ``seed`` parameter (GEM's)."""
    gymnasium = sys.modules.get("gymnasium")
    if gymnasium is not None and isinstance(env, gymnasium.Env):
        return True
    try:
        params = inspect.signature(env.reset).parameters
    except (TypeError, ValueError):
        return False
    seed = params.get("seed")
    return "options" in params or (seed is not None and seed.kind is inspect.Parameter.KEYWORD_ONLY)


def make_env(name: str, args: dict[str, Any] | None = None, tools: Sequence[str] = (),
             tool_call_pattern: str = TOOL_CALL_PATTERN, tool_response_format: str = TOOL_RESPONSE_FORMAT) -> Env:
    """The environment ``name`` (``env.name``: a key of :data:`ENVS`, ``module:Class`` or
    ``path/to/file.py:Class``)
    built with ``**args`` (``env.args``), adapted if it speaks Gymnasium, and inside a
    :class:`~reasonrl.env.tools.ToolEnv` offering ``tools`` (``env.tools``, keys of
    :data:`~reasonrl.env.tools.TOOLS`) when there are any.

    Raises InputError naming ``env.name`` when it cannot be found, is not an environment or
    fails to build, ``env.args.<key>`` for an argument it does not take or needs, and
    ``env.tools`` for an unknown tool.
    """
    args = dict(args or {})
    unknown = [tool for tool in tools if tool not in TOOLS]
    if unknown:
        raise InputError(f"env.tools: unknown tool {unknown[0]!r}; expected some of {', '.join(TOOLS)}")
    factory = _factory(name)
    _check_args(name, factory, args)
    try:
        env = factory(**args)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - any constructor failure is the config's to fix
        raise InputError(f"env.name = {name!r}: building it with env.args = {args} failed: {error_line(e)}") from e
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise InputError(f"env.name = {name!r}: built a {type(env).__name__}, which has no reset() and step()")
    if speaks_gymnasium(env):
        env = GymTextAdapter(env)
    if tools:
        env = ToolEnv(env, [TOOLS[tool] for tool in tools], tool_call_pattern, tool_response_format)
    return env


def env_attribute(env: Any, name: str) -> Any:
    """The attribute ``name`` of ``env`` or of the first env it wraps (through ``inner``) that
    has it, such as ``demonstration``; None when none has it."""
    while env is not None:
        if hasattr(env, name):
            return getattr(env, name)
        env = getattr(env, "inner", None)
    return None


def _factory(name: str) -> Callable[..., Any]:
    """What ``env.name`` names: a registry entry, or a plugin (``module:Class`` or
    ``path/to/file.py:Class``, :func:`reasonrl.plugins.load_object`)."""
    if name in ENVS:
        return ENVS[name]
    if not is_plugin_spec(name):
        close = difflib.get_close_matches(name, ENVS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InputError(f"env.name = {name!r}: unknown environment; {hint}expected one of {', '.join(ENVS)} "
                         f"or {SPEC_FORMS}")
    factory = load_object(name, "env.name")
    if not callable(factory):
        raise InputError(f"env.name = {name!r}: {name.rpartition(':')[2]!r} is a {type(factory).__name__}, not a class")
    return factory


def _check_args(name: str, factory: Callable[..., Any], args: dict[str, Any]) -> None:
    """An InputError naming ``env.args.<key>`` for a keyword ``factory`` does not take or a
    required one that is missing (nothing is checked when its signature cannot be read)."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        for key in args:
            if key not in named:
                close = difflib.get_close_matches(key, named, n=1)
                hint = f"did you mean env.args.{close[0]}? " if close else ""
                raise InputError(f"env.args.{key}: {name} takes no argument {key!r}; {hint}"
                                 f"it takes {', '.join(named) or 'none'}")
    for p in params:
        if p.name in named and p.default is p.empty and p.name not in args:
            raise InputError(f"env.args.{p.name}: {name} needs this argument (env.args.{p.name}=...)")
