"""A multi-turn trajectory as records, turn by turn: what the completions table, completions.jsonl,
eval_samples.jsonl and `rloo report` show of it.

The multi-turn stage (`multi_turn.MultiTurnRollout`) writes the records as it samples and runs tools, so
nothing shown is parsed back from text: turn k is one `TurnRecord` of role "assistant" (the model's text
outside its calls), then one of role "tool" per call it made, in order, holding the call and what the
tool returned (`error` true when the call failed: unknown tool, malformed call, an exception, a timeout).
A call whose result is None has none in the trajectory: the trajectory ended with it (`max_tool_calling_iterations`
rounds had run, or the result would not fit the completion budget). On disk a record is `TurnRecord.as_json()`:
`{"turn": 1, "role": "tool", "text": "", "tool_call": {"name": "add", "arguments": {"a": 2, "b": 3}, "error": null},
"tool_result": {"content": "5", "error": false}}`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCallRecord:
    """One call the model wrote: the tool's name and arguments, or why it cannot run (`error`, a malformed call)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass
class ToolResultRecord:
    """What the tool message held, and whether the call failed (then `content` is `{"error": "..."}`)."""

    content: str
    error: bool = False


@dataclass
class TurnRecord:
    """One entry of a trajectory's turns: the model's text of turn `turn` (role "assistant"), or one of its calls
    with the tool's result (role "tool"; `tool_result` None: no result in the trajectory, which ended with the call)."""

    turn: int  # 1-based: the model's k-th turn; its calls and their results carry the same k
    role: str  # "assistant" or "tool"
    text: str = ""  # the assistant's text outside its tool calls ("" for a tool entry)
    tool_call: ToolCallRecord | None = None
    tool_result: ToolResultRecord | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def record_turn(records: list[TurnRecord], message: dict[str, Any], calls: list[Any]) -> dict[str, Any]:
    """Append the model's next turn to `records`: its text (the assistant `message`'s content, returned), then each
    call (`tools.ToolCall`) waiting for its result."""
    turn = sum(record.role == "assistant" for record in records) + 1
    records.append(TurnRecord(turn, "assistant", message["content"]))
    records += [TurnRecord(turn, "tool", tool_call=ToolCallRecord(call.name, dict(call.arguments), call.error))
                for call in calls]
    return message


def record_results(records: list[TurnRecord], results: list[Any]) -> None:
    """Give the last turn's calls their results (`tools.ToolResult`, one per call, in call order)."""
    last = records[-1].turn if records else 0
    for record, result in zip([r for r in records if r.turn == last and r.role == "tool"], results):
        record.tool_result = ToolResultRecord(result.content, bool(result.failed))
