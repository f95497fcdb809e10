"""Rule-based math rewards: the DAPO ``Answer:`` rule, the last ``\\boxed{}`` answer and
GSM8K's ``#### N``.

``dapo`` and ``boxed`` are string rules: they compare a normalised prediction with the
normalised ground truth as strings (``normalize_final_answer``, a port of the Minerva/lm-eval normaliser that verl's
``math_dapo.py`` uses). This is right for integer answers (AIME, DAPO-Math) and simple
LaTeX; equivalences that need a symbolic check (``\\frac{1}{2}`` vs ``0.5``, ``x=2`` vs
``2``, reordered tuples or intervals) are not recognised.

``gsm8k`` compares numbers: the one after the last ``####`` (verl's strict GSM8K rule), commas
and a leading ``$`` dropped.

All three return ``{"score": +1.0 or -1.0, "acc": bool, "pred": str}`` and never
raise: non-string inputs are coerced to text (``None`` becomes ``""``, bytes are decoded).
"""

from __future__ import annotations

import re
from typing import Any

INVALID = "[INVALID]"
"""The ``pred`` reported when no answer could be extracted."""

DAPO_TAIL_CHARS = 300
"""The DAPO rule only looks at the end of a response (the longest MATH-500 answer has 159 characters)."""

MAX_ANSWER_CHARS = 1000
"""An extracted answer or ground truth longer than this never matches (keeps scoring fast)."""

_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE_RE = re.compile(r"[{}]")

SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]

REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]


def normalize_final_answer(final_answer: str) -> str:
    """Normalise an answer for string comparison, as verl's ``math_dapo.normalize_final_answer``.

    Keeps what follows the last ``=``, applies ``SUBSTITUTIONS`` and drops
    ``REMOVED_EXPRESSIONS`` (units, spaces, ``\\text{}``...), keeps the first ``$...$``
    span of a line, unwraps ``\\text{}``, ``\\textbf{}``, ``\\overline{}`` and
    ``\\boxed{}``, expands ``\\frac12`` / ``\\sqrt2`` shorthands, strips ``$`` and turns
    ``1,000`` into ``1000``.
    """
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = "\n".join(_first_math_span(line) for line in final_answer.split("\n"))
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def _first_math_span(line: str) -> str:
    """``"a $x$ b $y$"`` -> ``"$x$"``; a line with fewer than two ``$`` is unchanged.

    Linear-time equivalent of verl's per-line ``re.sub(r"(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$")``.
    """
    parts = line.split("$", 2)
    return line if len(parts) < 3 else "$" + parts[1] + "$"


def last_boxed(text: str) -> str | None:
    """The argument of the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces) in ``text``.

    ``\\boxed 5`` (a space, no brace) gives the text up to the next ``$`` or line end.
    Returns ``None`` when there is no box, its braces are unbalanced or it is empty.
    """
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    arg_start = start + len(command)
    if text.startswith("{", arg_start):
        depth = 0
        for brace in _BRACE_RE.finditer(text, arg_start):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                return text[arg_start + 1 : brace.start()] or None
        return None
    if text.startswith(" ", arg_start):
        return re.split(r"[$\n]", text[arg_start:], maxsplit=1)[0].strip() or None
    return None


def dapo_score(response: str, ground_truth: str) -> dict:
    """The DAPO rule (verl ``math_dapo.compute_score``, non-strict mode).

    Takes the last ``DAPO_TAIL_CHARS`` characters of ``response``, the last match of
    ``Answer\\s*:\\s*(...)`` (case-insensitive, to the end of its line), and compares it
    with the ground truth after ``normalize_final_answer``. Unlike verl, a response
    without an ``Answer:`` line is never correct (verl compares ``"[INVALID]"`` itself).
    """
    matches = _ANSWER_RE.findall(as_text(response)[-DAPO_TAIL_CHARS:])
    return _compare(matches[-1] if matches else None, ground_truth)


def boxed_score(response: str, ground_truth: str) -> dict:
    """Exact match of the last ``\\boxed{}`` / ``\\fbox{}`` answer, both sides normalised: a
    string rule, not a mathematical check (``reward.fn=math_verify`` is that).

    Good for integers and simple LaTeX (``\\frac{1}{2}`` matches ``\\frac{1}{2}``, not
    ``0.5``). A boxed answer longer than ``MAX_ANSWER_CHARS`` counts as none (``"[INVALID]"``).
    """
    return _compare(last_boxed(as_text(response)), ground_truth)


_GSM8K_RE = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def gsm8k_answer(text: str) -> str | None:
    """The number after the last ``####`` in ``text`` (commas removed, ``12.0`` kept as
    written), or None."""
    matches = _GSM8K_RE.findall(as_text(text))
    return matches[-1].replace(",", "") if matches else None


def gsm8k_score(response: str, ground_truth: str) -> dict:
    """GSM8K's rule (verl ``gsm8k.compute_score``, strict): the number after the response's
    last ``####`` equals the ground truth's number, compared as numbers (``72`` = ``72.0``).
    The ground truth may be the bare number or GSM8K's whole solution ending in ``#### 72``.
    +1 when equal, -1 otherwise or when the response has no ``#### N``."""
    pred = gsm8k_answer(response)
    truth_text = as_text(ground_truth).strip()
    truth = gsm8k_answer(truth_text) or truth_text.replace(",", "").lstrip("$")
    if pred is None:
        return {"score": -1.0, "acc": False, "pred": INVALID}
    try:
        correct = float(pred) == float(truth)
    except ValueError:
        correct = False
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def _compare(answer: str | None, ground_truth: Any) -> dict:
    """The result dict for an extracted ``answer`` (``None``: nothing was extracted).

    An empty prediction is never correct, and neither side is normalised when it is
    longer than ``MAX_ANSWER_CHARS`` (the normaliser's regexes are quadratic on
    adversarial input).
    """
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return {"score": -1.0, "acc": False, "pred": INVALID}
    pred = normalize_final_answer(answer)
    truth = as_text(ground_truth)
    correct = bool(pred) and len(truth) <= MAX_ANSWER_CHARS and pred == normalize_final_answer(truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def as_text(value: Any) -> str:
    """``value`` as a string: ``None`` -> ``""``, bytes decoded as UTF-8 with replacement."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        return str(value)
    except Exception:
        return ""
