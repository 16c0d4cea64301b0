"""A calculator tool for the GSM8K tool recipe (recipes/gsm8k_tools_cpu.yaml): arithmetic only.

The expression is parsed with `ast` and evaluated node by node over a whitelist (numbers, + - * / // %
**, unary signs, parentheses); nothing is ever passed to `eval`, so names, calls, attributes, strings and
comprehensions are refused. Big exponents and long inputs are refused too, so a call cannot hang the run.
A refused or failing expression raises ValueError; the rollout turns it into the tool error message the
model reads next (`{"error": "ValueError: ..."}`), counted in tools/failure_frequency.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_LENGTH = 200  # characters of one expression
MAX_EXPONENT = 100  # |b| in a ** b
MAX_MAGNITUDE = 1e30  # |result| of any step

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The arithmetic to compute, with numbers, + - * / // % ** and parentheses, e.g. "(48 / 2) + 48".
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string such as \"3 * (4 + 5)\", got {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"expression is {len(expression)} characters long; at most {MAX_LENGTH}")
    text = expression.replace(",", "").replace("$", "").replace("x", "*").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}; write arithmetic such as \"3 * (4 + 5)\"") from None
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 6) if isinstance(value, float) else value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, str, bytes, None
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large; at most {MAX_EXPONENT}")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _checked(value: int | float | complex) -> int | float:
    if isinstance(value, complex):  # a negative number to a fractional power
        raise ValueError("the result is not a real number")
    if math.isnan(value) or math.isinf(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError("the result is too large")
    return value
