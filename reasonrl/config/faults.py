"""The grammar of ``faults`` specs, ``kind@step[:key=value...]``: kinds, keys and defaults.

    faults = parse_specs(["crash@5", "slow@8:factor=3:worker=1"])   # InputError on a bad spec

The config rules (:func:`reasonrl.config.rules.validate`) parse a run's faults with it and
check that each can fire in that run, so ``--dry-run`` and the checks before anything loads
refuse what the run would. What each kind does, and how it fires once per run, is
:mod:`reasonrl.resilience.faults`; this module imports only the standard library and the errors.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable

from reasonrl.errors import InputError

# Per key: how to read its value, the rule it must satisfy, and that rule in words.
_KEYS: dict[str, tuple[Callable[[str], Any], Callable[[Any], bool], str]] = {
    "stage": (str, str.isidentifier, "a stage name such as gen, adv or update_actor"),
    "factor": (float, lambda v: 1 < v < math.inf, "a finite number > 1"),
    "worker": (int, lambda v: v >= 0, "an integer >= 0"),
    "steps": (int, lambda v: v >= 1, "an integer >= 1"),
    "count": (int, lambda v: v >= 1, "an integer >= 1"),
    "rank": (int, lambda v: v >= 0, "a trainer rank, an integer >= 0"),
}


def _read(key: str, text: str) -> Any:
    """The value of ``key`` from its text; ValueError when it breaks the key's rule."""
    convert, valid, _ = _KEYS[key]
    value = convert(text)
    if not valid(value):
        raise ValueError(text)
    return value


# Per kind: its keys with their defaults (None: the key may be left unset), in spec order.
KINDS: dict[str, dict[str, Any]] = {
    "crash": {"stage": None},
    "sigkill": {"stage": None},
    "hang": {"stage": "gen"},
    "nan": {},
    "slow": {"factor": 3.0, "worker": 0, "stage": "gen", "steps": 8},
    "ckpt_kill": {},
    "disk_full": {"count": 1},
    "reward_timeout": {"count": 1},
    "reward_error": {"count": 1},
    "slow_rank": {"rank": 1, "factor": 3.0, "steps": 8},
    "hang_rank": {"rank": 1},
}

RANK_FAULTS = ("slow_rank", "hang_rank")
"""Kinds that act in one trainer rank's process (its ``rank`` key)."""

STAGES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "publish", "testing")
"""The stages of a training step (``Controller.stage`` in reasonrl/controller.py), in order: where
a crash, sigkill or hang fault with a ``stage`` fires, at the stage's start."""

_FORMAT = "expected kind@step[:key=value...]"


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``kind`` at training step ``step`` with its resolved ``params``."""

    kind: str
    step: int
    params: tuple[tuple[str, Any], ...]

    @property
    def spec(self) -> str:
        """Canonical spec string (defaults filled in); the fault's identity in the fired file."""
        return f"{self.kind}@{self.step}" + "".join(f":{k}={v}" for k, v in self.params if v is not None)

    def get(self, key: str) -> Any:
        return dict(self.params)[key]


def _spec_error(spec: str, problem: str) -> InputError:
    return InputError(f"faults: fault spec {spec!r}: {problem}")


def _parse_one(spec: str) -> Fault:
    head, *options = spec.strip().split(":")
    kind, at, step_text = head.partition("@")
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _spec_error(spec, f"unknown kind {kind!r}; {hint}allowed kinds: {', '.join(KINDS)}; {_FORMAT}")
    if not at:
        raise _spec_error(spec, f"missing '@step' after {kind!r}; {_FORMAT}")
    if not (step_text.isdigit() and int(step_text) >= 1):
        raise _spec_error(spec, f"step {step_text!r} is not an integer >= 1")
    step = int(step_text)
    allowed = KINDS[kind]
    params = dict(allowed)
    for option in options:
        key, eq, text = option.partition("=")
        if key not in allowed:
            keys = ", ".join(allowed) if allowed else "none"
            raise _spec_error(spec, f"unknown key {key!r} for kind {kind!r}; allowed keys: {keys}")
        if not eq:
            raise _spec_error(spec, f"{option!r} is not key=value; {_FORMAT}")
        try:
            params[key] = _read(key, text)
        except ValueError:
            raise _spec_error(spec, f"bad value {text!r} for key {key!r}: expected {_KEYS[key][2]}") from None
    return Fault(kind, step, tuple(params.items()))


def parse_specs(specs: list[str]) -> list[Fault]:
    """The faults of spec strings; InputError names the spec, the bad part and what is allowed.

    Two specs describing the same fault (same canonical spec) are an error.
    """
    faults = [_parse_one(spec) for spec in specs]
    seen: dict[str, str] = {}
    for spec, fault in zip(specs, faults):
        if fault.spec in seen:
            raise _spec_error(spec, f"the same fault as {seen[fault.spec]!r}")
        seen[fault.spec] = spec
    return faults
