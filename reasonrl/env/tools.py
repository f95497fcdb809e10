"""Tools the policy calls by writing JSON in its turn, and :class:`ToolEnv`, which answers them.

    calls = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
                             TOOL_CALL_PATTERN)
    calls[0]                       # ToolCall(name='calculator', arguments={'expression': '2+3'})
    TOOLS["calculator"].run(calls[0].arguments)   # '5'

A call is the first group of ``pattern`` (``env.tool_call_pattern``, matched with ``re.DOTALL``)
holding ``{"name": NAME, "arguments": {...}}``; ``arguments`` may also be a JSON string of that
object, as OpenAI's API sends it. Whatever is wrong with a call (malformed JSON, an unknown tool,
a missing, unexpected or mistyped argument) is a :class:`ToolCallError` whose message is shown
to the policy in place of the output; parsing never raises. Each tool is described to a model by
:meth:`Tool.schema`, the OpenAI function schema.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reasonrl.config import EnvConfig
from reasonrl.env.calculator import CalculatorError, calculate
from reasonrl.errors import InputError, error_line

if TYPE_CHECKING:
    from reasonrl.env.base import Env

TOOL_CALL_PATTERN = EnvConfig().tool_call_pattern
"""``env.tool_call_pattern``'s default: ``<tool_call>(.*?)</tool_call>``."""
TOOL_RESPONSE_FORMAT = EnvConfig().tool_response_format
"""``env.tool_response_format``'s default: ``<tool_response>{output}</tool_response>``."""
PYTHON_WALL_S = 5.0
"""Wall-clock seconds a ``python`` tool program may run."""
PYTHON_MEMORY_MB = 256
"""Address space of a ``python`` tool program."""
PYTHON_OUTPUT_CHARS = 1000
"""Characters of a ``python`` program's output (or error tail) given back."""
MAX_TOOL_TURNS = 8
"""Consecutive tool-calling turns :class:`ToolEnv` answers before it truncates the episode."""
MAX_OUTPUT_CHARS = 500
"""Characters of one call's output that :class:`ToolEnv` shows the policy."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


@dataclass(frozen=True)
class Tool:
    """A function the policy may call: ``fn(**arguments) -> str``, its arguments described by
    ``parameters``, a JSON-schema object (``{"type": "object", "properties": {...},
    "required": [...]}``)."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: ``{"type": "function", "function": {"name",
        "description", "parameters"}}`` (what chat templates take as ``tools=``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def signature(self) -> str:
        """The compact form shown to a small model: ``calculator(expression)``."""
        return f"{self.name}({', '.join(self.parameters.get('properties', {}))})"

    def run(self, arguments: dict[str, Any]) -> str:
        """The tool's output for ``arguments`` (already checked against ``parameters``), or
        ``"error: ..."`` when the tool raises."""
        try:
            return str(self.fn(**arguments))
        except Exception as e:  # noqa: BLE001 - a tool's failure is the policy's to read
            return f"error: {e}" if isinstance(e, (CalculatorError, InputError)) else f"error: {error_line(e)}"

    def argument_error(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit ``parameters`` (a missing, unexpected or mistyped
        argument), or None when they do."""
        properties = self.parameters.get("properties", {})
        for key in self.parameters.get("required", ()):
            if key not in arguments:
                return f"{self.name}: missing argument {key!r}"
        for key, value in arguments.items():
            if key not in properties:
                return f"{self.name}: unexpected argument {key!r} (takes {', '.join(properties) or 'none'})"
            expected = _JSON_TYPES.get(properties[key].get("type", ""))
            if expected and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
                return f"{self.name}: argument {key!r} must be {properties[key]['type']}, got {type(value).__name__}"
        return None


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a known tool with arguments that fit it."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    """A call that cannot be run: ``text`` is what the pattern matched, ``message`` why."""

    text: str
    message: str


def python(code: str) -> str:
    """Run ``code`` as a Python program in the reward sandbox (:mod:`reasonrl.reward.sandbox`,
    level ``auto``, :data:`PYTHON_WALL_S` seconds, :data:`PYTHON_MEMORY_MB` MB): its stdout, then
    the last line of its stderr when it failed, cut to :data:`PYTHON_OUTPUT_CHARS` characters."""
    from reasonrl.reward.sandbox import Limits, run_program

    result = run_program(code, limits=Limits(wall_s=PYTHON_WALL_S, memory_mb=PYTHON_MEMORY_MB))
    out = result.stdout
    if result.timed_out:
        out += f"error: timed out after {PYTHON_WALL_S:g}s"
    elif result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        out += f"error: {tail}"
    out = out or "(no output)"
    return out if len(out) <= PYTHON_OUTPUT_CHARS else out[: PYTHON_OUTPUT_CHARS - 3] + "..."


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
    parameters={"type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 347*29"}},
                "required": ["expression"]},
    fn=calculate,
)
PYTHON = Tool(
    name="python",
    description="Run a Python program in a sandbox (no network, no files kept) and return what it prints.",
    parameters={"type": "object",
                "properties": {"code": {"type": "string", "description": "the program's source"}},
                "required": ["code"]},
    fn=python,
)
TOOLS: dict[str, Tool] = {tool.name: tool for tool in (CALCULATOR, PYTHON)}
"""The tools ``env.tools`` may name."""


@functools.lru_cache(maxsize=32)
def tool_call_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled with ``re.DOTALL``; an InputError naming env.tool_call_pattern when it
    is not a regular expression with at least one group."""
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise InputError(f"env.tool_call_pattern = {pattern!r}: not a regular expression ({e})") from None
    if regex.groups < 1:
        raise InputError(f"env.tool_call_pattern = {pattern!r}: expected a group around the call's JSON, "
                         "e.g. <tool_call>(.*?)</tool_call>")
    return regex


def check_response_format(response_format: str) -> str:
    """``response_format`` when ``.format(output=...)`` works on it, else an InputError naming
    env.tool_response_format."""
    try:
        response_format.format(output="")
    except (KeyError, IndexError, ValueError) as e:
        raise InputError(f"env.tool_response_format = {response_format!r}: expected text with one {{output}} "
                         f"field and no other braces ({error_line(e)})") from None
    if "{output}" not in response_format:
        raise InputError(f"env.tool_response_format = {response_format!r}: expected an {{output}} field")
    return response_format


def parse_tool_calls(text: str, pattern: str = TOOL_CALL_PATTERN,
                     tools: Mapping[str, Tool] = TOOLS) -> list[ToolCall | ToolCallError]:
    """Every call in ``text`` (each match of ``pattern``'s first group), in order, checked
    against ``tools``: a :class:`ToolCall`, or a :class:`ToolCallError` saying what is wrong."""
    return [_parse_one(match.group(1), tools) for match in tool_call_regex(pattern).finditer(text)]


def _parse_one(raw: str, tools: Mapping[str, Tool]) -> ToolCall | ToolCallError:
    raw = raw.strip()
    try:
        call = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCallError(raw, f"malformed JSON ({e.msg} at character {e.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCallError(raw, 'expected {"name": TOOL, "arguments": {...}}')
    name, arguments = call["name"], call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCallError(raw, f"{name}: arguments are malformed JSON ({e.msg})")
    if not isinstance(arguments, dict):
        return ToolCallError(raw, f"{name}: arguments must be an object, got {type(arguments).__name__}")
    tool = tools.get(name)
    if tool is None:
        return ToolCallError(raw, f"unknown tool {name!r} (tools: {', '.join(tools) or 'none'})")
    problem = tool.argument_error(arguments)
    return ToolCallError(raw, problem) if problem else ToolCall(name, arguments)


def answer_tool_calls(text: str, tools: Mapping[str, Tool], pattern: str = TOOL_CALL_PATTERN,
                      max_chars: int = MAX_OUTPUT_CHARS) -> list[dict[str, Any]] | None:
    """Run every call in ``text``: one record per call, ``{"name", "arguments", "output"}`` or
    ``{"call", "error"}``, each output cut to ``max_chars``; None when ``text`` has no call."""
    calls = parse_tool_calls(text, pattern, tools)
    if not calls:
        return None
    records = []
    for call in calls:
        if isinstance(call, ToolCallError):
            records.append({"call": call.text, "error": shorten(call.message, max_chars)})
        else:
            records.append({"name": call.name, "arguments": call.arguments,
                            "output": shorten(tools[call.name].run(call.arguments), max_chars)})
    return records


def tool_output(records: Sequence[dict[str, Any]]) -> str:
    """The text the policy is shown for ``records``: each output, or ``error: MESSAGE``, one a line."""
    return "\n".join(r["output"] if "output" in r else f"error: {r['error']}" for r in records)


def describe_tools(tools: Sequence[Tool]) -> str:
    """The one line :class:`ToolEnv` puts before the first observation:
    ``tools: calculator(expression); python(code)``."""
    return "tools: " + "; ".join(tool.signature() for tool in tools)


def shorten(text: str, max_chars: int) -> str:
    """``text``, or its first ``max_chars - 3`` characters and ``...`` when it is longer."""
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The call of ``name`` with ``arguments`` as the default pattern reads it, in compact JSON:
    ``<tool_call>{"name":"calculator","arguments":{"expression":"2+3"}}</tool_call>``."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"<tool_call>{body}</tool_call>"


class ToolEnv:
    """``inner`` with tools: a turn holding tool calls is answered here, any other turn goes to
    ``inner``.

    ``reset`` returns ``describe_tools`` of the tools the inner env does not own itself and a
    newline before the inner first observation (nothing when it owns them all). A turn with
    calls (``pattern`` matches) gets ``response_format`` with the calls' outputs
    (:func:`tool_output`) as its observation, reward 0, not terminated, and ``info["tool"]``
    the call records (:func:`answer_tool_calls`); after ``max_tool_turns`` such turns in a row
    it is truncated (``info["success"]`` False). The calls answered are those of ``tools`` and
    of the inner env's own ``tools`` attribute, if it has one (such as
    :class:`~reasonrl.env.arith.ToolArithEnv`'s calculator): the inner env then never sees a
    tool turn, which therefore does not count toward its own turn limit.
    """

    def __init__(self, inner: Env, tools: Sequence[Tool], pattern: str = TOOL_CALL_PATTERN,
                 response_format: str = TOOL_RESPONSE_FORMAT, max_tool_turns: int = MAX_TOOL_TURNS,
                 max_output_chars: int = MAX_OUTPUT_CHARS):
        tool_call_regex(pattern)
        self.inner = inner
        self.pattern = pattern
        self.response_format = check_response_format(response_format)
        self.max_tool_turns = max_tool_turns
        self.max_output_chars = max_output_chars
        own = {tool.name: tool for tool in getattr(inner, "tools", ()) if isinstance(tool, Tool)}
        self.added = [tool for tool in tools if tool.name not in own]
        self.tools = [*own.values(), *self.added]
        self._by_name = {tool.name: tool for tool in self.tools}
        self._tool_turns = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """The inner env's first observation after the tools' one-line description."""
        observation, info = self.inner.reset(seed)
        self._tool_turns = 0
        prefix = describe_tools(self.added) + "\n" if self.added else ""
        return prefix + observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Answer the action's tool calls, or pass it to the inner env when it has none."""
        records = answer_tool_calls(action, self._by_name, self.pattern, self.max_output_chars)
        if records is None:
            self._tool_turns = 0
            return self.inner.step(action)
        self._tool_turns += 1
        truncated = self._tool_turns >= self.max_tool_turns
        info: dict[str, Any] = {"tool": records}
        if truncated:
            info["success"] = False
        return self.response_format.format(output=tool_output(records)), 0.0, False, truncated, info

    def close(self) -> None:
        """Close the inner env, if it can be closed."""
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()
