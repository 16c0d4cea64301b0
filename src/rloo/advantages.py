"""Leave-one-out advantages: the baseline of each completion is the mean reward of the others.

For a prompt with K completions and rewards r_1..r_K (Ahmadian et al., 2024, eq. 4):

    A_i = r_i - 1/(K-1) * sum_{j != i} r_j  =  r_i - (sum_j r_j - r_i) / (K - 1)
        = K/(K-1) * (r_i - mean(r))

The baseline excludes the sample itself, so it is independent of it and the policy-gradient
estimate stays unbiased; a mean that includes r_i would shrink every advantage by (K-1)/K.
"""

from __future__ import annotations

import torch


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages of grouped rewards.

    Args:
        rewards: (P, K) rewards, row p holding the K completions of prompt p.

    Returns:
        (P, K) advantages r_i - mean of the other K-1 rewards of the same row.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_prompts, K) with K >= 2, got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)  # (P, K)
    return rewards - baseline
