"""How a multi-turn rollout samples its turns (`multi_turn.MultiTurnRollout`): a `TurnSampler`.

    start(prompt_ids, k)                       turn 1: K completions of each prompt (row p*K + k)
    resume(rows, sequences, max_new_tokens)    the next turn of trajectories `rows` (turn 1's row numbers), one
                                               completion of each one's whole token list so far

`ReprefillTurns` works with any sampler: each later turn samples the whole trajectory again as a new prompt. A
sampler with `turn_session()` (the fast sampler: `generation.kept_turns.KeptCacheTurns`) keeps each
trajectory's KV cache across its tool calls instead, and runs only the tokens added since; the collector runs it
as it runs `sample` (`RolloutCollector.on_policy`: full weights when sharded, autocast, stop strings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rloo.generation.base import SampledBatch


class TurnSampler(Protocol):
    def start(self, prompt_ids: list[list[int]], num_generations: int) -> SampledBatch:
        ...

    def resume(self, rows: list[int], sequences: list[list[int]], max_new_tokens: int | None) -> SampledBatch:
        ...


@dataclass
class ReprefillTurns:
    """Every turn through the `SamplePolicy`: a later turn's prompt is the trajectory so far."""

    sample_policy: Callable[..., SampledBatch]

    def start(self, prompt_ids: list[list[int]], num_generations: int) -> SampledBatch:
        return self.sample_policy(prompt_ids, num_generations)

    def resume(self, rows: list[int], sequences: list[list[int]], max_new_tokens: int | None) -> SampledBatch:
        return self.sample_policy(sequences, 1, max_new_tokens=max_new_tokens)


@dataclass
class SessionTurns:
    """A sampler's turn session (`turn_session()`), each call run by the collector as it runs `sample`."""

    collector: Any  # the RolloutCollector
    session: Any  # e.g. generation.kept_turns.KeptCacheTurns

    def start(self, prompt_ids: list[list[int]], num_generations: int) -> SampledBatch:
        return self.collector.on_policy(lambda policy: self.session.start(policy, prompt_ids, num_generations))

    def resume(self, rows: list[int], sequences: list[list[int]], max_new_tokens: int | None) -> SampledBatch:
        return self.collector.on_policy(lambda policy: self.session.resume(policy, rows, sequences, max_new_tokens))


@dataclass
class PolicySampling:
    """The `SamplePolicy` the collector hands step 1: `collector.sample_ids`, and `turns()` for multi-turn rollouts."""

    collector: Any  # the RolloutCollector

    def __call__(self, *args: Any, **kwargs: Any) -> SampledBatch:
        return self.collector.sample_ids(*args, **kwargs)

    def turns(self) -> TurnSampler:
        """The sampler's turn session when it has one (and it is on), else re-prefilled turns."""
        open_session = getattr(self.collector.sampler, "turn_session", None)
        session = open_session() if open_session is not None else None
        return ReprefillTurns(self) if session is None else SessionTurns(self.collector, session)


def turn_sampler(sample_policy: Callable[..., SampledBatch]) -> TurnSampler:
    """How a rollout given `sample_policy` samples its turns: its own `turns()` when it has one, else re-prefilled."""
    turns = getattr(sample_policy, "turns", None)
    return turns() if turns is not None else ReprefillTurns(sample_policy)
