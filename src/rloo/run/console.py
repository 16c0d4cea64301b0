"""What the console shows of a run: one row of the key metrics per log, and a table of sample completions.

Every name and cell can be untrusted text (reward functions' names, prompts, completions), so each goes
through `safe_text.console_text`: no markup is read and control characters are shown as escapes. The
tables are rendered to plain text (`render`) and printed with tqdm.write, above the progress bar.
"""

from __future__ import annotations

import io
import math
from typing import Any, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from rloo.safe_text import console_text

# The metrics a person watches; the full set goes to metrics.jsonl and the trackers.
CONSOLE_METRICS = {
    "reward": "reward",
    "reward_std": "spread",
    "objective/kl": "KL",
    "objective/entropy": "entropy",
    "completions/mean_length": "length",
    "policy/clipfrac_avg": "clip frac",
    "lr": "lr",
    "eps": "episodes/s",
}
CONSOLE_MAX_COLUMNS = 9


def console_label(key: str) -> str:
    """A short column name for an eval metric: eval/rewards/acc/pass@4 -> "acc pass@4"."""
    short = {"eval/reward": "eval/reward", "eval/reward_std": "spread", "eval/completions/mean_length": "length",
             "eval/completions/clipped_ratio": "truncated"}
    if key in short:
        return short[key]
    parts = key.split("/")
    return " ".join(parts[2:]) if key.startswith("eval/rewards/") else parts[-1]


def console_columns(metrics: dict[str, float]) -> dict[str, float]:
    """The short set shown on the console: the key training metrics when present, else (an eval
    log) reward, spread, length, truncation and pass@k, at most CONSOLE_MAX_COLUMNS."""
    shown = {label: metrics[key] for key, label in CONSOLE_METRICS.items() if key in metrics}
    if shown:
        return shown
    wanted = [key for key in ("eval/reward", "eval/reward_std", "eval/completions/mean_length",
                              "eval/completions/clipped_ratio") if key in metrics]
    wanted += [key for key in metrics if "pass@" in key]
    wanted = wanted or list(metrics)
    return {console_label(key): metrics[key] for key in wanted[:CONSOLE_MAX_COLUMNS]}


def format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def metrics_table(metrics: dict[str, float], step: int) -> Table:
    """One row of the key metrics at `step`, as a rich table (names are untrusted text: reward functions')."""
    table = Table(title=None, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    columns = {"step": step, **console_columns(metrics)}
    for name in columns:
        table.add_column(console_text(name, keep=""), justify="right", no_wrap=True)
    table.add_row(*(console_text(format_value(value), keep="") for value in columns.values()))
    return table


def render(renderable: Any, width: int = 120) -> str:
    """A rich renderable as plain text, for tqdm.write: printed above the progress bar, never through it."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=False, color_system=None).print(renderable)
    return buffer.getvalue().rstrip("\n")


def completions_table(rows: Sequence[dict[str, Any]], step: int, max_rows: int) -> Table:
    """A rich table of sample completions, like TRL's: prompt (a chat prompt as its turns), completion (a
    trajectory turn by turn, `shown_row`), every score column, advantage. Every cell and column name is untrusted
    text, shown through `safe_text.console_text`: no markup is read and control characters are shown as escapes."""
    table = Table(title=f"Sample completions at step {step}", show_lines=True)
    rows = [shown_row(row) for row in rows]
    columns = [key for key in (rows[0] if rows else {}) if key != "step"]
    for key in columns:
        text = key in ("prompt", "completion")
        table.add_column(console_text(key, keep=""), overflow="fold", max_width=48 if text else max(len(key), 9),
                         justify="left" if text else "right")
    for row in list(rows)[:max_rows]:
        table.add_row(*(console_text(row.get(key)) if key != "advantage" else f"{row[key]:+.4g}" for key in columns))
    return table


def shown_row(row: dict[str, Any]) -> dict[str, Any]:
    """A completions row as the tables show it: a trajectory's completion cell is its `turns` (each turn's text,
    tool calls and results, read by `safe_text.trajectory_text`), not its messages; other rows as they are."""
    if row.get("turns") is None:
        return row
    return {key: row["turns"] if key == "completion" else value for key, value in row.items() if key != "turns"}
