"""KL between the policy and the frozen reference, estimated from sampled tokens, and where it goes.

With tokens y_t sampled from pi and log r_t = log pi(y_t) - log pi_ref(y_t), three per-token
estimators of KL(pi || pi_ref) (Schulman, "Approximating KL divergence", 2020):

    k1 = log r_t                                   unbiased, can be negative (the default, as in the paper)
    k2 = 0.5 * (log r_t)^2                          biased, >= 0, low variance
    k3 = (1/r_t - 1) + log r_t                      unbiased, >= 0, low variance (GRPO's "approx KL")
         i.e. (ratio_ref - 1) - log ratio_ref with ratio_ref = pi_ref / pi

Where the KL goes is `kl_penalty`:
  * "sequence" (default, the paper): r = score - beta * sum_t kl_t, folded in before the baseline.
  * "token": the same penalty, but each token is credited only with the KL at and after it (its
    reward-to-go): A_{i,t} = A_i + beta * sum_{s<t} kl_{i,s}  (see `token_kl_advantages`).
  * "loss": no penalty in the reward; beta * kl_t (with grad) is added to the per-token loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rloo.algo.choices import KL_ESTIMATORS, KL_PENALTIES


@dataclass(frozen=True)
class KLPlacement:
    """Where the KL to the reference acts in a run: the one place `kl_penalty` is read."""

    in_reward: bool  # r = score - beta * seq_kl before the baseline ("sequence", "token")
    token_advantages: bool  # each token's advantage carries its KL reward-to-go ("token", beta > 0)
    keeps_ref_logps: bool  # the rollout keeps pi_ref's log-probs for the loss ("loss")
    in_loss: bool  # beta * kl_t, with grad, added to the per-token loss ("loss", beta > 0)


def kl_placement(kl_penalty: str, beta: float) -> KLPlacement:
    """Decide, from `kl_penalty` and `beta`, which of the loop's steps apply the KL penalty."""
    if kl_penalty not in KL_PENALTIES:
        raise ValueError(f"kl_penalty must be one of {KL_PENALTIES}, got {kl_penalty!r}")
    in_loss_mode = kl_penalty == "loss"
    return KLPlacement(in_reward=not in_loss_mode, token_advantages=kl_penalty == "token" and beta > 0,
                       keeps_ref_logps=in_loss_mode, in_loss=in_loss_mode and beta > 0)


def token_kl(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) at the sampled tokens.

    Args:
        logps: (B, T) log-probs of the sampled tokens under the policy (may carry grad).
        ref_logps: (B, T) log-probs of the same tokens under the reference.
        estimator: "k1", "k2" or "k3" (module docstring).

    Returns:
        (B, T) per-token KL estimates (padding positions are not masked here).
    """
    log_ratio = logps - ref_logps  # (B, T) log pi - log pi_ref
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio  # (pi_ref/pi - 1) - log(pi_ref/pi)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def sequence_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Sum of the per-token KL over each completion's real tokens.

    Args:
        logps: (B, T) policy log-probs of the sampled tokens.
        ref_logps: (B, T) reference log-probs of the same tokens.
        mask: (B, T) 1 for completion tokens (up to and including EOS), 0 for padding.
        estimator: "k1", "k2" or "k3".

    Returns:
        (B,) sequence KL estimates.
    """
    return (token_kl(logps, ref_logps, estimator) * mask).sum(dim=-1)


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


def token_kl_advantages(
    advantages: torch.Tensor,
    token_kls: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-token advantages for kl_penalty="token": each token's return is its KL reward-to-go.

    With a per-token reward -beta * kl_t and the score at the last token, the return from token t is
    G_{i,t} = score_i - beta * sum_{s>=t} kl_{i,s} = r_i + beta * sum_{s<t} kl_{i,s}. The KL before t
    does not depend on token t, so dropping it keeps the gradient unbiased and lowers its variance;
    the baseline stays that of the sequence reward r_i, so at t = 0 the advantage is A_i.

    Args:
        advantages: (B,) sequence advantages of r = score - beta * KL_seq (any estimator).
        token_kls: (B, T) per-token KL estimates.
        mask: (B, T) 1 for completion tokens.
        beta: KL coefficient.

    Returns:
        (B, T) advantages A_{i,t} = A_i + beta * sum_{s<t} kl_{i,s}, 0 on padding. The correction is in
        reward units, so the config allows "token" only with estimators that do not rescale rewards.
    """
    masked = token_kls * mask
    kl_before = masked.cumsum(dim=1) - masked  # (B, T) exclusive prefix sum: sum_{s<t} kl_s
    return (advantages.unsqueeze(-1) + beta * kl_before) * mask
