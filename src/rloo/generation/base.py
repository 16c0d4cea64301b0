"""Sampling K completions per prompt, behind a small protocol.

A sampler knows nothing of rewards or losses: it takes token ids of prompts and returns padded
token ids of completions, each prompt's K completions next to each other. The trainer receives a
sampler (`RLOOTrainer(..., sampler=...)`, by default the one `RLOOConfig.sampler` names) and
depends only on `Sampler`, so another backend (vLLM, an engine outside PyTorch) slots in without
touching the algorithm: it needs `sample`, and `on_optimizer_step` if it keeps its own copy of
the weights.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class SampledBatch:
    """Prompts and their sampled completions; row b*K + k is completion k of prompt b."""

    prompt_ids: torch.Tensor  # (B, P) left-padded prompt tokens, B = num_prompts * K
    prompt_mask: torch.Tensor  # (B, P) 1 for real prompt tokens
    completion_ids: torch.Tensor  # (B, C) completion tokens, pad after EOS
    completion_mask: torch.Tensor  # (B, C) 1 up to and including the first EOS
    has_eos: torch.Tensor  # (B,) bool, the completion ended with EOS (False means truncated)
    # (B, C) the sampler's own fp32 log-probs of the completion tokens (0 at padding), or None when
    # the engine does not return them.
    logprobs: torch.Tensor | None = None
    # True when `logprobs` came from the trained model itself, in this process (FastSampler): the
    # trainer may use them as pi_old. False (another engine, e.g. vLLM): the trainer computes its own
    # and measures, and by default corrects, the mismatch (truncated importance sampling).
    logprobs_from_policy: bool = False
    # (B, C) 1 at the model's own tokens, 0 at tokens a tool or environment appended (multi-turn rollouts,
    # `rollout.multi_turn`; TRL's env_mask). None: every completion token is the model's. Tool tokens are
    # attended to (they are in completion_mask) but carry no loss, KL, entropy or length.
    tool_mask: torch.Tensor | None = None
    # The rows' image inputs (`data.images.VisionInputs`, one row per completion), set by the collector; None: text.
    vision: Any = None
    # The LoRA adapter version the engine sampled with (vLLM, vllm_lora_sync="adapters"); None: the weights it holds.
    adapter_version: int | None = None


@dataclass
class SamplingSettings:
    """What every built-in sampler is configured with (`setup.default_sampler` fills it from the config)."""

    pad_token_id: int
    eos_token_ids: list[int]  # a completion ends at the first of these
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus filter; 1 disables
    top_k: int = 0  # 0 disables; None would let `generate` fall back to its generation_config (50)
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one; 0 disables
    # More keyword arguments for the engine (TRL's generation_kwargs): `generate` / GenerationConfig
    # keys for the generate and paged samplers, SamplingParams keys for vLLM; the fast sampler takes none.
    generation_kwargs: dict = field(default_factory=dict)


@runtime_checkable
class Sampler(Protocol):
    """Draws `num_generations` completions for each prompt from `model`.

    A sampler may also have `close()`, which `train()` calls when it ends, before accelerate tears the
    process group down: an engine with process groups of its own (vLLM's) is shut down there, in the
    order it needs. A later `sample` builds the engine again."""

    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int) -> SampledBatch:
        """Token ids of N prompts in, a `SampledBatch` of N * K rows out (groups contiguous).

        A sampler may also take `max_new_tokens=`, the most tokens this one call draws (a multi-turn
        trajectory's remaining budget, `length_limit`); the built-in ones do. One that does not draws its
        own length, and the caller cuts what is over the budget."""
        ...

    def on_optimizer_step(self, model: torch.nn.Module) -> None:
        """Called after every optimizer step: an engine holding its own copy of the weights syncs
        them from `model` here. Samplers that run `model` itself do nothing."""
        ...


def length_limit(sampler: Any, budget: int | None) -> dict[str, int]:
    """The keyword that makes `sampler.sample` draw at most `budget` tokens in one call: {"max_new_tokens": budget}
    when its `sample` takes it and would draw more, else {} (the sampler itself is never changed)."""
    configured = getattr(sampler, "max_new_tokens", None)
    if budget is None or not isinstance(configured, int) or budget >= configured:
        return {}
    parameters = inspect.signature(sampler.sample).parameters.values()
    if any(p.name == "max_new_tokens" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {"max_new_tokens": budget}
    return {}


def left_pad(sequences: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists: returns (N, L) ids and (N, L) attention mask."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


def model_token_mask(completion_mask: torch.Tensor, tool_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, C) 1 at the model's own completion tokens: `completion_mask`, less the positions a tool filled."""
    return completion_mask if tool_mask is None else completion_mask * tool_mask.to(completion_mask.dtype)


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of real completion tokens: everything up to and including the first EOS.

    Args:
        completion_ids: (B, C) sampled tokens.
        eos_ids: token ids that end a completion.

    Returns:
        (B, C) long mask, and (B,) bool whether an EOS was produced.
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # (B, C)
    has_eos = is_eos.any(dim=1)  # (B,)
    length = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, length, dtype=torch.long))
    positions = torch.arange(length, device=completion_ids.device).unsqueeze(0)  # (1, C)
    return (positions <= first_eos.unsqueeze(1)).long(), has_eos


def batch_from_token_lists(prompts: list[list[int]], completions: list[list[int]], logprobs: list[list[float]] | None,
                           num_generations: int, pad_id: int, eos_ids: list[int],
                           device: torch.device | str = "cpu") -> SampledBatch:
    """A `SampledBatch` from an engine's token lists, row p*K + k being completion k of prompt p.

    A completion ends at its first EOS (kept) or at its last token (truncated): a pad id equal to
    EOS is not mistaken for an end.
    """
    if len(completions) != len(prompts) * num_generations:
        raise RuntimeError(f"the engine returned {len(completions)} completions for {len(prompts)} prompts "
                           f"x K={num_generations}.")
    width = max(1, max(len(ids) for ids in completions))
    completion_ids = torch.full((len(completions), width), -1, dtype=torch.long)  # -1: no token
    engine_logps = torch.zeros((len(completions), width), dtype=torch.float32)
    for row, ids in enumerate(completions):
        completion_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        if logprobs is not None:
            engine_logps[row, :len(logprobs[row])] = torch.tensor(logprobs[row], dtype=torch.float32)
    completion_mask, has_eos = completion_mask_from_eos(completion_ids, eos_ids)
    completion_mask = completion_mask * (completion_ids >= 0).long()  # a truncated row ends at its length
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(num_generations)], pad_id, device)
    return SampledBatch(prompt_ids, prompt_mask, completion_ids.to(device), completion_mask.to(device),
                        has_eos.to(device),
                        logprobs=None if logprobs is None else (engine_logps * completion_mask).to(device))
