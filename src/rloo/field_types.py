"""The type rule of rloo's dataclasses (RLOOConfig, the CLI's TrainInputs): every field holds a value of its
annotated type, and every float is finite.

A string such as "false" or "1e-5" is refused (Python treats "false" as true), from Python and from YAML alike
(`bf16: 'false'`); the CLI parses its flags' text into each field's type. `config_checks.check_field_types`
raises the problem as a ConfigError.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any


def matches(value: Any, hint: Any) -> bool:
    """Whether value has the field type `hint` (bool is not a number; an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, dict, tuple):  # containers have their own checks with their own messages in config_checks
        return True
    return isinstance(value, hint)


def field_type_problem(config: Any) -> str | None:
    """The first field of the dataclass instance `config` whose value breaks the rule, said with the fix; None if none."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, hint = getattr(config, f.name), hints[f.name]
        if not matches(value, hint):
            type_name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
            return (f"{f.name} must be of type {type_name}, got {value!r} ({type(value).__name__}); e.g. "
                    f"{f.name}={f.default!r}. (Pass the value itself, not text: in YAML write it unquoted, e.g. `bf16: false`.)")
        numbers = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(number, float) and not math.isfinite(number) for number in numbers):
            return f"{f.name} must be a finite number, got {value!r}."
    return None
