"""How ``env.name`` becomes an env: the shipped environments (:data:`ENVS`) and :func:`make_env`.

    env = make_env("grid", {"size": 4})
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("R")

:func:`make_env` builds one from a registry name
(:data:`ENVS`), ``module:Class`` or ``path/to/file.py:Class``, wraps a ``gymnasium.Env`` (or any env with Gymnasium's
``reset(seed=..., options=...)`` keywords, as GEM's are) in :class:`~reasonrl.env.base.GymTextAdapter`, and wraps
it in :class:`~reasonrl.env.tools.ToolEnv` when tools are asked for.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from reasonrl.env.arith import ToolArithEnv
from reasonrl.env.base import Env, GymTextAdapter, speaks_gymnasium
from reasonrl.env.grid import GridEnv
from reasonrl.env.tools import TOOL_CALL_PATTERN, TOOL_RESPONSE_FORMAT, TOOLS, ToolEnv
from reasonrl.errors import InputError, error_line
from reasonrl.plugins import SPEC_FORMS, is_plugin_spec, load_object

ENVS: dict[str, Callable[..., Env]] = {"grid": GridEnv, "tool_arith": ToolArithEnv}
"""The shipped environments by ``env.name``."""


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
