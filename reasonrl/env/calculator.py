"""Safe arithmetic for the ``calculator`` tool: an expression's syntax tree is walked, never run.

    calculate("347*29")      # '10063'
    calculate("7/2")         # '3.5'
    calculate("2**10 - 1")   # '1023'

Allowed: integer and decimal literals, ``+ - * / // % **``, unary ``-`` and ``+``, parentheses.
Anything else (names, calls, attributes, strings, comparisons, ``^``) is a
:class:`CalculatorError`, as are a division by zero and an expression or value past the bounds:
at most :data:`MAX_EXPRESSION_CHARS` characters, exponents of at most :data:`MAX_EXPONENT` in
absolute value, and every intermediate value of at most :data:`MAX_MAGNITUDE` in absolute value
(so no input can make it compute for long or use much memory).
"""

from __future__ import annotations

import ast
import math
import operator

MAX_EXPRESSION_CHARS = 200
"""Longer expressions are refused before parsing."""
MAX_EXPONENT = 100
"""The largest ``|b|`` of ``a ** b``."""
MAX_MAGNITUDE = 10**100
"""The largest absolute value any intermediate result may have."""

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = "numbers and + - * / // % ** ( )"


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value cannot be computed within bounds."""


def calculate(expression: str) -> str:
    """The value of ``expression`` as text: integers (also integral quotients such as ``6/3``)
    without a decimal point, other numbers with up to 12 significant digits."""
    return format_number(evaluate(expression))


def evaluate(expression: str) -> int | float:
    """The value of the arithmetic ``expression`` (see the module for what is allowed)."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expected an expression as text, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression of {len(expression)} characters, at most {MAX_EXPRESSION_CHARS} allowed")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression.strip()!r}: only {_ALLOWED} are allowed") from None
    try:
        return _value(tree.body)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(value: int | float) -> str:
    """``value`` as the calculator prints it: ``2.0`` -> ``'2'``, ``1/3`` -> ``'0.333333333333'``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def _value(node: ast.AST) -> int | float:
    """The value of one node of the tree, every intermediate value checked against the bounds."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError(f"result too large (more than {MAX_MAGNITUDE:.0e})") from None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalculatorError("'^' is not a power here: use ** (2**8)")
    raise CalculatorError(f"only {_ALLOWED} are allowed, got {_describe(node)}")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse ``base ** exponent`` when the exponent or the result would be out of bounds
    (``|exponent| * log10 |base| > 100``), before computing it."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {format_number(exponent)} out of range (at most {MAX_EXPONENT})")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise CalculatorError(f"result too large (more than {MAX_MAGNITUDE:.0e})")
    if base < 0 and not float(exponent).is_integer():
        raise CalculatorError("a negative number to a fractional power is not a real number")


def _bounded(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result too large (more than {MAX_MAGNITUDE:.0e})")
    return value


def _describe(node: ast.AST) -> str:
    """What a refused node is, in words: ``a function call``, ``the name 'x'``, ``a str``."""
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Attribute):
        return "an attribute"
    if isinstance(node, ast.Constant):
        return f"a {type(node.value).__name__} literal"
    return f"a {type(node).__name__} expression"
