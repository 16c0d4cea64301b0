"""The policy loss: REINFORCE on whole completions (or on tokens), with PPO-style ratio clipping.

RLOO treats a completion as a single action (Ahmadian et al., 2024): its log-probability is the
sum of its token log-probs, and the loss of completion i is -A_i * log pi(y_i | x). When a batch is
reused (num_iterations > 1 or num_mini_batches > 1) the gradient is taken through the sequence ratio
rho = pi(y|x) / pi_old(y|x), clipped as in PPO with an optionally wider upper side (DAPO):

    loss_i = max(-A_i * rho_i, -A_i * clip(rho_i, 1 - epsilon, 1 + epsilon_high))

With one pass, pi_old is the current policy detached: rho = 1 in value and its gradient equals the
gradient of log pi, so the two forms give the same update without an extra forward pass.

The per-token modes (`loss_agg_mode` other than "seq-mean-token-sum", or kl_penalty="token") use the
same formula on each token's ratio rho_t = pi(y_t|.) / pi_old(y_t|.), as GRPO does. `reduce_to_sequences`
and `loss_denominator` then turn per-token terms into one number per optimizer step:

    mode                       numerator of completion i        denominator (whole optimizer step)
    seq-mean-token-sum         sum_t l_it                       completions
    seq-mean-token-mean        sum_t l_it / |y_i|               completions
    seq-mean-token-sum-norm    sum_t l_it / max_completion_length   completions
    token-mean                 sum_t l_it                       completion tokens
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rloo.algo.choices import LOSS_AGG_MODES
from rloo.algo.off_policy import importance_log_ratio


@dataclass
class PolicyLossOutput:
    """Per-sequence (B,) or per-token (B, T) loss and the statistics the trainer logs."""

    loss: torch.Tensor  # (B,) or (B, T) loss, not yet reduced
    ratio: torch.Tensor  # same shape: pi / pi_old, detached
    clipped_low: torch.Tensor  # 1.0 where ratio < 1 - epsilon with A < 0 (the clipped branch is in force)
    clipped_high: torch.Tensor  # 1.0 where ratio > 1 + epsilon_high with A > 0

    @property
    def clipped(self) -> torch.Tensor:
        """1.0 wherever either side of the clip is in force (its gradient is zero)."""
        return torch.maximum(self.clipped_low, self.clipped_high)


def _clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float,
                       epsilon_high: float | None) -> PolicyLossOutput:
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    loss = torch.maximum(unclipped, clipped)
    ratio = ratio.detach()
    return PolicyLossOutput(
        loss=loss,
        ratio=ratio,
        clipped_low=((ratio < 1.0 - epsilon) & (advantages < 0)).float(),
        clipped_high=((ratio > 1.0 + epsilon_high) & (advantages > 0)).float(),
    )


def clipped_sequence_loss(
    seq_logps: torch.Tensor,
    old_seq_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    epsilon_high: float | None = None,
) -> PolicyLossOutput:
    """PPO-clipped REINFORCE loss on whole completions.

    Args:
        seq_logps: (B,) sum of the completion's token log-probs under the current policy (with grad).
        old_seq_logps: (B,) the same under the policy that generated the batch (no grad).
        advantages: (B,) advantages.
        epsilon: lower clip range; the ratio is clipped to [1 - epsilon, 1 + epsilon_high].
        epsilon_high: upper clip range; None means epsilon (symmetric clipping).

    Returns:
        PolicyLossOutput with the (B,) per-completion loss; the caller reduces it with an explicit
        denominator so that gradient accumulation matches one large batch.
    """
    return _clipped_surrogate(seq_logps - old_seq_logps.detach(), advantages, epsilon, epsilon_high)


def clipped_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    epsilon_high: float | None = None,
    mask: torch.Tensor | None = None,
    level: str = "token",
) -> PolicyLossOutput:
    """PPO-clipped loss on every token, with the per-token ratio (GRPO style) or GSPO's sequence ratio.

    Args:
        logps: (B, T) token log-probs under the current policy (with grad).
        old_logps: (B, T) the same under the policy that generated the batch (no grad).
        advantages: (B,) one advantage per completion, broadcast over its tokens, or (B, T) per token.
        epsilon: lower clip range.
        epsilon_high: upper clip range; None means epsilon.
        mask: (B, T) completion tokens; needed for level "sequence" (the mean runs over them).
        level: "token", or "sequence" (every token gets its completion's length-normalised ratio,
            `algo.off_policy.importance_log_ratio`).

    Returns:
        PolicyLossOutput with the (B, T) per-token loss (padding is not masked here).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logps)  # (B, T)
    if level == "token":
        return _clipped_surrogate(logps - old_logps.detach(), advantages, epsilon, epsilon_high)
    if mask is None:
        raise ValueError("clipped_token_loss at the sequence level needs the completion mask")
    return _clipped_surrogate(importance_log_ratio(logps, old_logps, mask, level), advantages, epsilon, epsilon_high)


def reduce_to_sequences(token_values: torch.Tensor, mask: torch.Tensor, mode: str, max_completion_length: int) -> torch.Tensor:
    """Each completion's numerator of the loss under `mode` (module table).

    Args:
        token_values: (B, T) per-token loss terms.
        mask: (B, T) 1 for tokens that count (completion tokens of trained completions).
        mode: one of LOSS_AGG_MODES.
        max_completion_length: the constant of "seq-mean-token-sum-norm" (Dr. GRPO).

    Returns:
        (B,) per-completion numerators, to be summed and divided by `loss_denominator`.
    """
    token_sum = (token_values * mask).sum(dim=1)  # (B,)
    if mode in ("seq-mean-token-sum", "token-mean"):
        return token_sum
    if mode == "seq-mean-token-mean":
        return token_sum / mask.sum(dim=1).clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        return token_sum / max_completion_length
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {LOSS_AGG_MODES}")


def loss_denominator(mode: str, mask: torch.Tensor) -> torch.Tensor:
    """What the summed numerators of one optimizer step are divided by, from that step's rows.

    Args:
        mode: one of LOSS_AGG_MODES.
        mask: (N, T) 1 for tokens that count, for ALL rows of the optimizer step (every micro-batch);
            a completion counts when any of its tokens does.

    Returns:
        A 0-dim float tensor: completion tokens for "token-mean", completions otherwise.
    """
    if mode == "token-mean":
        return mask.sum().float()
    if mode in LOSS_AGG_MODES:
        return (mask.sum(dim=1) > 0).sum().float()
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {LOSS_AGG_MODES}")
