"""Reward shaping before the KL and the baseline: penalise unfinished completions, normalise, clip.

Applied to the (B,) scores of one process's rollout, in this order (TRL v0's order for the last two):

    1. s -= missing_eos_penalty          where the completion did not end (no EOS, stop token or string)
    2. s = (s - mean(s)) / (std(s) + 1e-8)   when normalize_rewards (std with B - 1, over the rollout)
    3. s = clip(s, -reward_clip_range, reward_clip_range)
"""

from __future__ import annotations

import torch

NORMALIZE_EPS = 1e-8


def shape_scores(
    scores: torch.Tensor,
    ended: torch.Tensor,
    missing_eos_penalty: float | None = None,
    normalize: bool = False,
    clip_range: float | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Shaped scores (module docstring for the order).

    Args:
        scores: (B,) weighted reward-function scores.
        ended: (B,) bool, the completion ended with EOS, a stop token or a stop string.
        missing_eos_penalty: subtracted where `ended` is False; None disables.
        normalize: z-score over the B scores.
        clip_range: clip to [-clip_range, clip_range]; None disables.
        valid: (B,) bool, the samples some reward function scored; normalisation uses only these,
            and the others keep score 0 (they sit out of the baseline anyway). None: all valid.

    Returns:
        (B,) shaped scores (a new tensor; the input is not modified).
    """
    shaped = scores.clone()
    if missing_eos_penalty is not None:
        shaped = shaped - missing_eos_penalty * (~ended.bool()).to(shaped.dtype)
    if normalize:
        valid = torch.ones_like(shaped, dtype=torch.bool) if valid is None else valid.bool()
        real = shaped[valid]
        shaped = torch.where(valid, (shaped - real.mean()) / (real.std() + NORMALIZE_EPS), torch.zeros_like(shaped))
    if clip_range is not None:
        shaped = shaped.clamp(-clip_range, clip_range)
    return shaped
