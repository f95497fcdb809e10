"""Format rules for ``reward.format``: does a response have the shape the prompt asked for?

    boxed         exactly one ``\\boxed{...}`` answer, in the last 300 characters
    answer_line   the last non-blank line is ``Answer: ...`` (the DAPO prompt's request)
    think         ``<think>...</think>`` first, then a non-empty answer after it
    re:REGEX      ``re.search(REGEX, response, re.DOTALL)`` matches

A rule only says yes or no; :class:`reasonrl.reward.base.Grader` adds ``reward.format_score``
for a yes to whatever the reward function gave, so it combines with any of them.
"""

from __future__ import annotations

import re
from typing import Callable

from reasonrl.errors import InputError
from reasonrl.reward.math import DAPO_TAIL_CHARS, as_text, last_boxed

_THINK_RE = re.compile(r"^\s*<think>.*?</think>\s*\S", re.DOTALL)
_ANSWER_LINE_RE = re.compile(r"(?i)^\s*Answer\s*:\s*\S")


def boxed_format(response: str) -> bool:
    """One ``\\boxed{}`` in the whole response, and it lies in the last DAPO_TAIL_CHARS characters."""
    text = as_text(response)
    return text.count("\\boxed") == 1 and last_boxed(text[-DAPO_TAIL_CHARS:]) is not None


def answer_line_format(response: str) -> bool:
    """The last non-blank line starts with ``Answer:`` and has something after it."""
    lines = [line for line in as_text(response).splitlines() if line.strip()]
    return bool(lines) and _ANSWER_LINE_RE.match(lines[-1]) is not None


def think_format(response: str) -> bool:
    """``<think>...</think>`` opens the response (one of each tag) and an answer follows."""
    text = as_text(response)
    return text.count("<think>") == 1 and text.count("</think>") == 1 and _THINK_RE.match(text) is not None


RULES: dict[str, Callable[[str], bool]] = {"boxed": boxed_format, "answer_line": answer_line_format, "think": think_format}


def format_rule(spec: str) -> Callable[[str], bool]:
    """The rule named by ``reward.format``; an unknown name or a bad regex is an InputError."""
    if spec in RULES:
        return RULES[spec]
    if spec.startswith("re:"):
        try:
            pattern = re.compile(spec[3:], re.DOTALL)
        except re.error as e:
            raise InputError(f"reward.format: {spec!r} is not a valid regular expression ({e})") from None
        return _RegexFormat(pattern)
    raise InputError(f"reward.format: unknown rule {spec!r}; expected one of {', '.join(RULES)} or 're:REGEX'")


class _RegexFormat:
    """``re:REGEX``: the pattern is found in the response (picklable, for reward workers)."""

    def __init__(self, pattern: re.Pattern) -> None:
        self.pattern = pattern

    def __call__(self, response: str) -> bool:
        return self.pattern.search(as_text(response)) is not None
