"""KL between the policy and the frozen reference, estimated from sampled tokens.

With tokens y_t sampled from pi, the k1 estimator of KL(pi || pi_ref) at step t is
log pi(y_t) - log pi_ref(y_t); summed over the completion it estimates the sequence KL
(Schulman, "Approximating KL divergence", 2020). RLOO folds beta times that sum into the reward
before the baseline (Ahmadian et al., 2024, sec. 3): r = score - beta * KL_seq.
"""

from __future__ import annotations

import torch


def token_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k1 estimate of the per-token KL: log pi - log pi_ref.

    Args:
        logps: (B, T) log-probs of the sampled tokens under the policy.
        ref_logps: (B, T) log-probs of the same tokens under the reference.

    Returns:
        (B, T) per-token KL estimates (padding positions are not masked here).
    """
    return logps - ref_logps


def sequence_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the per-token k1 KL over each completion's real tokens.

    Args:
        logps: (B, T) policy log-probs of the sampled tokens.
        ref_logps: (B, T) reference log-probs of the same tokens.
        mask: (B, T) 1 for completion tokens (up to and including EOS), 0 for padding.

    Returns:
        (B,) sequence KL estimates.
    """
    return (token_kl(logps, ref_logps) * mask).sum(dim=-1)


def kl_penalized_reward(scores: torch.Tensor, seq_kl: torch.Tensor, beta: float) -> torch.Tensor:
    """RLOO's reward: the score minus beta times the sequence KL, folded in before the baseline.

    Args:
        scores: (B,) scores from the reward functions / reward model.
        seq_kl: (B,) sequence KL estimates (see `sequence_kl`).
        beta: KL coefficient.

    Returns:
        (B,) rewards r = score - beta * KL_seq.
    """
    return scores - beta * seq_kl
