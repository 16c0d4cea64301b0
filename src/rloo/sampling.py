"""Sampling K completions per prompt, behind a small protocol.

A sampler knows nothing of rewards or losses: it takes token ids of prompts and returns padded
token ids of completions, each prompt's K completions next to each other. The trainer depends
only on `Sampler`, so another backend (a lean decode loop, vLLM) slots in without touching the
algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class SampledBatch:
    """Prompts and their sampled completions; row b*K + k is completion k of prompt b."""

    prompt_ids: torch.Tensor  # (B, P) left-padded prompt tokens, B = num_prompts * K
    prompt_mask: torch.Tensor  # (B, P) 1 for real prompt tokens
    completion_ids: torch.Tensor  # (B, C) completion tokens, pad after EOS
    completion_mask: torch.Tensor  # (B, C) 1 up to and including the first EOS
    has_eos: torch.Tensor  # (B,) bool, the completion ended with EOS (False means truncated)


class Sampler(Protocol):
    """Draws `num_generations` completions for each prompt from `model`."""

    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int) -> SampledBatch: ...


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


@dataclass
class GenerateSampler:
    """Sampling with Hugging Face `generate`: simple and general, the reference for faster backends."""

    pad_token_id: int
    eos_token_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int) -> SampledBatch:
        device = next(model.parameters()).device
        repeated = [p for p in prompts for _ in range(num_generations)]  # groups stay contiguous
        prompt_ids, prompt_mask = left_pad(repeated, self.pad_token_id, device)
        was_training = model.training
        model.eval()
        output = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,  # 0 disables; None would fall back to generation_config (50)
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
        )
        model.train(was_training)
        completion_ids = output[:, prompt_ids.shape[1]:]  # (B, C), C <= max_new_tokens
        completion_mask, has_eos = completion_mask_from_eos(completion_ids, self.eos_token_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.pad_token_id)
        return SampledBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, has_eos)
