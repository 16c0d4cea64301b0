"""Reward shaping before the KL and the baseline: penalise unfinished completions, normalise, clip.

Applied to the (B,) scores of one process's rollout, in this order (TRL v0's order for the last two):

    1. s -= missing_eos_penalty          where the completion did not end (no EOS, stop token or string)
    2. s = (s - mean(s)) / (std(s) + 1e-8)   when normalize_rewards (std with B - 1, over the global rollout)
    3. s = clip(s, -c, c) for reward_clip_range=c, or clip(s, low, high) for (low, high)

With one scored sample there is no spread to divide by: normalisation then only centres it (s = 0).
"""

from __future__ import annotations

from typing import Callable

import torch

NORMALIZE_EPS = 1e-8


def shape_scores(
    scores: torch.Tensor,
    ended: torch.Tensor,
    missing_eos_penalty: float | None = None,
    normalize: bool = False,
    clip_range: float | tuple[float, float] | list[float] | None = None,
    valid: torch.Tensor | None = None,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Shaped scores (module docstring for the order).

    Args:
        scores: (B,) weighted reward-function scores.
        ended: (B,) bool, the completion ended with EOS, a stop token or a stop string.
        missing_eos_penalty: subtracted where `ended` is False; None disables.
        normalize: z-score over the B scores.
        clip_range: a float c clips to [-c, c], a pair (low, high) to [low, high]; None disables.
        valid: (B,) bool, the samples some reward function scored; normalisation uses only these,
            and the others keep score 0 (they sit out of the baseline anyway). None: all valid.
        gather: concatenates a tensor over processes (`accelerator.gather`); the mean and std are
            then those of the global batch, applied to this process's scores. None: this batch only.

    Returns:
        (B,) shaped scores (a new tensor; the input is not modified).
    """
    shaped = scores.clone()
    if missing_eos_penalty is not None:
        shaped = shaped - missing_eos_penalty * (~ended.bool()).to(shaped.dtype)
    if normalize:
        valid = torch.ones_like(shaped, dtype=torch.bool) if valid is None else valid.bool()
        all_scores, all_valid = (gather(shaped), gather(valid.to(shaped.dtype)).bool()) if gather else (shaped, valid)
        real = all_scores[all_valid]
        mean = real.mean() if real.numel() > 0 else shaped.new_zeros(())
        # The std of fewer than two samples is undefined (NaN): centre only, no scaling.
        scale = real.std() + NORMALIZE_EPS if real.numel() > 1 else shaped.new_ones(())
        shaped = torch.where(valid, (shaped - mean) / scale, torch.zeros_like(shaped))
    if clip_range is not None:
        low, high = (-clip_range, clip_range) if isinstance(clip_range, (int, float)) else clip_range
        shaped = shaped.clamp(low, high)
    return shaped
