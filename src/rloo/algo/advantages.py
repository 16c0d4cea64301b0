"""Advantage estimators: how a completion's reward is turned into the weight on its log-prob.

Rewards arrive grouped, (P, K): row p holds the K completions of prompt p. The default is RLOO's
leave-one-out baseline (Ahmadian et al., 2024, eq. 4):

    A_i = r_i - 1/(K-1) * sum_{j != i} r_j  =  K/(K-1) * (r_i - mean(r))

The baseline excludes the sample itself, so it is independent of it and the policy-gradient
estimate stays unbiased; a mean that includes r_i (``drgrpo``) shrinks every advantage by (K-1)/K.

Every estimator takes an optional ``valid`` (P, K) bool mask. Invalid samples (no reward function
scored them) get advantage 0 and are left out of every baseline and statistic: the leave-one-out
baseline of a valid sample is the mean of the *other valid* samples of its group, and a valid sample
with no other valid sample in its group gets advantage 0 (there is nothing to compare it with).

    estimator      advantage of sample i of group p                         baseline uses
    rloo           r_i - mean_{j != i} r_j                                  other samples
    grpo           (r_i - mean_p) / (std_p + 1e-4)                          whole group, std with K-1
    drgrpo         r_i - mean_p                                             whole group (incl. i)
    reinforce      r_i                                                      nothing
    reinforce_pp   c_i = r_i - mean_p, then (c_i - mean(c)) / (std(c) + 1e-8) over the batch
                   (population std, over the valid samples of groups with at least two)
"""

from __future__ import annotations

from typing import Callable

import torch

from rloo.algo.choices import ADVANTAGE_ESTIMATORS

# Estimators that compare a sample with its group, so that a group of one carries no signal.
GROUP_ESTIMATORS = ("rloo", "grpo", "drgrpo", "reinforce_pp")
GRPO_STD_EPS = 1e-4  # TRL's GRPO epsilon
WHITEN_EPS = 1e-8


def _check(rewards: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, K) rewards with invalid entries zeroed (so that a NaN placeholder cannot leak) and (P, K) bool mask."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_prompts, K), got shape {tuple(rewards.shape)}")
    if valid is None:
        return rewards, torch.ones_like(rewards, dtype=torch.bool)
    if valid.shape != rewards.shape:
        raise ValueError(f"valid must have the shape of rewards {tuple(rewards.shape)}, got {tuple(valid.shape)}")
    valid = valid.bool()
    return torch.where(valid, rewards, torch.zeros_like(rewards)), valid


def _group_mean(rewards: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, 1) mean of the valid rewards of each group and (P, 1) count of valid samples."""
    count = valid.sum(dim=1, keepdim=True).to(rewards.dtype)  # (P, 1)
    total = (rewards * valid).sum(dim=1, keepdim=True)  # (P, 1)
    return total / count.clamp(min=1), count


def whiten(values: torch.Tensor, valid: torch.Tensor | None = None,
           gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(x - mean) / (std + 1e-8) over the valid entries of any-shaped `values`; invalid entries -> 0.

    The std is the population one (divides by n), as in OpenRLHF's masked whitening. With `gather`
    (`accelerator.gather`: concatenates a tensor over processes) the mean and std are those of the
    global batch, as TRL v1 whitens; each process keeps its own entries, whitened by them.
    """
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
    values = torch.where(valid, values, torch.zeros_like(values))
    weights = valid.to(values.dtype)
    all_values, all_weights = (gather(values), gather(weights)) if gather else (values, weights)
    n = all_weights.sum().clamp(min=1)
    mean = (all_values * all_weights).sum() / n
    std = ((((all_values - mean) * all_weights) ** 2).sum() / n).sqrt()
    return torch.where(valid, (values - mean) / (std + WHITEN_EPS), torch.zeros_like(values))


def masked_leave_one_out_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out advantages over the valid samples of each group.

    Args:
        rewards: (P, K) rewards (values at invalid positions are ignored).
        valid: (P, K) bool, True where the reward is real; None means all valid.

    Returns:
        (P, K) advantages r_i - mean of the other valid rewards of the group; 0 where the sample is
        invalid or is the only valid sample of its group.
    """
    rewards, valid = _check(rewards, valid)
    count = valid.sum(dim=1, keepdim=True)  # (P, 1)
    others = (count - 1).clamp(min=1).to(rewards.dtype)  # (P, 1) other valid samples of each valid sample
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / others  # (P, K)
    has_others = valid & (count >= 2)
    return torch.where(has_others, rewards - baseline, torch.zeros_like(rewards))


def leave_one_out_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out advantages of grouped rewards.

    Args:
        rewards: (P, K) rewards, row p holding the K completions of prompt p.
        valid: optional (P, K) bool mask of scored samples (see `masked_leave_one_out_advantages`).

    Returns:
        (P, K) advantages r_i - mean of the other (valid) rewards of the same row.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_prompts, K) with K >= 2, got shape {tuple(rewards.shape)}")
    return masked_leave_one_out_advantages(rewards, valid)


def compute_advantages(rewards: torch.Tensor, estimator: str = "rloo", valid: torch.Tensor | None = None,
                       gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Advantages of grouped rewards under one of `ADVANTAGE_ESTIMATORS` (see the module table).

    Args:
        rewards: (P, K) rewards, row p holding the K completions of prompt p.
        estimator: "rloo", "grpo", "drgrpo", "reinforce" or "reinforce_pp".
        valid: (P, K) bool, True where the reward is real; None means all valid. Invalid samples get
            advantage 0 and are left out of every mean and std.
        gather: for reinforce_pp, whiten over the global batch (see `whiten`).

    Returns:
        (P, K) advantages.
    """
    rewards, valid = _check(rewards, valid)
    zeros = torch.zeros_like(rewards)
    if estimator == "rloo":
        return masked_leave_one_out_advantages(rewards, valid)
    if estimator == "reinforce":
        return torch.where(valid, rewards, zeros)
    mean, count = _group_mean(rewards, valid)  # (P, 1), (P, 1)
    centered = torch.where(valid, rewards - mean, zeros)  # (P, K)
    if estimator == "drgrpo":
        return centered
    if estimator == "grpo":
        std = ((centered ** 2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()  # (P, 1), unbiased
        return torch.where(valid & (count >= 2), centered / (std + GRPO_STD_EPS), zeros)
    if estimator == "reinforce_pp":
        return whiten(centered, valid & (count >= 2), gather)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ADVANTAGE_ESTIMATORS}")
