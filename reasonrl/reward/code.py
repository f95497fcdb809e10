"""``reward.fn=code``: the response's last fenced Python block, run against the row's tests in
the sandbox (:mod:`reasonrl.reward.sandbox`).

Tests come from the row, in the layouts code-RL data uses:

- stdin/stdout pairs, ``{"inputs": [...], "outputs": [...]}`` (PRIME, DeepCoder, TACO) as the
  ground truth (a JSON string or object) or in an ``input_output`` column: the program reads
  each input on stdin, and passes when its stdout equals the output (trailing whitespace of
  each line and trailing blank lines ignored); each input is a run of its own;
- assert statements (MBPP's ``test_list`` column, or a JSON list of them as the ground truth),
  with MBPP's ``test_setup_code`` / ``test_imports`` run first: one run executes the program,
  then each assert, and counts those that hold.

Score (``reward.code_mode``): ``fraction`` gives ``2 * passed / total - 1`` (-1 when none pass,
+1 when all do), ``all`` gives +1 only when every test passes, else -1; ``acc`` is "every test
passed" in both. ``reward.code_timeout_s`` is the wall-clock budget of all of a row's runs
together, ``reward.code_memory_mb`` each run's address space. A response without a code block
scores -1; a row without tests is a failed sample (its error is logged), not a wrong answer.

An assert run reports its count after a nonce it reads from stdin before the program starts, so
a program that exits early or prints a count of its own does not pass; a program that goes
looking for the nonce in its own interpreter could still find it (the sandbox bounds what such
a program can do, not what it may claim).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from reasonrl.config import RewardConfig
from reasonrl.reward.math import INVALID, as_text
from reasonrl.reward.sandbox import Limits, run_program

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

_ASSERT_HARNESS = """\
def _reasonrl_main():
    import sys
    nonce = sys.stdin.readline().strip()
    namespace = {"__name__": "__main__"}
    exec(compile(%(setup)r, "setup", "exec"), namespace)
    exec(compile(%(program)r, "program", "exec"), namespace)
    passed = 0
    for test in %(tests)r:
        try:
            exec(compile(test, "test", "exec"), namespace)
            passed += 1
        except BaseException:
            pass
    sys.stdout.write("\\n" + nonce + " " + str(passed) + "\\n")
_reasonrl_main()
"""


def last_code_block(response: str) -> str | None:
    """The body of the last fenced block (```python, ```py or plain ```), or None."""
    blocks = _FENCE_RE.findall(as_text(response))
    return blocks[-1] if blocks else None


def row_tests(ground_truth: Any, row: dict[str, Any]) -> tuple[str, Any]:
    """``("io", (inputs, outputs))`` or ``("asserts", (setup, tests))`` from the row (see the
    module); ValueError naming what was found when there are no tests."""
    for value in (row.get("input_output"), ground_truth):
        parsed = _json(value)
        if isinstance(parsed, dict) and "inputs" in parsed and "outputs" in parsed:
            inputs, outputs = list(parsed["inputs"]), list(parsed["outputs"])
            if len(inputs) != len(outputs) or not inputs:
                raise ValueError(f"code tests: {len(inputs)} inputs but {len(outputs)} outputs")
            return "io", ([_text(x) for x in inputs], [_text(x) for x in outputs])
    tests = row.get("test_list")
    if tests is None:
        parsed = _json(ground_truth)
        tests = parsed if isinstance(parsed, list) else None
    if isinstance(tests, (list, tuple)) and tests and all(isinstance(t, str) for t in tests):
        setup = "\n".join([*map(str, row.get("test_imports") or []), str(row.get("test_setup_code") or "")])
        return "asserts", (setup, list(tests))
    raise ValueError("code tests: the row has no tests (expected {'inputs': [...], 'outputs': [...]} as the ground "
                     "truth or input_output, or a list of assert strings as the ground truth or test_list)")


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _text(value: Any) -> str:
    if isinstance(value, list):  # TACO: a list of lines
        return "\n".join(map(str, value))
    return str(value)


def same_output(got: str, want: str) -> bool:
    """Equal after dropping each line's trailing whitespace and trailing blank lines."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(got) == lines(want)


class CodeReward:
    """The ``reward.fn=code`` function, set up by ``reward.code_*`` and ``reward.sandbox``
    (picklable: reward worker processes rebuild nothing)."""

    def __init__(self, cfg: RewardConfig) -> None:
        self.mode, self.level = cfg.code_mode, cfg.sandbox
        self.timeout_s, self.memory_mb = cfg.code_timeout_s, cfg.code_memory_mb

    def __call__(self, response: str, ground_truth: str, **row: Any) -> dict:
        kind, tests = row_tests(ground_truth, row)
        program = last_code_block(response)
        total = len(tests[0]) if kind == "io" else len(tests[1])
        if program is None:
            return {"score": -1.0, "acc": False, "pred": INVALID, "tests_passed": 0, "tests_total": total}
        deadline = time.monotonic() + self.timeout_s
        passed = self._run_io(program, *tests, deadline) if kind == "io" else self._run_asserts(program, *tests, deadline)
        all_passed = passed == total
        score = (2.0 * passed / total - 1.0) if self.mode == "fraction" else (1.0 if all_passed else -1.0)
        return {"score": score, "acc": all_passed, "pred": f"{passed}/{total} tests",
                "tests_passed": passed, "tests_total": total}

    def _limits(self, deadline: float) -> Limits | None:
        left = deadline - time.monotonic()
        return Limits(wall_s=left, memory_mb=self.memory_mb) if left > 0.05 else None

    def _run_io(self, program: str, inputs: list[str], outputs: list[str], deadline: float) -> int:
        passed = 0
        for given, want in zip(inputs, outputs):
            limits = self._limits(deadline)
            if limits is None:
                break
            result = run_program(program, given, limits, self.level)
            passed += result.returncode == 0 and not result.timed_out and same_output(result.stdout, want)
        return passed

    def _run_asserts(self, program: str, setup: str, tests: list[str], deadline: float) -> int:
        limits = self._limits(deadline)
        if limits is None:
            return 0
        nonce = secrets.token_hex(16)
        harness = _ASSERT_HARNESS % {"setup": setup, "program": program, "tests": tests}
        result = run_program(harness, nonce + "\n", limits, self.level)
        last = result.stdout.rstrip("\n").rpartition("\n")[2].split()
        if result.timed_out or len(last) != 2 or last[0] != nonce or not last[1].isdigit():
            return 0
        return min(int(last[1]), len(tests))


def make_code_reward(cfg: RewardConfig) -> CodeReward:
    """The ``reward.fn=code`` function for ``cfg``; the sandbox level is checked here (an
    InputError naming reward.sandbox when it does not work on this machine)."""
    from reasonrl.reward.sandbox import resolve_level

    resolve_level(cfg.sandbox)
    return CodeReward(cfg)
