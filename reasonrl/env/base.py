"""The environment protocol (Gymnasium's, with text), its checks, and the Gymnasium adapter.

An :class:`Env` is anything with ``reset(seed)`` and ``step(action)`` returning Gymnasium's
tuples with text observations and actions; ``close()`` is optional. The ``info`` of an
episode's last step may carry ``"success": bool``; without it an episode succeeded when its
return (the sum of its rewards) is positive. :class:`GymTextAdapter` makes an :class:`Env` of a
``gymnasium.Env`` (or any env with Gymnasium's ``reset(seed=..., options=...)`` keywords, as GEM's
are); :func:`reasonrl.env.registry.make_env` builds envs from ``env.name``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import sys
from typing import Any, Protocol

from reasonrl.errors import InputError

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
