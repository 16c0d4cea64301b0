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
from tqdm.auto import tqdm

from rloo.algo.importance import mismatch_metrics
from rloo.rewards.scoring import reward_function_metrics
from rloo.run.console import completions_table, metrics_table, render, shown_row
from rloo.run.trackers import image_files, init_kwargs, log_table, project_name, resolve_report_to, tracker_config
from rloo.safe_text import display, tracker_text, visible


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
        tqdm.write(visible(f"rloo: {where}: non-finite value(s) written as null: {', '.join(problems[:8])}"))
    return json.dumps(cleaned, allow_nan=False, default=str)


# A metric averaged over units (tokens, completions) is averaged over a logging window weighted by the
# units of each step, so the window's value is the one of all its steps pooled, however uneven they are.
# Metric -> the metric (logged with it) that counts its units; other metrics weigh every step the same.
WINDOW_WEIGHTS = {
    "loss/policy_avg": "train/loss_denominator",
    "policy/entropy_avg": "train/completion_tokens",
    "loss/kl_avg": "train/completion_tokens",
    "policy/clipfrac_avg": "train/ratio_units",
    "clip_ratio/low_mean": "train/ratio_units",
    "clip_ratio/high_mean": "train/ratio_units",
    "clip_ratio/region_mean": "train/ratio_units",
    "policy/approxkl_avg": "train/ratio_units",
    "val/ratio": "train/ratio_units",
    "val/ratio_var": "train/ratio_units",
    "policy/off_policy_masked_frac": "train/completions",
}


def log_due(step: int, args: Any, is_last: bool) -> bool:
    """Whether the loop logs after optimizer step `step`: every logging_steps steps, at the last step, and at
    step 1 with logging_first_step (TRL's name)."""
    return step % args.logging_steps == 0 or is_last or (args.logging_first_step and step == 1)


class MetricsWindow:
    """Averages values recorded between two logging steps, each weighted by the units it averages
    over (`WINDOW_WEIGHTS`; 1 per recording for the others)."""

    def __init__(self, weights: dict[str, str] | None = None) -> None:
        self.weights = WINDOW_WEIGHTS if weights is None else weights
        self._sums: dict[str, float] = defaultdict(float)
        self._totals: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            weight = float(metrics.get(self.weights.get(key, ""), 1.0))
            self._sums[key] += weight * float(value)
            self._totals[key] += weight

    def mean_and_reset(self) -> dict[str, float]:
        # A metric whose every recording had zero units (no tokens) has no value and is left out.
        means = {key: self._sums[key] / self._totals[key] for key in self._sums if self._totals[key] > 0}
        self._sums.clear()
        self._totals.clear()
        return means


def reward_cells(reward_names: Sequence[str], values: torch.Tensor) -> dict[str, float | None]:
    """One completion's (F,) reward values by function name, None where the function did not apply (NaN)."""
    return {name: None if math.isnan(v) else v for name, v in zip(reward_names, values.tolist())}


def completion_rows(prompts: Sequence[Any], completions: Sequence[Any], reward_names: Sequence[str],
                    reward_columns: torch.Tensor, scores: Sequence[float], advantages: Sequence[float],
                    step: int, max_rows: int, extra: dict[str, Sequence[Any]] | None = None,
                    turns: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """The first max_rows completions as rows: step, prompt, completion, each reward function's
    value (None where it did not apply), the shaped score, the advantage, and the columns reward
    functions added with TRL's `log_extra`. A multi-turn completion is its messages (`Samples.shown`), followed by
    its `turns` (`Samples.turn_records`: each turn's text, tool calls and results), which the tables show."""
    rows = []
    for index in range(min(max_rows, len(completions))):
        per_function = reward_cells(reward_names, reward_columns[index])
        added = {column: values[index] for column, values in (extra or {}).items() if index < len(values)}
        rows.append({"step": step, "prompt": prompts[index], "completion": completions[index],
                     **with_turns(turns, index), **per_function,
                     "score": float(scores[index]), "advantage": float(advantages[index]), **added})
    return rows


def with_turns(turns: Sequence[Any] | None, index: int) -> dict[str, Any]:
    """{"turns": the turn records of completion `index`} for a trajectory; {} for a single completion."""
    return {} if turns is None or turns[index] is None else {"turns": turns[index]}


def write_completions(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Append sample completions to a JSONL file next to the metrics."""
    with Path(path).open("a") as handle:
        for row in rows:
            handle.write(strict_json(row, Path(path).name) + "\n")


# ------------------------------------------------------------------ names


def length_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """TRL's completion-length metrics: mean, min and max length of every completion, the fraction
    truncated (no EOS or stop), and mean, min and max length of those that ended (EOS or stop); when
    none ended, those three are 0, as TRL logs them.

    lengths: (B,) completion tokens; truncated: (B,) bool.
    """
    lengths = lengths.float()
    terminated = lengths[~truncated]
    if terminated.numel() == 0:  # TRL: "edge case where no terminated sequences are found"
        terminated = lengths.new_zeros(1)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    }


def rollout_metrics(rollout: Any, accelerator: Accelerator, num_generations: int,
                    reward_names: Sequence[str]) -> dict[str, float]:
    """Metrics of a generated batch (a `rollout.Rollout`), gathered over processes."""
    lengths = rollout.model_mask().sum(dim=1).float()  # the model's own tokens: tool results are not counted
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
        **length_metrics(lengths, truncated.bool()),
        "val/num_eos_tokens": eos.sum().item(),
        "num_tokens": lengths.sum().item(),
        **reward_function_metrics(list(reward_names), accelerator.gather(rollout.reward_columns)),
        # Sampler/trainer mismatch, when the sampler returned its own log-probs (algo.importance).
        **({} if rollout.mismatch is None else mismatch_metrics(accelerator.gather(rollout.mismatch).view(-1, 4))),
    }


def step_metrics(totals: dict[str, float], denominator: float, with_kl_loss: bool,
                 with_off_policy_mask: bool = False) -> dict[str, float]:
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
        # The units the metrics above average over, global: what a logging window weighs each step by.
        "train/loss_denominator": denominator,
        "train/completion_tokens": totals["tokens"],
        "train/ratio_units": totals["units"],
    }
    if with_kl_loss:
        metrics["loss/kl_avg"] = totals["kl_loss"] / max(totals["tokens"], 1.0)
    if with_off_policy_mask:  # the fraction of trained completions off_policy_mask_threshold dropped
        metrics["policy/off_policy_masked_frac"] = totals["off_policy_masked"] / max(totals["completions"], 1.0)
        metrics["train/completions"] = totals["completions"]
    return metrics


def completion_clip_extremes(clipped_low: torch.Tensor, clipped_high: torch.Tensor,
                             units: torch.Tensor) -> tuple[float, float]:
    """One process's micro-batch: the smallest low-clipped and the largest high-clipped fraction of a
    completion's ratio units (TRL's `clip_ratio/low_min` and `/high_max` before the gather). With one
    ratio per completion each fraction is 0 or 1; with per-token ratios it is the share of the
    completion's tokens. A completion without units (not trained) is left out; NaN when none has any.

    clipped_low, clipped_high: (b,) or (b, C) 0/1; units: the same shape, the ratio units (0/1).
    """
    if units.dim() == 1:
        count, low, high = units, clipped_low * units, clipped_high * units
    else:
        count, low, high = units.sum(dim=1), (clipped_low * units).sum(dim=1), (clipped_high * units).sum(dim=1)
    kept = count > 0
    if not bool(kept.any()):
        return float("nan"), float("nan")
    return (low[kept] / count[kept]).min().item(), (high[kept] / count[kept]).max().item()


def clip_extremes(per_micro_batch: torch.Tensor) -> dict[str, float]:
    """TRL's `clip_ratio/low_min` and `clip_ratio/high_max` of an optimizer step: per micro-batch, the
    min (max) over every process's completions, averaged over the step's micro-batches, as TRL
    averages its per-micro-batch values over a logging window. Empty where no completion had units.

    per_micro_batch: (P, M, 2) each process's `completion_clip_extremes` of its M micro-batches (NaN: none).
    """
    low, high = per_micro_batch[..., 0], per_micro_batch[..., 1]
    low_min = torch.where(low.isnan(), torch.inf, low).min(dim=0).values  # (M,) NaN-skipping min over processes
    high_max = torch.where(high.isnan(), -torch.inf, high).max(dim=0).values
    present = ~low.isnan().all(dim=0)  # (M,) micro-batches with a value on some process
    if not bool(present.any()):
        return {}
    return {"clip_ratio/low_min": low_min[present].mean().item(), "clip_ratio/high_max": high_max[present].mean().item()}


# TRL 1.16's names for figures rloo logs under TRL v0's names (the same values, logged under both).
TRL_TRAIN_ALIASES = {"kl": "objective/kl", "entropy": "policy/entropy_avg", "learning_rate": "lr",
                     "loss": "loss/policy_avg"}
# Other names of a value already logged under a TRL 1.16 name: metrics.jsonl keeps them, the trackers
# chart the value once, under TRL's name.
DUPLICATE_NAMES = {old: new for new, old in TRL_TRAIN_ALIASES.items()} | {"objective/entropy": "entropy",
                                                                          "policy/clipfrac_avg": "clip_ratio/region_mean"}


def with_trl_names(metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` plus TRL 1.16's names (kl, entropy, learning_rate, loss) for the values logged under v0 names."""
    return {**metrics, **{new: metrics[old] for new, old in TRL_TRAIN_ALIASES.items() if old in metrics}}


def tracker_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """What the trackers get, laid out as transformers' trackers lay out TRL's logs: a training figure
    as "train/<name>" (`train/reward`, `train/kl`, `train/completions/mean_length`), an eval figure as
    "eval/<name>"; each value once (not under its TRL v0 name too, nor as transformers' "eval_reward")."""
    # evaluate() returns each eval figure as "eval/reward" and as transformers' "eval_reward".
    underscored = {"_".join(k.split("/", 1)) for k in metrics if k.startswith("eval") and "/" in k}
    charted: dict[str, float] = {}
    for key, value in metrics.items():
        if key in underscored or DUPLICATE_NAMES.get(key) in metrics:
            continue
        charted[key if key.startswith(("eval", "train/")) else f"train/{key}"] = value
    return charted


# ------------------------------------------------------------------ sinks


class MetricsLogger:
    """Sends logged metrics to the console (a short table), metrics.jsonl and accelerate's trackers,
    and sample completions to the console, completions.jsonl and the trackers' tables. Only the main
    process writes; accelerate's trackers are themselves main-process only."""

    def __init__(self, accelerator: Accelerator, output_dir: str | Path, report_to: str | Sequence[str],
                 console: bool = True) -> None:
        self.accelerator = accelerator
        self.output_dir = Path(output_dir)
        self.trackers = resolve_report_to(report_to)
        self.use_trackers = bool(self.trackers)
        self.console = console
        self.sinks: list[MetricsSink] = [JsonlSink(self.output_dir / "metrics.jsonl")] if accelerator.is_main_process else []

    def start(self, config: dict[str, Any], run_name: str | None) -> None:
        """Open the trackers: project WANDB_PROJECT (default "rloo"), the run named `run_name`."""
        if self.use_trackers:
            self.accelerator.init_trackers(project_name(), config=tracker_config(config),
                                           init_kwargs=init_kwargs(self.trackers, run_name))

    def log(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        if self.accelerator.is_main_process:
            if self.console:
                tqdm.write(render(metrics_table(metrics, step)))
            for sink in self.sinks:
                sink.log(metrics, step)
        if self.use_trackers:
            # names hold reward functions' and log_metric's names: encodable, or a tracker's writer raises
            self.accelerator.log({tracker_text(k): v for k, v in tracker_metrics(metrics).items()}, step=step)
        return metrics

    def log_eval_completions(self, rows: list[dict[str, Any]]) -> None:
        """Every scored sample of an evaluation (`evaluation.sample_rows`), appended to eval_completions.jsonl."""
        if self.accelerator.is_main_process and rows:
            write_completions(self.output_dir / "eval_completions.jsonl", rows)

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """Rows from `completion_rows`: printed, appended to completions.jsonl, and logged as the
        "completions" table to the trackers that take tables (text to TensorBoard), log_multimodal's
        "image" files as each tracker's images (`trackers.log_table`)."""
        if not self.accelerator.is_main_process or not rows:
            return
        write_completions(self.output_dir / "completions.jsonl", rows)  # first: the file holds the rows whatever happens
        if self.console:
            tqdm.write(render(completions_table(rows, step, len(rows))))
        shown = [shown_row(row) for row in rows]  # a trajectory's completion cell is its turns
        columns = [tracker_text(key) for key in shown[0]]
        # The trackers get the raw text (they render and sanitise it themselves), a chat prompt as its
        # turns, encodable (no lone surrogates).
        table = [[row.get(key) if isinstance(row.get(key), (int, float, type(None))) else tracker_text(display(row.get(key)))
                  for key in shown[0]] for row in shown]
        images = [image_files(row.get("image"), self.output_dir) for row in rows]  # log_multimodal's files
        for tracker in self.accelerator.trackers if self.use_trackers else []:
            log_table(tracker, "completions", columns, table, step, images)
