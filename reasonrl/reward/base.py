"""The reward-function protocol, loading a function by name or import path, batch scoring."""

from __future__ import annotations

import importlib
import math
from typing import Callable, Protocol

import torch

from reasonrl.errors import InputError
from reasonrl.reward.math import boxed_score, dapo_score

FAILURE_SCORE = -1.0
"""The score given to a sample whose reward function raised or returned something malformed."""

BUILTIN: dict[str, Callable[[str, str], dict]] = {"dapo": dapo_score, "boxed": boxed_score}

_ALLOWED = "'dapo', 'boxed', 'math_verify' or an import path 'package.module:function'"
_MAX_ERROR_CHARS = 300


class RewardFn(Protocol):
    """Scores one response against its ground truth.

    Returns a dict with ``score`` (a finite float), ``acc`` (bool: the answer is correct)
    and ``pred`` (str: the answer that was extracted).
    """

    def __call__(self, response: str, ground_truth: str) -> dict: ...


def load_reward_fn(spec: str) -> RewardFn:
    """The reward function named by ``spec``: ``"dapo"``, ``"boxed"``, ``"math_verify"``
    (reasonrl/reward/verify.py, the optional math-verify package) or ``"package.module:function"``.

    Raises InputError naming the spec when the module cannot be imported, has no such
    attribute, or the attribute is not callable.
    """
    if spec in BUILTIN:
        return BUILTIN[spec]
    if spec == "math_verify":
        from reasonrl.reward.verify import load_math_verify

        return load_math_verify()
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"reward function {spec!r}: unknown name; expected {_ALLOWED}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(
            f"reward function {spec!r}: cannot import module {module_name!r} ({e}); expected {_ALLOWED}"
        ) from e
    try:
        fn = getattr(module, attr)
    except AttributeError:
        raise InputError(f"reward function {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise InputError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not a callable")
    return fn


def score_batch(
    fn: RewardFn, texts: list[str], ground_truths: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Call ``fn`` on each (text, ground truth) pair.

    Returns ``scores [B] float32``, ``acc [B] bool``, ``failed [B] bool`` and one error line
    per failed sample (``"sample i: ..."``). A sample fails when ``fn`` raises or returns
    something other than a dict with a finite numeric ``score``; it then gets
    ``FAILURE_SCORE`` and ``acc = False``. A missing ``acc`` key means ``score > 0``.
    Never raises for anything ``fn`` does; different list lengths are a ValueError.
    """
    if len(texts) != len(ground_truths):
        raise ValueError(f"score_batch: {len(texts)} texts but {len(ground_truths)} ground truths")
    scores, accs, failed, errors = [], [], [], []
    for i, (text, truth) in enumerate(zip(texts, ground_truths)):
        try:
            score, acc = _check_result(fn(text, truth))
            scores.append(score)
            accs.append(acc)
            failed.append(False)
        except Exception as e:
            scores.append(FAILURE_SCORE)
            accs.append(False)
            failed.append(True)
            errors.append(_one_line(f"sample {i}: {type(e).__name__}: {e}"))
    return (
        torch.tensor(scores, dtype=torch.float32),
        torch.tensor(accs, dtype=torch.bool),
        torch.tensor(failed, dtype=torch.bool),
        errors,
    )


def _check_result(result: object) -> tuple[float, bool]:
    """``(score, acc)`` from a reward function's result; ValueError when it is malformed."""
    if not isinstance(result, dict):
        raise ValueError(f"reward function returned a {type(result).__name__}, expected a dict with 'score'")
    if "score" not in result:
        raise ValueError(f"reward function result has no 'score' (keys: {sorted(map(str, result))})")
    raw = result["score"]
    if isinstance(raw, (str, bytes)):
        raise ValueError(f"reward function score {raw!r} is not a number")
    score = float(raw)
    if not math.isfinite(score):
        raise ValueError(f"reward function score {score} is not finite")
    return score, bool(result.get("acc", score > 0))


def _one_line(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _MAX_ERROR_CHARS else message[: _MAX_ERROR_CHARS - 3] + "..."
