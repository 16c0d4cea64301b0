"""Tool calls in the model's own text: Hermes / Qwen `<tool_call>{json}</tool_call>` blocks.

A call that is there but cannot be used (its JSON does not parse, it has no name, its arguments are
not an object, the block never closes) is kept as a `ToolCall` with an `error`: it becomes a tool
error message the model reads on its next turn, and counts as a failure, never a crash.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


@dataclass
class ToolCall:
    """One call the model made; `error` says why it cannot run (then name may be empty)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def as_message_call(self) -> dict[str, Any]:
        """The call as a chat message's `tool_calls` entry (OpenAI / transformers form)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside tool-call blocks, the calls in order) of one assistant turn."""
    calls = [_parse_block(match.group(1), closed=match.group(0).endswith(TOOL_CALL_CLOSE))
             for match in _BLOCK.finditer(text)]
    content = _BLOCK.sub("", text).strip()
    return content, calls


def _parse_block(body: str, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall("", error=f"the tool call was not closed with {TOOL_CALL_CLOSE}")
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as error:
        return ToolCall("", error=f"the tool call is not valid JSON ({error.msg} at character {error.pos})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return ToolCall("", error='the tool call has no "name" (expected {"name": ..., "arguments": {...}})')
    arguments = payload.get("arguments", payload.get("parameters")) or {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(payload["name"], error='the tool call\'s "arguments" is not a JSON object')
    return ToolCall(payload["name"], arguments)
