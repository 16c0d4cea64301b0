"""Where the loop's rollouts come from: one `RolloutSource`, chosen once when the trainer is built.

    plain              `RolloutCollector.collect` on the rollout's rows, in the loop
    dynamic_sampling   `dynamic_sampling.DynamicSampler`: informative groups, extra rounds up to a cap
    async_rollouts     `async_rollouts.AheadOfTheLearner`: a sampler up to max_staleness rollouts ahead

The trainer holds the one `rollout_source` returns and calls `start` when train() begins, `next` once per
rollout and `close` when train() ends; `state` goes into each checkpoint and `restore` takes it back on resume
(None and nothing to do except for async_rollouts). It never asks which kind it holds. Only this module names the kinds
(tests/test_architecture.py checks that the trainer imports neither of the two modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from accelerate import Accelerator

from rloo.config import RLOOConfig
from rloo.rollout import Rollout, RolloutCollector, Samples
from rloo.rollout.async_rollouts import AheadOfTheLearner
from rloo.rollout.dynamic_sampling import DynamicSampler

RowsOf = Callable[[int], list[dict[str, Any]]]  # rollout index -> this process's dataset rows of that rollout


class RolloutSource(Protocol):
    """Steps 1-4 of each rollout, as the loop asks for them in order."""

    def start(self) -> None:
        """train() begins: start whatever runs beside the loop (async_rollouts' sampler)."""
        ...

    def next(self, rollout_index: int, global_step: int, episode: int) -> tuple[Rollout, Samples, dict[str, float]]:
        """Rollout `rollout_index`, its text side, and the source's own metrics (none for plain collection)."""
        ...

    def close(self) -> None:
        """train() ends: stop what `start` started and drop what it queued; a later `start` begins afresh."""
        ...

    def state(self) -> dict[str, Any] | None:
        """Between rollouts: what a checkpoint must hold for an exact resume besides the trainer's own state."""
        ...

    def restore(self, state: dict[str, Any] | None) -> None:
        """On resume, after `start` and before the first `next`: a checkpoint's `state()` (None: the checkpoint holds none)."""
        ...


@dataclass
class PlainRollouts:
    """Each rollout collected in the loop, from the weights of the last optimizer step."""

    collector: RolloutCollector
    rows_of: RowsOf

    def start(self) -> None:
        """Nothing runs beside the loop."""

    def next(self, rollout_index: int, global_step: int, episode: int) -> tuple[Rollout, Samples, dict[str, float]]:
        return *self.collector.collect(self.rows_of(rollout_index), global_step, episode), {}

    def close(self) -> None:
        """Nothing to stop."""

    def state(self) -> None:
        """Nothing beside the trainer's state."""

    def restore(self, state: dict[str, Any] | None) -> None:
        """Nothing to restore."""


def rollout_source(args: RLOOConfig, accelerator: Accelerator, collector: RolloutCollector, dataset: Any,
                   rows_of: RowsOf, num_rollouts: int) -> RolloutSource:
    """The source the config names (`config_checks` refuses async_rollouts with dynamic_sampling)."""
    if args.async_rollouts:
        return AheadOfTheLearner(collector, rows_of, num_rollouts, args.async_rollout_timeout, args.max_staleness)
    if args.dynamic_sampling:
        return DynamicSampler(args, accelerator, collector, dataset, collector.tokenizer.pad_token_id, rows_of)
    return PlainRollouts(collector, rows_of)


def zero_spread_message(step: int, num_generations: int, reward: float) -> str:
    """What the console says the first time every group of a rollout has zero spread."""
    return (f"rloo: at step {step} every prompt's {num_generations} completions got the same reward (mean reward "
            f"{reward:.4g}), so every advantage is 0 and this rollout trains nothing. If it persists: the task is "
            f"too easy or too hard for the model (pick prompts it solves sometimes), the reward may not "
            f"discriminate (check it on a few completions), or raise num_generations or temperature for more "
            f"varied completions; dynamic_sampling=True resamples prompts until groups differ.")
