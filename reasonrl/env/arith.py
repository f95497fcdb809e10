"""``tool_arith``: an arithmetic question that the calculator answers exactly and a tiny model
cannot, generated from the reset seed.

Transcript (seed 0, the scripted policy of :meth:`ToolArithEnv.demonstration`)::

    obs    '964*59=? <tool_call> calculator(expression), or Answer: N'
    action '<tool_call>{"name":"calculator","arguments":{"expression":"964*59"}}</tool_call>'
    obs    '<tool_response>56876</tool_response>'                    reward 0
    action 'Answer: 56876'
    obs    'correct'                                                 reward 1, terminated, success

Every observation is under 80 characters (the tool response is cut to fit). The calls follow
the defaults of ``env.tool_call_pattern`` and ``env.tool_response_format``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from reasonrl.env.tools import (CALCULATOR, TOOL_CALL_PATTERN, TOOL_RESPONSE_FORMAT, answer_tool_calls,
                                format_tool_call, shorten, tool_output)
from reasonrl.errors import InputError

CUE = "<tool_call> calculator(expression), or Answer: N"
"""What follows the question in the first observation."""
FORMAT_HINT = 'expected <tool_call>{"name":...}</tool_call> or Answer: N'
"""The observation after a turn with neither a tool call nor an answer."""
MAX_OBSERVATION_CHARS = 79
MAX_DIGITS = 6
_ANSWER = re.compile(r"answer:\s*(\S*)", re.IGNORECASE)
_OPS = "+-*"


class ToolArithEnv:
    """``A op B = ?`` with ``A`` of ``digits`` digits, ``B`` of ``digits2`` digits and ``op``
    drawn from ``ops`` (any of ``+ - *``), all from ``random.Random(seed)``.

    A turn holding a calculator call (``<tool_call>{"name": "calculator", "arguments":
    {"expression": ...}}</tool_call>``; several calls are answered in order) gets the tool
    response as its observation, reward 0, the records in ``info["tool"]``. Otherwise a turn
    holding ``Answer: N`` (the last such, any case) ends the episode: reward 1.0 and
    ``success`` when N equals the exact result, else 0.0. A turn with neither gets
    :data:`FORMAT_HINT`, reward 0. The episode is truncated after ``max_turns`` turns without an
    answer. A turn with both a call and an answer is a tool turn (the answer is ignored).
    """

    tools = (CALCULATOR,)
    """The tool this env answers itself (a :class:`~reasonrl.env.tools.ToolEnv` around it
    answers it too)."""

    def __init__(self, digits: int = 3, digits2: int = 2, ops: str = "*", max_turns: int = 4):
        for key, value in (("digits", digits), ("digits2", digits2)):
            if type(value) is not int or not 1 <= value <= MAX_DIGITS:
                raise InputError(f"env.args.{key} = {value!r}: expected an integer from 1 to {MAX_DIGITS}")
        if not isinstance(ops, str) or not ops or set(ops) - set(_OPS):
            raise InputError(f"env.args.ops = {ops!r}: expected some of the operators {_OPS!r}, e.g. '*' or '+-*'")
        if type(max_turns) is not int or max_turns < 1:
            raise InputError(f"env.args.max_turns = {max_turns!r}: expected an integer >= 1")
        self.digits, self.digits2, self.ops, self.max_turns = digits, digits2, ops, max_turns
        self._answer: int | None = None
        self._turns = 0

    def problem(self, seed: int) -> tuple[str, int]:
        """The expression of ``seed`` and its exact value: ``("964*59", 56876)``."""
        rng = random.Random(seed)
        a = rng.randint(10 ** (self.digits - 1), 10**self.digits - 1)
        b = rng.randint(10 ** (self.digits2 - 1), 10**self.digits2 - 1)
        op = rng.choice(self.ops)
        expression = f"{a}{op}{b}"
        return expression, {"+": a + b, "-": a - b, "*": a * b}[op]

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """A new question: ``'964*59=? <tool_call> calculator(expression), or Answer: N'``."""
        expression, self._answer = self.problem(seed)
        self._turns = 0
        return f"{expression}=? {CUE}", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One policy turn (see the class)."""
        if self._answer is None:
            raise RuntimeError("ToolArithEnv.step: no episode in progress (call reset first)")
        self._turns += 1
        out_of_turns = self._turns >= self.max_turns
        records = answer_tool_calls(action, {CALCULATOR.name: CALCULATOR}, TOOL_CALL_PATTERN)
        if records is not None:
            room = MAX_OBSERVATION_CHARS - len(TOOL_RESPONSE_FORMAT.format(output=""))
            observation = TOOL_RESPONSE_FORMAT.format(output=shorten(tool_output(records), room))
            return self._continue(observation, out_of_turns, {"tool": records})
        answers = _ANSWER.findall(action)
        if not answers:
            return self._continue(FORMAT_HINT, out_of_turns, {})
        correct = _number(answers[-1]) == self._answer
        self._answer = None
        return ("correct" if correct else "wrong"), float(correct), True, False, {"success": correct}

    def demonstration(self, seed: int) -> list[str]:
        """A good policy's turns: call the calculator on the question, then answer its result."""
        expression, answer = self.problem(seed)
        return [format_tool_call(CALCULATOR.name, {"expression": expression}), f"Answer: {answer}"]

    def guess(self, seed: int) -> list[str]:
        """An overconfident policy's turn: an answer off by a digit or two, never right (for a
        warm start that should not be perfect)."""
        _, answer = self.problem(seed)
        offset = random.Random(seed).choice((-100, -10, -1, 1, 10, 100))
        return [f"Answer: {answer + offset}"]

    def sample_action(self, rng: random.Random) -> str:
        """A random turn for ``env_check``: a calculator call, an answer, a malformed or
        unknown call, or chatter."""
        kind = rng.randrange(5)
        if kind == 0:
            return format_tool_call(CALCULATOR.name, {"expression": f"{rng.randint(1, 999)}*{rng.randint(1, 99)}"})
        if kind == 1:
            return f"Answer: {rng.randint(0, 10 ** (self.digits + self.digits2))}"
        if kind == 2:
            return '<tool_call>{"name":"calculator","arguments":{"expression":</tool_call>'
        if kind == 3:
            return '<tool_call>{"name":"abacus","arguments":{}}</tool_call>'
        return "".join(rng.choice("0123456789 =?*") for _ in range(rng.randint(0, 8)))

    def _continue(self, observation: str, truncated: bool,
                  info: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """A step that does not answer: reward 0, truncated (``success`` False) when the turns
        are used up."""
        if truncated:
            self._answer = None
            info["success"] = False
        return observation, 0.0, False, truncated, info


def _number(text: str) -> float | None:
    """The number an answer states: ``'56,876.'`` -> 56876.0; None when it is not one."""
    try:
        return float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None
