"""Untrusted text, made safe to show: the one place every console, log and report path goes through.

Everything a run shows that came from a model, a dataset, a reward function or a tool is untrusted:
a completion may hold rich markup (`[/]`, `[link=...]`), terminal escapes (`\\x1b[2J`), a carriage
return that overwrites the line before it, bidirectional overrides that reorder what is read, or lone
surrogates (from a JSON file) that no terminal encoding accepts. Shown raw, such text crashes rich
(`MarkupError`), the print (`UnicodeEncodeError`) or the HTML page, or rewrites what the terminal shows.

- `visible(value)`: the text with every control character written out as an escape (`\\x1b`, `\\r`,
  `\\u202e`, `\\udc80`); `keep` names the characters left as they are (newline and tab in a table cell).
- `console_text(value)`: a rich `Text` of `visible(display(value))`: rich never reads markup or emoji
  codes in a `Text`, so the cell shows exactly the characters.
- `display(value)`: how a value reads: a chat prompt as its turns (`user: ...` lines; a multi-turn
  trajectory's tool calls as `call ▸ add {...}` and tool results as `tool ▸ add → 5`), a trajectory's turn
  records (`rollout.turn_records`, as JSON) turn by turn (`trajectory_text`), a float to 4 significant digits,
  anything else as `str`.
- `html_text(value)`: `display`, `visible`, then `html.escape`: for `rloo report`.
- `tracker_text(value)`: the raw text, only with lone surrogates escaped so that every tracker can
  encode it (TensorBoard and W&B take the text as it is; they render and sanitise it themselves).

The escape of a character is Python's own (`repr` of that one character), so `\\x1b` on the console
means the byte 0x1b was there. A backslash already in the text is left as it is (LaTeX and code read
better unescaped), so the literal four characters `\\x1b` and an escaped ESC look the same.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

from rich.text import Text

# C0 controls (including ESC, CR, BS, NUL), DEL and the C1 controls (0x9b is a one-byte CSI), the
# line/paragraph separators, the bidirectional marks, embeddings, overrides and isolates, and lone
# surrogates. Newline and tab are C0 too; `keep` decides whether they stay.
UNSAFE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_PATTERNS: dict[str, re.Pattern[str]] = {}
CALL_MARK, RESULT_MARK = "\u25b8", "\u2192"  # ▸ before a tool call or a tool's name, → before its result


def _escape(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]  # Python's escape of the one character: \x1b, \r, \u202e


def _pattern(keep: str) -> re.Pattern[str]:
    if keep not in _PATTERNS:
        kept = "".join(re.escape(c) for c in keep)
        _PATTERNS[keep] = re.compile(f"(?![{kept}])[{UNSAFE}]" if kept else f"[{UNSAFE}]")
    return _PATTERNS[keep]


def visible(value: Any, keep: str = "") -> str:
    """`str(value)` with every control character (but those in `keep`) written as its escape."""
    return _pattern(keep).sub(_escape, value if isinstance(value, str) else str(value))


def tool_call_line(call: Any) -> str:
    """One tool call of an assistant turn as `call ▸ name {"arguments": ...}` (the arguments as JSON;
    a malformed call's raw argument text as it came)."""
    function = call.get("function", call) if isinstance(call, dict) else {}
    arguments = function.get("arguments", "") if isinstance(function, dict) else ""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, default=str)
    name = function.get("name", "?") if isinstance(function, dict) else str(call)
    return f"call {CALL_MARK} {name} {arguments}".rstrip()


def chat_turns(messages: list[Any]) -> str:
    """A conversation (TRL's list of {"role", "content"} messages) as one `role: content` line per
    turn; a content given as parts shows its text parts and names the others (`<image>`). A multi-turn
    trajectory reads turn by turn: an assistant turn's tool calls each on a `call ▸ add {"a": 2, "b": 3}`
    line, and each tool result marked as `tool ▸ add → 5`, so that what a tool returned (untrusted, like
    the rest) is never read as the model's words."""
    lines = []
    for message in messages:
        if not isinstance(message, dict):
            lines.append(str(message))
            continue
        content = message.get("content", "")
        if isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}, {"type": "image"}]
            content = " ".join(str(part.get("text", "")) if isinstance(part, dict) and part.get("type") == "text"
                               else f"<{part.get('type', 'part')}>" if isinstance(part, dict) else str(part)
                               for part in content)
        content = "" if content is None else content
        role = message.get("role", "?")
        calls = message.get("tool_calls") or []
        if role == "tool":
            lines.append(f"tool {CALL_MARK} {message.get('name', '?')} {RESULT_MARK} {content}")
            continue
        if content or not calls:
            lines.append(f"{role}: {content}")
        lines.extend(tool_call_line(call) for call in (calls if isinstance(calls, list) else [calls]))
    return "\n".join(lines)


def call_text(call: Any) -> str:
    """A turn record's tool call as `name(a=2, b="x")` (argument values as JSON); a malformed call as why it is."""
    call = call if isinstance(call, dict) else {}
    if call.get("error"):
        return f"malformed: {call['error']}"
    arguments = call.get("arguments")
    if isinstance(arguments, dict):
        arguments = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False, default=str)}" for key, value in arguments.items())
    return f"{call.get('name', '?')}({'' if arguments is None else arguments})"


def result_text(result: Any) -> str:
    """A turn record's tool result: `result → 5`, `error → {"error": ...}` for a failed call, or that it has none."""
    if not isinstance(result, dict):
        return "no result (the trajectory ended with this call)"
    return f"{'error' if result.get('error') else 'result'} {RESULT_MARK} {result.get('content', '')}"


def trajectory_text(turns: list[Any]) -> str:
    """A trajectory's turn records (`rollout.turn_records.TurnRecord.as_json`) turn by turn: `turn k assistant: text`, then
    each call of that turn as `  call ▸ add(a=2, b=3)` and its result as `  result → 5` (a failed call's as
    `  error → ...`), so that the model's words, its calls and what the tools returned never read as one another."""
    lines = []
    for record in turns:
        record = record if isinstance(record, dict) else {"role": "assistant", "text": str(record)}
        if record.get("role") == "tool":
            lines += [f"  call {CALL_MARK} {call_text(record.get('tool_call'))}", f"  {result_text(record.get('tool_result'))}"]
        else:
            lines.append(f"turn {record.get('turn', '?')} {record.get('role', '?')}: {record.get('text', '')}")
    return "\n".join(lines)


def is_trajectory(value: Any) -> bool:
    """A list of turn records (each a dict with "turn" and "role"): `trajectory_text` shows it."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(r, dict) and "turn" in r and "role" in r for r in value)


def is_conversation(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(m, dict) and "role" in m for m in value)


def display(value: Any) -> str:
    """How a value reads in a table: a trajectory's turn records or a conversation as its turns, a float to 4
    significant digits."""
    if is_trajectory(value):
        return trajectory_text(list(value))
    if is_conversation(value):
        return chat_turns(list(value))
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return value if isinstance(value, str) else str(value)


def console_text(value: Any, keep: str = "\n\t") -> Text:
    """A rich cell showing `display(value)` character for character: no markup, no control characters."""
    return Text(visible(display(value), keep))


def html_text(value: Any, keep: str = "\n\t") -> str:
    """`display(value)` for an HTML page: control characters made visible, then HTML-escaped."""
    return html.escape(visible(display(value), keep))


def tracker_text(value: Any) -> str:
    """The raw text for a tracker's table, with only lone surrogates escaped (no encoder takes them)."""
    text = value if isinstance(value, str) else str(value)
    return re.sub("[\ud800-\udfff]", _escape, text)
