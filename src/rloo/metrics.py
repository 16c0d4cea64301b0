"""Metrics: their names, the window they are averaged over, and where they go.

`rollout_metrics` (gathered over processes) and `step_metrics` name what the loop measures, with
TRL v0 and v1 names; `MetricsLogger` sends them to the console, `output_dir/metrics.jsonl` and
accelerate's trackers, with a table of sample completions. Only the main process writes.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch
from accelerate import Accelerator
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from .rewards.scoring import reward_function_metrics


class MetricsSink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...


class JsonlSink:
    """Appends one JSON object per logging step to a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.path.open("a") as handle:
            handle.write(strict_json({"step": step, **metrics}, f"{self.path.name} at step {step}") + "\n")


def _finite_or_none(value: Any, path: str, problems: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{path}={value}")
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v, f"{path}.{k}" if path else str(k), problems) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    return value


def strict_json(row: dict[str, Any], where: str) -> str:
    """JSON without NaN or Infinity tokens (which strict parsers reject): such values become null,
    and the console says which and why."""
    problems: list[str] = []
    cleaned = _finite_or_none(row, "", problems)
    if problems:
        tqdm.write(f"rloo: {where}: non-finite value(s) written as null: {', '.join(problems[:8])}")
    return json.dumps(cleaned, allow_nan=False)


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
            handle.write(strict_json(row, Path(path).name) + "\n")


# ------------------------------------------------------------------ names


def rollout_metrics(rollout: Any, accelerator: Accelerator, num_generations: int,
                    reward_names: Sequence[str]) -> dict[str, float]:
    """Metrics of a generated batch (a `rollout.Rollout`), gathered over processes."""
    lengths = rollout.completion_mask.sum(dim=1).float()
    gathered = accelerator.gather(torch.stack([
        rollout.raw_scores, rollout.scores, rollout.rewards, rollout.seq_kl, lengths,
        rollout.has_eos.float(), (~rollout.has_eos).float(),
    ], dim=1))  # (B_global, 7)
    raw_scores, scores, rewards, seq_kl, lengths, eos, truncated = gathered.unbind(dim=1)
    # K = 1 (reinforce) has no spread within a group.
    k = num_generations
    group_std = raw_scores.view(-1, k).std(dim=1) if k > 1 else torch.zeros_like(raw_scores)  # (P_global,)
    return {
        "reward": raw_scores.mean().item(),
        "reward_std": group_std.mean().item(),
        "frac_reward_zero_std": (group_std < 1e-8).float().mean().item(),
        "objective/scores": scores.mean().item(),  # after shaping
        "objective/kl": seq_kl.mean().item(),
        "objective/non_score_reward": (rewards - scores).mean().item(),  # the KL in the reward; 0 for kl_penalty="loss"
        "objective/rlhf_reward": rewards.mean().item(),
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.mean().item(),
        "val/num_eos_tokens": eos.sum().item(),
        "num_tokens": lengths.sum().item(),
        **reward_function_metrics(list(reward_names), accelerator.gather(rollout.reward_columns)),
    }


def step_metrics(totals: dict[str, float], denominator: float, with_kl_loss: bool) -> dict[str, float]:
    """An optimizer step's metrics from the sums over its micro-batches (see `update.STEP_TOTALS`)."""
    units = max(totals["units"], 1.0)  # completions (sequence ratio) or tokens (per-token ratio)
    ratio_mean = totals["ratio"] / units
    low, high = totals["clipped_low"] / units, totals["clipped_high"] / units
    metrics = {
        "loss/policy_avg": totals["loss"] / denominator,
        "policy/clipfrac_avg": low + high,
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": low + high,
        "policy/approxkl_avg": totals["approxkl"] / units,
        "policy/entropy_avg": totals["entropy"] / max(totals["tokens"], 1.0),
        "val/ratio": ratio_mean,
        "val/ratio_var": max(totals["ratio_sq"] / units - ratio_mean ** 2, 0.0),
    }
    if with_kl_loss:
        metrics["loss/kl_avg"] = totals["kl_loss"] / max(totals["tokens"], 1.0)
    return metrics


# ------------------------------------------------------------------ sinks


class MetricsLogger:
    """Sends logged metrics to the console, metrics.jsonl and accelerate's trackers (main process
    only, trackers through accelerate), and sample completions to a table and completions.jsonl."""

    def __init__(self, accelerator: Accelerator, output_dir: str | Path, report_to: str) -> None:
        self.accelerator = accelerator
        self.output_dir = Path(output_dir)
        self.use_trackers = report_to != "none"
        self.sinks: list[MetricsSink] = [JsonlSink(self.output_dir / "metrics.jsonl")] if accelerator.is_main_process else []

    def log(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        if self.accelerator.is_main_process:
            tqdm.write(format_metrics(metrics, step))
            for sink in self.sinks:
                sink.log(metrics, step)
        if self.use_trackers:
            self.accelerator.log(metrics, step=step)
        return metrics

    def log_completions(self, prompts: Sequence[Any], completions: Sequence[str], scores: Sequence[float],
                        advantages: Sequence[float], step: int, max_rows: int) -> None:
        if not self.accelerator.is_main_process:
            return
        print_table(completions_table(prompts, completions, scores, advantages, step, max_rows))
        write_completions(self.output_dir / "completions.jsonl", [
            {"step": step, "prompt": p, "completion": c, "score": s, "advantage": a}
            for p, c, s, a in list(zip(prompts, completions, scores, advantages))[:max_rows]
        ])
