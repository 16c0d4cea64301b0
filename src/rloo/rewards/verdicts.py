"""Judging tests outside the untrusted interpreter.

A test such as `assert add(2, 3) == 5` is split, in the trainer, into the parts only the
candidate's code can compute (`add(2, 3)`, sent to the child to evaluate) and the rest (the
literal `5`, the `==`, `and`/`or`/`not`, arithmetic and a few pure built-ins), which never leave
the trainer. The child sends back each value's `repr`; the trainer parses it with
`ast.literal_eval` (plain data only) and decides the assertion itself. The child never sees the
expected values, so whatever it prints, patches or forges is at best a guess at them, and an
object whose `==` is always true arrives as text that is not plain data, which fails.

Statements that are not `assert` (setup such as `x = f(2)`) run in the child in order. A test
with no `assert` at all passes if the child reports that it ran without an exception; that
report *can* be forged by the code, so such tests are weaker (documented in docs/rewards.md).
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field
from typing import Any

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_PURE_BUILTINS = {"abs": abs, "len": len, "sorted": sorted, "set": set, "frozenset": frozenset, "list": list,
                  "tuple": tuple, "round": round, "min": min, "max": max, "sum": sum, "bool": bool, "str": str,
                  "int": int, "float": float, "all": all, "any": any, "isclose": math.isclose}
_NUMBERS = (bool, int, float, complex)


class Missing(Exception):
    """A value the child did not deliver (it raised, timed out, or sent something that is not plain data)."""


@dataclass
class TestPlan:
    steps: list[tuple[str, int, str]] = field(default_factory=list)  # ("exec" | "eval", step id, source)
    checks: list[Any] = field(default_factory=list)  # one check tree per assert
    valid: bool = True  # False when the snippet does not parse: it fails


def plan_test(snippet: str) -> TestPlan:
    """Split a test snippet into child steps and trainer-side checks."""
    plan = TestPlan()
    try:
        module = ast.parse(snippet)
    except SyntaxError:
        plan.valid = False
        return plan
    for statement in module.body:
        if isinstance(statement, ast.Assert):
            plan.checks.append(_tree(statement.test, plan))
        else:
            plan.steps.append(("exec", len(plan.steps), ast.unparse(statement)))
    return plan


def _tree(node: ast.expr, plan: TestPlan) -> Any:
    """A check tree: ("lit", value) | ("child", id) | (kind, ...) for the parts the trainer evaluates."""
    try:
        return ("lit", ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        return ("cmp", [_tree(node.left, plan)] + [_tree(c, plan) for c in node.comparators],
                [_COMPARE[type(op)] for op in node.ops])
    if isinstance(node, ast.BoolOp):
        return ("and" if isinstance(node.op, ast.And) else "or", [_tree(v, plan) for v in node.values])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ("Not", _tree(node.operand, plan))
    # Arithmetic and pure built-ins stay here only when a literal is involved (`f(x) - 4`,
    # `round(f(x), 2)`), so the child never sees it; without one (`len(f(x))`) the whole
    # expression goes to the child, which then sends back a small value instead of a big one.
    if not _has_literal(node):
        return _child(node, plan)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return (type(node.op).__name__, _tree(node.operand, plan))
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return ("bin", _ARITHMETIC[type(node.op)], _tree(node.left, plan), _tree(node.right, plan))
    name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
    name = node.func.attr if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                              and ast.unparse(node.func) == "math.isclose") else name
    if name in _PURE_BUILTINS and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args):
        return ("call", _PURE_BUILTINS[name], [_tree(a, plan) for a in node.args])
    return _child(node, plan)


def _has_literal(node: ast.expr) -> bool:
    """Whether an arithmetic or pure-built-in expression has a literal operand (at any depth of such operands)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operands = [node.operand]
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        operands = [node.left, node.right]
    elif isinstance(node, ast.Call) and ast.unparse(node.func) in (*_PURE_BUILTINS, "math.isclose"):
        operands = list(node.args)
    else:
        return False
    return any(_is_literal(operand) or _has_literal(operand) for operand in operands)


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _child(node: ast.expr, plan: TestPlan) -> Any:
    step = len(plan.steps)
    plan.steps.append(("eval", step, ast.unparse(node)))
    return ("child", step)


def _value(tree: Any, values: dict[int, Any]) -> Any:
    kind = tree[0]
    if kind == "lit":
        return tree[1]
    if kind == "child":
        if tree[1] not in values:
            raise Missing(tree[1])
        return values[tree[1]]
    if kind in ("cmp", "and", "or", "Not"):
        return _holds(tree, values)
    if kind in ("USub", "UAdd"):
        operand = _value(tree[1], values)
        if not isinstance(operand, _NUMBERS):
            raise Missing("unary minus on a non-number")
        return -operand if kind == "USub" else +operand
    if kind == "bin":
        left, right = _value(tree[2], values), _value(tree[3], values)
        numeric = isinstance(left, _NUMBERS) and isinstance(right, _NUMBERS)
        if not numeric and not (tree[1] is operator.add and type(left) is type(right)):
            raise Missing("arithmetic on non-numbers")  # keeps `[0] * huge` out of the trainer
        return tree[1](left, right)
    return tree[1](*[_value(arg, values) for arg in tree[2]])  # "call"


def _holds(tree: Any, values: dict[int, Any]) -> bool:
    kind = tree[0]
    if kind == "and":
        return all(_holds(part, values) for part in tree[1])
    if kind == "or":
        return any(_holds(part, values) for part in tree[1])
    if kind == "Not":
        return not _holds(tree[1], values)
    if kind == "cmp":
        operands = [_value(part, values) for part in tree[1]]
        return all(bool(op(a, b)) for op, a, b in zip(tree[2], operands, operands[1:]))
    return bool(_value(tree, values))


def judge(plan: TestPlan, values: dict[int, Any], completed: set[int]) -> bool:
    """Whether a test passed: every exec step completed and every assertion holds on plain data."""
    if not plan.valid:
        return False
    if any(kind == "exec" and step not in completed for kind, step, _ in plan.steps):
        return False
    try:
        return all(_holds(check, values) for check in plan.checks)
    except Exception:  # a missing value, or plain data an operator does not accept
        return False
