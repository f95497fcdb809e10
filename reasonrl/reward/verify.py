"""``reward.fn=math_verify``: the final answer compared with the ground truth by mathematical
equivalence, with the optional math-verify package (``pip install 'reasonrl[math]'``).

The prediction is what math-verify extracts from the end of the response (the last
``\\boxed{}`` first, else a LaTeX or plain expression, such as an ``Answer:`` line or GSM8K's
``#### 12``); the ground truth is read as LaTeX. Both become SymPy objects compared
symbolically: ``\\dfrac{1}{2}``, ``0.5`` and ``1/2`` are one answer, ``\\left(3,
\\frac{\\pi}{2}\\right)`` is ``(3,\\frac{\\pi}{2})`` and ``\\text{(C)}`` is ``C``, which the
string rules of ``dapo`` and ``boxed`` (reasonrl/reward/math.py) miss.

math-verify's own time limits are SIGALRM alarms, which work only on the main thread of a
process and end a comparison at whatever point a whole second falls: the same answer would
score right or wrong by the load of the machine. They are off. A call is bounded instead by
the worker process it runs in, killed at ``runtime.roles.reward.timeout_s`` in any thread and
runtime (a process or a Ray actor; ``runtime.roles.reward.count=0`` still gives this function
one worker per pool, see :func:`reasonrl.config.rules.reward_workers`): a sample past it is a
failure (``FAILURE_SCORE``), counted in ``reward/timeouts``. Called in a process of its own
without a pool, nothing bounds it.

Returns ``{"score": +1.0 or -1.0, "acc": bool, "pred": str}`` like the string rules.
"""

from __future__ import annotations

import logging

from reasonrl.errors import InputError
from reasonrl.reward.math import INVALID, MAX_ANSWER_CHARS, as_text


def _not_our_warning(record: logging.LogRecord) -> bool:
    """False for math-verify's warning that its alarms are off (the worker's deadline bounds the call)."""
    return not record.getMessage().startswith("Timeout is disabled")


def load_math_verify():
    """The ``math_verify_score`` reward; InputError naming reward.fn when math-verify is missing."""
    try:
        import math_verify  # noqa: F401 - imported here so a missing package fails at load time
    except ImportError as err:
        raise InputError(f"reward.fn = 'math_verify' needs the math-verify package, which cannot be imported ({err}); "
                         "install it with pip install 'reasonrl[math]'") from None
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if _not_our_warning not in logger.filters:
            logger.addFilter(_not_our_warning)
    return math_verify_score


def math_verify_score(response: str, ground_truth: str) -> dict:
    """+1 when the response's final answer equals ``ground_truth`` mathematically, else -1 (see
    the module); ``pred`` is the extracted answer as written."""
    from math_verify import parse, verify

    truth = as_text(ground_truth).strip()
    if "$" not in truth and "\\boxed" not in truth:
        truth = f"${truth}$"
    gold = parse(truth[:MAX_ANSWER_CHARS], parsing_timeout=None)
    pred = parse(as_text(response)[-MAX_ANSWER_CHARS:], parsing_timeout=None)
    correct = bool(gold and pred) and verify(gold, pred, timeout_seconds=None)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": str(pred[-1]) if pred else INVALID}
