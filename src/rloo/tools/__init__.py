"""Tools the policy calls during a rollout: their JSON schemas, parsing the calls a turn makes,
running them (timeout, errors as messages) and rendering their results as tokens.

`rollout.multi_turn` drives these; nothing here samples or trains.
"""

from rloo.tools.execution import ToolResult, run_tool_calls
from rloo.tools.formats import CallFormat, call_format
from rloo.tools.parsing import ToolCall, parse_tool_calls
from rloo.tools.rendering import check_tool_template, prepare_tool_calls, tool_suffix_ids
from rloo.tools.schema import environment_tools, tool_schemas

__all__ = ["CallFormat", "ToolCall", "ToolResult", "call_format", "check_tool_template", "environment_tools",
           "parse_tool_calls", "prepare_tool_calls", "run_tool_calls", "tool_schemas", "tool_suffix_ids"]
