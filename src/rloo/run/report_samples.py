"""The samples of `rloo report`: the training completions by step (completions.jsonl) and the evaluation samples
(eval_samples.jsonl, written by `rloo eval` beside the run), as HTML tables.

A single completion is a `<pre>` cell. A multi-turn trajectory (a row with `turns`, `rollout.turn_records.TurnRecord`s as
JSON) is a list of collapsible turns, `<details>`/`<summary>` and no script: each summary names the turn, its
calls and failed calls, and the start of the model's text (on one line); opened, the turn shows the model's text, each tool call
(`call ▸ add(a=2, b=3)`) and what the tool returned (`result → 5`, or `error → ...` for a failed call), each marked
and styled apart, so that a tool's words never read as the model's. The last turn starts open.

Every value is untrusted (a tampered file, a model's or a tool's text): it goes through `safe_text.html_text`
(control characters visible, HTML-escaped), and a record of the wrong shape reads as text, never raises.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

from rloo.run.trackers import IMAGE_FILE
from rloo.safe_text import CALL_MARK, call_text, html_text, result_text, visible

EVAL_SAMPLES_SHOWN = 24  # eval_samples.jsonl rows shown (the file holds every sample; the page stays readable)
SAMPLES_STYLE = """
details.turn { border-left: 3px solid #bbb; margin: 0.2em 0; padding-left: 0.4em; }
details.turn > summary { cursor: pointer; color: #444; }
.call { background: #eef4ff; }
.result { background: #eefaee; }
.error { background: #fdecec; }
.call, .result, .error { padding: 0 0.3em; }
"""


def completions_html(rows: list[dict[str, Any]], per_step: int = 8) -> str:
    """The sample completions by step: every cell and name through `safe_text.html_text` (a chat
    prompt as its turns, a trajectory as collapsible turns); rows whose step is not an integer come last, under
    the step they name."""
    by_step: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        step = row.get("step", 0)
        by_step[step if isinstance(step, int) and not isinstance(step, bool) else visible(step)].append(row)
    parts = []
    for step in sorted(by_step, key=lambda s: (isinstance(s, str), s if isinstance(s, int) else 0, str(s))):
        parts.append(f"<h3>step {html.escape(str(step))}</h3>{rows_table(by_step[step][:per_step], ('step',))}")
    return "".join(parts) or "<p>No completions were logged (log_completions=False).</p>"


def eval_samples_html(rows: list[dict[str, Any]], shown: int = EVAL_SAMPLES_SHOWN) -> str:
    """eval_samples.jsonl (`rloo eval`: every sample with its rewards) as a section: how many, then the first
    `shown` (by prompt index, as the file holds them); nothing without the file."""
    if not rows:
        return ""
    scores = [r["score"] for r in rows if isinstance(r.get("score"), (int, float)) and not isinstance(r["score"], bool)]
    mean = f", mean score {sum(scores) / len(scores):.4g}" if scores else ""
    note = (f"{len(rows)} samples in eval_samples.jsonl (written by rloo eval){mean}; "
            f"{'all' if len(rows) <= shown else f'the first {shown}'} shown.")
    return f"<h2>Evaluation samples</h2><p>{html_text(note)}</p>{rows_table(rows[:shown], ('step',))}"


def rows_table(rows: list[dict[str, Any]], hidden: tuple[str, ...] = ()) -> str:
    """Rows as one table, the first row's keys as the columns (less `hidden` and `turns`, which a trajectory's
    completion cell shows)."""
    if not rows:
        return ""
    columns = [c for c in rows[0] if c not in hidden and c != "turns"]
    head = "".join(f"<th>{html_text(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_value_html(r, c)}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _value_html(row: dict[str, Any], column: str) -> str:
    if column == "image":
        return _thumbnails(row.get(column))
    if column == "completion" and isinstance(row.get("turns"), list) and row["turns"]:
        return turns_html(row["turns"])
    return _cell(row.get(column))


def turns_html(turns: list[Any]) -> str:
    """A trajectory's turn records as collapsible turns: `<details>` per turn, the last one open."""
    by_turn: dict[Any, list[dict[str, Any]]] = {}
    for record in turns:
        record = record if isinstance(record, dict) else {"turn": "?", "role": "assistant", "text": str(record)}
        turn = record.get("turn", "?")
        by_turn.setdefault(turn if isinstance(turn, (int, str)) else str(turn), []).append(record)
    parts = []
    for index, (turn, records) in enumerate(by_turn.items()):
        calls = [r for r in records if r.get("role") == "tool"]
        failed = sum(isinstance(r.get("tool_result"), dict) and bool(r["tool_result"].get("error")) for r in calls)
        text = " ".join(" ".join(str(r.get("text", "")).split()) for r in records if r.get("role") != "tool").strip()
        what = f"{len(calls)} tool call{'' if len(calls) == 1 else 's'}" + (f", {failed} failed" if failed else "")
        preview = text if len(text) <= 80 else text[:79] + "\u2026"
        summary = f"turn {turn} \u00b7 {what if calls else 'answer'}" + (f" \u00b7 {preview}" if preview else "")
        body = "".join(_record_html(r) for r in records)
        opened = " open" if index == len(by_turn) - 1 else ""
        parts.append(f'<details class="turn"{opened}><summary>{html_text(summary, keep="")}</summary>{body}</details>')
    return "".join(parts)


def _record_html(record: dict[str, Any]) -> str:
    """One record: the model's text, or a call (marked `call ▸`) and its result (`result →` / `error →`)."""
    if record.get("role") != "tool":
        said = f"{record.get('role', '?')}: {record.get('text', '')}"
        return f'<pre class="assistant">{html_text(said)}</pre>'
    result = record.get("tool_result")
    kind = "error" if isinstance(result, dict) and result.get("error") else "result"
    return (f'<pre class="call">call {CALL_MARK} {html_text(call_text(record.get("tool_call")))}</pre>'
            f'<pre class="{kind}">{html_text(result_text(result))}</pre>')


def _thumbnails(value: Any) -> str:
    """log_multimodal's "image" column: thumbnails of `data.images.save_images`' files; any other value as text."""
    if not isinstance(value, list) or not all(isinstance(v, str) and IMAGE_FILE.fullmatch(v) for v in value):
        return _cell(value)
    return "".join(f'<img src="{html.escape(v, quote=True)}" width="64" alt="prompt image">' for v in value)


def _cell(value: Any) -> str:
    return f"<pre>{html_text(value)}</pre>"
