"""The embedded task: two-digit arithmetic with a short worked solution.

Every problem splits its first operand into tens and units, works the two parts and
combines them, ending in the line ``Answer: N`` that the DAPO reward grades::

    47*7=?              (prompt)
    40*7=280            (response)
    7*7=49
    280+49=329
    Answer: 329

Problems are generated from a seed. Train and test splits are disjoint: a problem
belongs to the test split when a stable hash of its question falls in the test bucket,
so the same question never lands in both, whatever the seeds and sizes.

Each family has a difficulty level (``data.difficulty``): ``full``, the whole range of its
problems, or the ``easy`` or ``hard`` part of that range (:data:`LEVELS` says where each
family cuts it). A level draws from the full range and keeps the problems on its side of the
cut, so ``full`` draws exactly as a family without levels would.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from reasonrl.config.schema import DIFFICULTY_LEVELS
from reasonrl.errors import InputError
from reasonrl.types import Prompt

TEST_BUCKETS = 5
"""One question in TEST_BUCKETS (by hash) belongs to the test split."""


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str
    answer: int
    family: str
    tests: tuple[str, ...] = ()
    """The ``code`` family's assert statements (its ground truth); empty for the arithmetic ones."""


def _add(rng: random.Random, level: str = "full") -> Problem:
    """Column addition: units (with carry out), then tens plus the carry. Hard: the units
    carry (their sum is 10 or more)."""
    while True:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if _on_side(level, a % 10 + b % 10 >= 10):
            break
    units = a % 10 + b % 10
    carry = units // 10
    lines = [f"{a % 10}+{b % 10}={units}", f"{a // 10}+{b // 10}+{carry}={a // 10 + b // 10 + carry}"]
    return _problem(f"{a}+{b}", lines, a + b, "add")


def _mul(rng: random.Random, level: str = "full") -> Problem:
    """Long multiplication by one digit: units product, then tens product plus the carry.
    Hard: a multiplier of 6 to 9 (easy: 2 to 5)."""
    while True:
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        if _on_side(level, b >= 6):
            break
    units = a % 10 * b
    tens = a // 10 * b
    lines = [f"{a % 10}*{b}={units}", f"{a // 10}*{b}={tens}", f"{tens}+{units // 10}={tens + units // 10}"]
    return _problem(f"{a}*{b}", lines, a * b, "mul")


def _sum(rng: random.Random, level: str = "full") -> Problem:
    """Running sum of three digits. Hard: a total of 10 or more (two digits; easy: one)."""
    while True:
        a, b, c = (rng.randint(1, 9) for _ in range(3))
        if _on_side(level, a + b + c >= 10):
            break
    lines = [f"{a}+{b}={a + b}", f"{a + b}+{c}={a + b + c}"]
    return _problem(f"{a}+{b}+{c}", lines, a + b + c, "sum")


CHAIN_TERMS = (2, 12)
"""Fewest and most terms of a ``chain`` problem."""


def _chain(rng: random.Random, level: str = "full") -> Problem:
    """Running sum of a chain of digits whose length is long-tailed: 2 terms plus a geometric
    number more (p = 1/2, capped at 12 terms), one worked line per addition. Half the chains
    have 2 or 3 terms, one in 128 the full 12, so the longest solutions are several times the
    median, as reasoning RL's responses are. Hard: 4 terms or more (easy: 2 or 3)."""
    while True:
        k = CHAIN_TERMS[0]
        while k < CHAIN_TERMS[1] and rng.random() < 0.5:
            k += 1
        terms = [rng.randint(1, 9) for _ in range(k)]
        if _on_side(level, k >= 4):
            break
    lines, total = [], terms[0]
    for t in terms[1:]:
        lines.append(f"{total}+{t}={total + t}")
        total += t
    return _problem("+".join(map(str, terms)), lines, total, "chain")


def _code(rng: random.Random, level: str = "full") -> Problem:
    """A linear function to write in Python, graded by running it (``reward.fn=code``): the
    prompt ``f(x)=3*x+2`` asks for a fenced block defining it, checked by three asserts. The
    worked solution is at most 44 characters (tokens of the embedded tokenizer): give the family
    ``rollout.max_new_tokens`` of 48 or more. Its ``answer`` is f(1). Hard: a two-digit
    constant (easy: one digit)."""
    while True:
        a, b = rng.randint(2, 9), rng.randint(1, 99)
        if _on_side(level, b >= 10):
            break
    solution = f"```python\ndef f(x):\n    return {a}*x+{b}\n```"
    tests = tuple(f"assert f({x})=={a * x + b}" for x in (0, 1, rng.randint(2, 99)))
    return Problem(f"f(x)={a}*x+{b}\n", solution, a + b, "code", tests)


FAMILIES = {"add": _add, "mul": _mul, "sum": _sum, "chain": _chain, "code": _code}
"""Task family name -> problem maker ``maker(rng, level)``."""

LEVELS = DIFFICULTY_LEVELS
"""Difficulty levels of every family (``data.difficulty``): ``full`` is the whole range, ``easy``
and ``hard`` the two sides of the family's cut (its maker's docstring): add, a carry in the
units; mul, a multiplier of 6 or more; sum, a total of 10 or more; chain, 4 terms or more;
code, a two-digit constant."""


def _on_side(level: str, hard: bool) -> bool:
    """Whether a problem whose hardness is ``hard`` belongs to ``level``."""
    return level == "full" or hard == (level == "hard")


def _problem(expr: str, lines: list[str], answer: int, family: str) -> Problem:
    return Problem(f"{expr}=?\n", "\n".join(lines + [f"Answer: {answer}"]), answer, family)


def in_test_split(question: str) -> bool:
    digest = hashlib.sha256(question.encode()).digest()
    return digest[0] % TEST_BUCKETS == 0


def generate(families: tuple[str, ...] | list[str], size: int, seed: int, split: str,
             difficulty: dict[str, str] | None = None) -> list[Problem]:
    """``size`` problems of the given split ("train" or "test"), drawn round-robin over families,
    each family at its level in ``difficulty`` (family -> one of :data:`LEVELS`; ``full`` when
    not named).

    Test problems are distinct from each other; training problems may repeat.
    """
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise InputError(f"data.families: unknown task families {unknown or list(families)}; allowed: {sorted(FAMILIES)}")
    levels = check_difficulty(difficulty or {}, families)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{seed}-{split}")
    want_test = split == "test"
    out: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < size:
        attempts += 1
        if attempts > 200 * size + 1000:
            raise InputError(f"cannot draw {size} distinct {split} problems from families {list(families)}")
        family = families[len(out) % len(families)]
        p = FAMILIES[family](rng, levels.get(family, "full"))
        if in_test_split(p.question) != want_test or (want_test and p.question in seen):
            continue
        seen.add(p.question)
        out.append(p)
    return out


def check_difficulty(difficulty: dict, families: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``data.difficulty`` as {family: level}; InputError naming the key for a family not in
    ``families`` or a level not in :data:`LEVELS`."""
    for family, level in difficulty.items():
        if family not in families:
            raise InputError(f"data.difficulty.{family}: {family!r} is not one of data.families {list(families)}")
        if level not in LEVELS:
            raise InputError(f"data.difficulty.{family} = {level!r}: expected one of {', '.join(LEVELS)}")
    return dict(difficulty)


def to_prompts(problems: list[Problem], split: str) -> list[Prompt]:
    return [
        Prompt(
            id=f"{split}-{i}",
            text=p.question,
            ground_truth=json.dumps(list(p.tests)) if p.tests else str(p.answer),
            data_source=f"embedded/{p.family}",
        )
        for i, p in enumerate(problems)
    ]
