"""Leave-one-out advantages: the baseline of each completion is the mean reward of the others.

For a prompt with K completions and rewards r_1..r_K (Ahmadian et al., 2024, eq. 4):

    A_i = r_i - 1/(K-1) * sum_{j != i} r_j  =  r_i - (sum_j r_j - r_i) / (K - 1)
        = K/(K-1) * (r_i - mean(r))

The baseline excludes the sample itself, so it is independent of it and the policy-gradient
estimate stays unbiased; a mean that includes r_i would shrink every advantage by (K-1)/K.

With a `valid` mask (completions that no reward function scored are invalid), the baseline of a
valid completion is the mean of the *other valid* completions of its group; invalid completions,
and a valid completion with no other valid one in its group, get advantage 0.
"""

from __future__ import annotations

import torch


def leave_one_out_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out advantages of grouped rewards.

    Args:
        rewards: (P, K) rewards, row p holding the K completions of prompt p.
        valid: optional (P, K) bool mask; False marks a completion that takes no part (its
            reward is ignored, whatever it holds).

    Returns:
        (P, K) advantages r_i - mean of the other K-1 rewards of the same row; with `valid`,
        r_i - mean of the other valid rewards of the row, and 0 where there is no such mean or
        the completion itself is invalid.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_prompts, K) with K >= 2, got shape {tuple(rewards.shape)}")
    if valid is None:
        k = rewards.shape[1]
        baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)  # (P, K)
        return rewards - baseline
    if valid.shape != rewards.shape:
        raise ValueError(f"valid must have the shape of rewards {tuple(rewards.shape)}, got {tuple(valid.shape)}")
    weights = valid.to(rewards.dtype)
    masked = torch.where(valid, rewards, torch.zeros_like(rewards))  # an invalid reward may be NaN
    others = weights.sum(dim=1, keepdim=True) - weights  # (P, K) valid completions besides i
    baseline = (masked.sum(dim=1, keepdim=True) - masked) / others.clamp(min=1)
    return torch.where(valid & (others > 0), masked - baseline, torch.zeros_like(rewards))
