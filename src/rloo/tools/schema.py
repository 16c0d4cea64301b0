"""Tools as the chat template sees them: JSON schemas from type hints and docstrings, and an
environment's public methods as its tools."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from transformers.utils import get_json_schema

from rloo.config import ConfigError

# An environment's methods that are not tools: the rollout calls them itself.
ENVIRONMENT_HOOKS = ("reset", "get_reward")


def tool_schemas(tools: list[Callable]) -> list[dict[str, Any]]:
    """The JSON schema of each tool (`transformers.utils.get_json_schema`), for the chat template's `tools=`.

    A tool needs type hints on every argument and a Google-style docstring with an `Args:` section naming
    each one; a tool without them is refused here, before any model loads, rather than rendered half-described.
    """
    schemas, names = [], set()
    for tool in tools:
        if not callable(tool):
            raise ConfigError(f"tool {tool!r} is not callable; pass functions (plain or async).")
        name = getattr(tool, "__name__", repr(tool))
        if name in names:
            raise ConfigError(f"two tools are named {name!r}; the model calls tools by name, so each name must be unique.")
        names.add(name)
        try:
            schemas.append(get_json_schema(tool))
        except Exception as error:  # transformers raises DocstringParsingException / TypeHintParsingException
            raise ConfigError(f"tool {name!r} cannot be described to the model: {error}. Give every argument a type "
                              f"hint and a docstring with an 'Args:' section naming each argument "
                              f"(transformers' get_json_schema format).") from error
    return schemas


def environment_tools(environment: Any) -> list[Callable]:
    """An environment's tools: its public methods (defined on its class), other than reset and get_reward."""
    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ENVIRONMENT_HOOKS]
