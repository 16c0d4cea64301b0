"""Which groups teach something: DAPO's dynamic sampling, for RLOO.

A group whose K rewards are all equal has a leave-one-out baseline equal to every reward, so every
completion's advantage is 0 and its generation and backward pass are spent for nothing. With
dynamic sampling the trainer keeps only informative groups (rewards not all equal among the scored
completions) and samples more prompts to refill the rollout; without it such groups stay in and
count in the loss denominator like any other (their numerator is 0).
"""

from __future__ import annotations

import torch


def informative_groups(rewards: torch.Tensor, valid: torch.Tensor | None = None, atol: float = 0.0) -> torch.Tensor:
    """(P,) bool: True for groups with at least two scored completions whose rewards are not all equal.

    Args:
        rewards: (P, K) rewards, row p holding the K completions of prompt p.
        valid: (P, K) bool, True where the reward is real; None means all valid. Unscored entries
            are ignored (a NaN placeholder among them does not count as a difference).
        atol: rewards within atol of each other count as equal.

    Returns:
        (P,) bool.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_prompts, K), got shape {tuple(rewards.shape)}")
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    highest = torch.where(valid, rewards, torch.full_like(rewards, -torch.inf)).max(dim=1).values  # (P,)
    lowest = torch.where(valid, rewards, torch.full_like(rewards, torch.inf)).min(dim=1).values  # (P,)
    return (valid.sum(dim=1) >= 2) & (highest - lowest > atol)


def keep_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """(P,) bool per group -> (P * group_size,) row indices of the kept groups, in order."""
    return torch.nonzero(groups.repeat_interleave(group_size), as_tuple=False).flatten()
