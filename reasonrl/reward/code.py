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

An assert run grades what the program's functions return, not what it prints or claims: a
grader process in the sandbox (the only writer of its stdout) reads the tests, makes itself
unreadable to the program (no ptrace, no /proc/PID/mem or fds), and starts the program in a fresh
interpreter that is sent, per test, only the expressions to evaluate (an ``assert A == 5`` sends
``A``; literal sides stay with the grader). The program answers with each value converted to
builtin types (exact ``int``, ``float``, ``str``, ``bool``, ``None``, ``bytes``, ``complex``,
``list``, ``tuple``, ``dict``, ``set``; anything else, such as an object whose ``__eq__`` is
always true, fails the test), and the grader compares them itself. A run that ends before it
answered every test (``sys.exit``, ``os._exit``, a crash) passes none. What it does not defend
against is in docs/sandbox.md.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from reasonrl.config import RewardConfig
from reasonrl.reward.math import INVALID, as_text
from reasonrl.reward.sandbox import MAX_OUTPUT, Limits, run_program

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The assert run's grader, the sandbox's first process (it reads its job from stdin, then makes
# itself unreadable to its own uid before the program exists). The program runs in a fresh
# interpreter (its child) that gets the setup, the program and, per test, the expressions to
# evaluate; it answers each with the value as tagged JSON on fd 3. Its stdout is /dev/null: only
# the grader writes the sandbox's stdout, so nothing the program prints or reaches counts.
_ASSERT_GRADER = r"""
import ast, ctypes, json, operator, os, subprocess, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/PID/mem, fd or ptrace for the program
job = json.loads(sys.stdin.read())
OPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
       ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
def plan(test):
    # (statements run first, [(literal value or None, expression sent to the program)], operator or None)
    try:
        body = ast.parse(test).body
    except SyntaxError:
        return test, [], None
    if not body or not isinstance(body[-1], ast.Assert):
        return test, [], None
    head = ast.unparse(ast.Module(body[:-1], [])) if body[:-1] else ""
    check = body[-1].test
    if isinstance(check, ast.Compare) and len(check.ops) == 1 and type(check.ops[0]) in OPS:
        sides = []
        for node in (check.left, check.comparators[0]):
            try:
                sides.append((("literal", ast.literal_eval(node)), None))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                sides.append((None, ast.unparse(node)))
        return head, sides, OPS[type(check.ops[0])]
    return head, [(None, ast.unparse(check))], None
def decode(x):
    if x is None or type(x) in (bool, int, float, str):
        return x
    tag, items = x
    if tag == "list": return [decode(i) for i in items]
    if tag == "tuple": return tuple(decode(i) for i in items)
    if tag == "set": return {decode(i) for i in items}
    if tag == "frozenset": return frozenset(decode(i) for i in items)
    if tag == "dict": return {decode(k): decode(v) for k, v in items}
    if tag == "bytes": return bytes.fromhex(items)
    if tag == "complex": return complex(*items)
    raise ValueError(tag)
plans = [plan(t) for t in job["tests"]]
request = {"setup": job["setup"], "program": job["program"],
           "tests": [[head, [expr for _, expr in sides if expr is not None]] for head, sides, _ in plans]}
read, write = os.pipe()
child = subprocess.Popen([sys.executable, "-I", "-S", "-c", job["runner"], str(write)], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, pass_fds=(write,), close_fds=True)
os.close(write)
try:
    child.stdin.write(json.dumps(request).encode()); child.stdin.close()
except OSError:
    pass
answers = os.fdopen(read, "rb").read(job["max_answer_bytes"]).decode(errors="replace").splitlines()
try:
    code = child.wait(timeout=job["exit_s"])
except subprocess.TimeoutExpired:
    child.kill(); code = child.wait()
passed = 0
if len(answers) == len(plans) and code == 0:
    for (head, sides, op), line in zip(plans, answers):
        try:
            got = json.loads(line)
            if got is None:
                continue
            values = iter(decode(v) for v in got)
            vals = [side[1] if side is not None else next(values) for side, _ in sides]
            if next(values, StopIteration) is not StopIteration:
                continue
            if op is None and not sides:
                ok = True
            elif op is None:
                ok = vals[0] is True or (type(vals[0]) in (int, float, str, list, tuple, dict, set) and bool(vals[0]))
            else:
                ok = op(vals[0], vals[1]) is True
            passed += ok
        except Exception:
            pass
sys.stdout.write("passed " + str(passed) + "\n")
"""

# The program's interpreter: setup and program first, then per test its statements and the
# expressions the grader asked for, each answered as one line on the fd the grader gave.
_ASSERT_RUNNER = r"""
import json, sys, os
out = os.fdopen(int(sys.argv[1]), "w")
job = json.loads(sys.stdin.read())
def encode(v, depth=0):
    if depth > 100: raise ValueError("too deep")
    t = type(v)
    if v is None or t in (bool, int, float, str): return v
    if t in (list, tuple, set, frozenset): return [t.__name__, [encode(i, depth + 1) for i in v]]
    if t is dict: return ["dict", [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]]
    if t is bytes: return ["bytes", v.hex()]
    if t is complex: return ["complex", [v.real, v.imag]]
    raise TypeError("not a builtin value: " + t.__name__)
namespace = {"__name__": "__main__"}
exec(compile(job["setup"], "setup", "exec"), namespace)
exec(compile(job["program"], "program", "exec"), namespace)
for head, exprs in job["tests"]:
    try:
        exec(compile(head, "test", "exec"), namespace)
        line = json.dumps([encode(eval(compile(e, "test", "eval"), namespace)) for e in exprs])
    except BaseException:
        line = "null"
    out.write(line + "\n"); out.flush()
out.close()
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
        job = {"setup": setup, "program": program, "tests": tests, "runner": _ASSERT_RUNNER,
               "max_answer_bytes": MAX_OUTPUT, "exit_s": 2.0}
        result = run_program(_ASSERT_GRADER, json.dumps(job), limits, self.level)
        last = result.stdout.rstrip("\n").rpartition("\n")[2].split()
        if result.timed_out or result.returncode != 0 or len(last) != 2 or last[0] != "passed" or not last[1].isdigit():
            return 0
        return min(int(last[1]), len(tests))

def make_code_reward(cfg: RewardConfig) -> CodeReward:
    """The ``reward.fn=code`` function for ``cfg``; the sandbox level is checked here (an
    InputError naming reward.sandbox when it does not work on this machine)."""
    from reasonrl.reward.sandbox import resolve_level

    resolve_level(cfg.sandbox)
    return CodeReward(cfg)
