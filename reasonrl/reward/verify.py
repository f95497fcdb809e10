"""``reward.fn=math_verify``: the final answer compared with the ground truth by mathematical
equivalence, with the optional math-verify package (``pip install 'reasonrl[math]'``).

The prediction is what math-verify extracts from the end of the response (the last
``\\boxed{}`` first, else a LaTeX or plain expression, such as an ``Answer:`` line or GSM8K's
``#### 12``); the ground truth is read as LaTeX. Both become SymPy objects compared
symbolically: ``\\dfrac{1}{2}``, ``0.5`` and ``1/2`` are one answer, ``\\left(3,
\\frac{\\pi}{2}\\right)`` is ``(3,\\frac{\\pi}{2})`` and ``\\text{(C)}`` is ``C``, which the
string rules of ``dapo`` and ``boxed`` (reasonrl/reward/math.py) miss.

Every call is bounded: parsing and comparing each stop after :data:`TIMEOUT_S` seconds
(math-verify's own alarms) and the sample is then wrong. The alarms need the main thread of a
process, where the trainer and the reward worker processes (``runtime.roles.reward.count``)
score; called from another thread, the call is bounded only by the reward pool's
``runtime.roles.reward.timeout_s``.

Returns ``{"score": +1.0 or -1.0, "acc": bool, "pred": str}`` like the string rules.
"""

from __future__ import annotations

import threading

from reasonrl.errors import InputError
from reasonrl.reward.math import INVALID, MAX_ANSWER_CHARS, as_text

TIMEOUT_S = 3
"""Seconds math-verify may spend parsing one side, and comparing them (whole seconds: alarms)."""


def load_math_verify():
    """The ``math_verify_score`` reward; InputError naming reward.fn when math-verify is missing."""
    try:
        import math_verify  # noqa: F401 - imported here so a missing package fails at load time
    except ImportError as err:
        raise InputError(f"reward.fn = 'math_verify' needs the math-verify package, which cannot be imported ({err}); "
                         "install it with pip install 'reasonrl[math]'") from None
    return math_verify_score


def math_verify_score(response: str, ground_truth: str) -> dict:
    """+1 when the response's final answer equals ``ground_truth`` mathematically, else -1 (see
    the module); ``pred`` is the extracted answer as written."""
    from math_verify import parse, verify

    seconds = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    truth = as_text(ground_truth).strip()
    if "$" not in truth and "\\boxed" not in truth:
        truth = f"${truth}$"
    gold = parse(truth[:MAX_ANSWER_CHARS], parsing_timeout=seconds)
    pred = parse(as_text(response)[-MAX_ANSWER_CHARS:], parsing_timeout=seconds)
    correct = bool(gold and pred) and verify(gold, pred, timeout_seconds=seconds)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": str(pred[-1]) if pred else INVALID}
