"""Where metrics go: the console, `output_dir/metrics.jsonl`, accelerate's trackers, and a table of
sample completions. Only the main process writes; the trainer hands over already-gathered values.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol, Sequence

from rich.console import Console
from rich.table import Table


class MetricsSink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...


class JsonlSink:
    """Appends one JSON object per logging step to a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": step, **metrics}) + "\n")


class MetricsWindow:
    """Averages values recorded between two logging steps."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._values[key].append(float(value))

    def mean_and_reset(self) -> dict[str, float]:
        means = {key: sum(values) / len(values) for key, values in self._values.items() if values}
        self._values.clear()
        return means


def format_metrics(metrics: dict[str, float], step: int) -> str:
    """One console line: `step 10 | reward 0.41 | kl 0.002 | ...`."""
    parts = [f"step {step}"]
    for key, value in metrics.items():
        parts.append(f"{key} {value:.4g}" if isinstance(value, float) and math.isfinite(value) else f"{key} {value}")
    return " | ".join(parts)


def completions_table(
    prompts: Sequence[str],
    completions: Sequence[str],
    scores: Sequence[float],
    advantages: Sequence[float],
    step: int,
    max_rows: int,
) -> Table:
    """A rich table of sample completions, like TRL's query/response/score table."""
    table = Table(title=f"Sample completions at step {step}", show_lines=True)
    table.add_column("prompt", overflow="fold", max_width=48)
    table.add_column("completion", overflow="fold", max_width=48)
    table.add_column("score", justify="right")
    table.add_column("advantage", justify="right")
    for prompt, completion, score, advantage in list(zip(prompts, completions, scores, advantages))[:max_rows]:
        table.add_row(str(prompt), str(completion), f"{score:.4g}", f"{advantage:+.4g}")
    return table


def print_table(table: Table) -> None:
    Console(width=120).print(table)


def write_completions(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Append sample completions to a JSONL file next to the metrics."""
    with Path(path).open("a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
