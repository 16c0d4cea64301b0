"""TRL's built-in reward functions (`trl.rewards`), under their TRL names, built on rloo's own.

`from trl.rewards import accuracy_reward` ports as `from rloo.rewards import accuracy_reward`, and
`--reward_funcs accuracy_reward` works on the command line. TRL's functions read the gold answer
from a `solution` column, rloo's built-ins from `answer`; these accept either.

Also here: `RewardLog`, what backs the `log_extra` / `log_metric` keyword arguments TRL passes to
reward functions, and `TrainerStateView`, the `trainer_state` they receive.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from transformers import TrainerState

from rloo.rewards.builtins import completion_text, math_accuracy, think_format


def _gold(solution: list | None, answer: list | None) -> list:
    if solution is None and answer is None:
        raise ValueError("this reward reads the gold answer from a `solution` (TRL) or `answer` (rloo) column; "
                         "the dataset has neither.")
    return solution if solution is not None else answer


def accuracy_reward(completions: list, solution: list | None = None, answer: list | None = None,
                    **kwargs: Any) -> list[float | None]:
    """TRL's accuracy_reward: math-verify equivalence with the gold answer (rloo's `math_accuracy`).

    A gold answer math-verify cannot parse gives None (the row is not scored), as in TRL.
    """
    return math_accuracy(completions, answer=_gold(solution, answer))


def think_format_reward(completions: list, **kwargs: Any) -> list[float]:
    """TRL's think_format_reward: 1.0 for one well-formed `<think>...</think>` block then an answer
    (rloo's `think_format`)."""
    return think_format(completions)


def reasoning_accuracy_reward(completions: list, solution: list | None = None, answer: list | None = None,
                              reasoning_delimiters: list[str] | None = None, **kwargs: Any) -> list[float | None]:
    """TRL's reasoning_accuracy_reward: accuracy of the text after the last reasoning delimiter
    (default `</think>`); 0.0 when the reasoning never closes.

    This reads decoded text, so the delimiter must survive decoding with skip_special_tokens=True.
    When `</think>` is a special token of your tokenizer, use `thinking_answer_reward(tokenizer)`,
    which finds it by token id.
    """
    delimiters = reasoning_delimiters or ["</think>"]
    gold = _gold(solution, answer)
    rewards: list[float | None] = []
    for completion, target in zip(completions, gold):
        text = completion_text(completion)
        cut = max((text.rfind(d) + len(d) for d in delimiters if d in text), default=-1)
        rewards.append(0.0 if cut < 0 else math_accuracy([text[cut:]], answer=[target])[0])
    return rewards


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable[..., list[float]]:
    """TRL's (DAPO's) soft overlong punishment, by completion length L in tokens:
    0 for L <= max - cache, (max - cache - L) / cache up to max, -1 beyond.

    Example: with max_completion_len=10, soft_punish_cache=4: lengths 6, 8, 11 -> 0.0, -0.5, -1.0.
    """
    if soft_punish_cache < 1 or max_completion_len <= soft_punish_cache:
        raise ValueError(f"soft_punish_cache={soft_punish_cache} must be >= 1 and below "
                         f"max_completion_len={max_completion_len}.")

    def soft_overlong_punishment(completion_ids: list, **kwargs: Any) -> list[float]:
        free = max_completion_len - soft_punish_cache
        return [0.0 if len(ids) <= free else (free - len(ids)) / soft_punish_cache if len(ids) <= max_completion_len
                else -1.0 for ids in completion_ids]

    return soft_overlong_punishment


TRL_REWARDS: dict[str, Callable] = {
    "accuracy_reward": accuracy_reward,
    "think_format_reward": think_format_reward,
    "reasoning_accuracy_reward": reasoning_accuracy_reward,
    # TRL's script uses these values for its registry entry.
    "get_soft_overlong_punishment": get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
}


class RewardLog:
    """Collects what reward functions log in one rollout: `log_extra(column, values)` adds a column to
    the completions table (one value per completion), `log_metric(name, value)` a scalar averaged
    into the logged metrics, as in TRL."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = defaultdict(list)
        self._metrics: dict[str, list[float]] = defaultdict(list)

    def log_extra(self, column: str, values: list) -> None:
        self.columns[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self._metrics[name].append(float(value))

    def metrics(self) -> dict[str, float]:
        return {name: sum(values) / len(values) for name, values in self._metrics.items()}


@dataclass
class TrainerStateView(TrainerState):
    """The `trainer_state` reward functions get: transformers' TrainerState (global_step, epoch,
    max_steps, log_history, ...) plus `episode` (completions generated so far). `state["global_step"]`
    still reads like the dict rloo passed before."""

    episode: int = 0

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)
