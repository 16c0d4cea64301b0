"""What a `rollout_func(prompts, trainer)` samples with, and what it may return besides TRL's three keys.

TRL hands a rollout_func the trainer, and the function samples through `trainer.vllm_generation.generate(prompts,
images, num_generations)`. rloo's trainer has the same attribute with the same call and return shapes, backed by
whatever sampler the run uses (the fast or `generate` sampler on the policy's current weights, or the vLLM engine,
which is sent the weights after every optimizer step): `RolloutGeneration`. A TRL rollout_func that samples that way
ports as it is. Its log-probs are the sampler's; the trainer treats a rollout_func's log-probs as another engine's
(pi_old recomputed, the mismatch measured and, by default, corrected: docs/multi_turn.md).
"""

from __future__ import annotations

from typing import Any

from rloo.config import ConfigError


class RolloutGeneration:
    """TRL's `trainer.vllm_generation` for a rollout_func: `generate` samples with the run's sampler."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector  # rollout.RolloutCollector: its sampler, the live policy, stop strings

    def generate(self, prompts: list[list[int]], images: Any = None, num_generations: int = 1,
                 profiler: Any = None) -> tuple[list[list[int]], list[list[int]], list[list[list[float]]] | None,
                                                list[list[list[int]]]]:
        """`num_generations` completions of each prompt, as TRL's `VLLMGeneration.generate` returns them.

        Args:
            prompts: token id lists holding each prompt `num_generations` times in a row (as the trainer passes a
                rollout_func its prompts, and as TRL's generate expects them).
            images: not supported here (None).
            num_generations: completions per distinct prompt.
            profiler: ignored (TRL's profiling context).

        Returns:
            (prompt_ids, completion_ids, logprobs, logprob_token_ids), one row per entry of `prompts`: the completion's
            ids up to and including its stop id, and per token `[logprob]` and `[token id]` (TRL's (B, C, 1) shape;
            logprobs None when the sampler gives none).
        """
        if images is not None and any(image is not None for image in images):
            raise ConfigError("trainer.vllm_generation.generate does not take images in rloo; a rollout_func samples "
                              "text prompts (images=None).")
        if num_generations < 1 or len(prompts) % num_generations:
            raise ValueError(f"generate got {len(prompts)} prompts for num_generations={num_generations}: prompts must "
                             f"hold each prompt num_generations times in a row.")
        distinct = [list(prompts[i]) for i in range(0, len(prompts), num_generations)]
        if any(list(prompts[i]) != distinct[i // num_generations] for i in range(len(prompts))):
            raise ValueError("generate takes each prompt num_generations times in a row (rows p*K .. p*K+K-1 equal), "
                             "as the trainer passes them to rollout_func; sample other prompts with num_generations=1.")
        sampled = self.collector.sample_ids(distinct, num_generations)
        lengths = sampled.completion_mask.sum(dim=1).tolist()
        completion_ids = [sampled.completion_ids[row, :n].tolist() for row, n in enumerate(lengths)]
        logprobs = None if sampled.logprobs is None else [
            [[value] for value in sampled.logprobs[row, :n].tolist()] for row, n in enumerate(lengths)]
        prompt_ids = [ids for ids in distinct for _ in range(num_generations)]
        return prompt_ids, completion_ids, logprobs, [[[token] for token in ids] for ids in completion_ids]


def extra_field(key: str, value: Any, count: int) -> list:
    """A rollout_func's extra field as one value per trajectory: a list or tuple of `count` values is taken as it
    is, anything else (a number, a string, a dict, a tensor) is every trajectory's value, as TRL passes it."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"rollout_func returned {len(value)} values for the extra field {key!r} and {count} "
                             f"trajectories; return one value per trajectory (a list of {count}), or a single "
                             f"non-list value for all of them.")
        return list(value)
    return [value] * count


def token_logprobs(row: Any, length: int) -> list[float]:
    """One trajectory's log-probs as a rollout_func returned them: a float per token, or TRL's generate shape (a
    list per token, the sampled token's first); None (no log-probs) gives zeros."""
    if row is None:
        return [0.0] * length
    return [float(value[0]) if isinstance(value, (list, tuple)) else float(value) for value in row]
