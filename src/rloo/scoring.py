"""Calling reward functions: pass each only what it accepts, check what it returns, weight and sum.

A reward function has TRL's shape, `f(prompts, completions, completion_ids, **columns)`, where
columns are the dataset's other columns (e.g. `answer`). Functions with narrower signatures
(`length_reward(completions, prompts=None)`) get only the arguments they name; a required
argument that nobody can supply is an error at construction, not at step 1000.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

RewardFunc = Callable[..., Sequence[float]]

# Arguments the trainer supplies besides the dataset's columns.
TRAINER_ARGUMENTS = ("prompts", "completions", "completion_ids")


class RewardError(RuntimeError):
    """A reward function was misconfigured or returned something unusable."""


@dataclass
class RewardFunction:
    """One reward function and the keyword arguments its signature accepts."""

    func: RewardFunc
    name: str
    accepts_any: bool = False  # it takes **kwargs
    accepted: frozenset[str] = field(default_factory=frozenset)
    required: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def wrap(cls, func: RewardFunc) -> "RewardFunction":
        if not callable(func):
            raise TypeError(
                f"reward function {func!r} is not callable; pass a function "
                f"f(prompts, completions, completion_ids, **columns) -> list[float]."
            )
        name = getattr(func, "__name__", type(func).__name__)
        params = inspect.signature(func).parameters.values()
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return cls(
            func=func,
            name=name,
            accepts_any=accepts_any,
            accepted=frozenset(p.name for p in named),
            required=frozenset(p.name for p in named if p.default is p.empty),
        )

    def check_available(self, available: set[str]) -> None:
        missing = sorted(self.required - available)
        if missing:
            raise RewardError(
                f"reward function `{self.name}` requires {missing}, which neither the trainer "
                f"({', '.join(TRAINER_ARGUMENTS)}) nor the dataset's columns ({sorted(available - set(TRAINER_ARGUMENTS))}) "
                f"provide. Add the column to the dataset or give the parameter a default."
            )

    def __call__(self, arguments: dict[str, Any]) -> list[float]:
        kwargs = arguments if self.accepts_any else {k: v for k, v in arguments.items() if k in self.accepted}
        return list(self.func(**kwargs))


def score_completions(
    reward_functions: Sequence[RewardFunction],
    weights: Sequence[float],
    arguments: dict[str, Any],
    num_completions: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run every reward function on a batch and combine them with their weights.

    Args:
        reward_functions: the wrapped functions.
        weights: one weight per function.
        arguments: keyword arguments for the functions (prompts, completions, completion_ids, columns),
            each a list of length num_completions.
        num_completions: B, the number of completions scored.

    Returns:
        (B,) weighted scores and (B, F) per-function rewards.
    """
    columns = []
    for fn in reward_functions:
        values = fn(arguments)
        if len(values) != num_completions:
            raise RewardError(
                f"reward function `{fn.name}` returned {len(values)} values for {num_completions} completions; "
                f"it must return exactly one number per completion (nothing is broadcast)."
            )
        for index, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise RewardError(
                    f"reward function `{fn.name}` returned {value!r} for completion {index}; "
                    f"rewards must be finite numbers."
                )
        columns.append(torch.tensor([float(v) for v in values], dtype=torch.float32))
    per_function = torch.stack(columns, dim=1)  # (B, F)
    scores = (per_function * torch.tensor(weights, dtype=torch.float32)).sum(dim=1)  # (B,)
    return scores, per_function
