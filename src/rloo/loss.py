"""The RLOO policy loss: REINFORCE on the whole completion, with PPO-style ratio clipping.

RLOO treats a completion as a single action (Ahmadian et al., 2024): its log-probability is the
sum of its token log-probs, and the loss of completion i is -A_i * log pi(y_i | x). When a batch is
reused for several optimizer passes (num_iterations > 1) the gradient is taken through the
sequence ratio rho = pi(y|x) / pi_old(y|x), clipped as in PPO:

    loss_i = max(-A_i * rho_i, -A_i * clip(rho_i, 1 - eps, 1 + eps))

With one pass, pi_old is the current policy detached: rho = 1 in value and its gradient equals the
gradient of log pi, so the two forms give the same update without an extra forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLossOutput:
    """Per-sequence loss and the statistics the trainer logs."""

    loss: torch.Tensor  # (B,) per-completion loss, not yet reduced
    ratio: torch.Tensor  # (B,) sequence ratio pi / pi_old, detached
    clipped: torch.Tensor  # (B,) 1.0 where the clipped branch is the one in force, detached


def clipped_sequence_loss(
    seq_logps: torch.Tensor,
    old_seq_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
) -> PolicyLossOutput:
    """PPO-clipped REINFORCE loss on whole completions.

    Args:
        seq_logps: (B,) sum of the completion's token log-probs under the current policy (with grad).
        old_seq_logps: (B,) the same under the policy that generated the batch (no grad).
        advantages: (B,) leave-one-out advantages.
        epsilon: clip range; the ratio is clipped to [1 - epsilon, 1 + epsilon].

    Returns:
        PolicyLossOutput with the (B,) per-completion loss; the caller reduces it with an explicit
        denominator so that gradient accumulation matches one large batch.
    """
    ratio = torch.exp(seq_logps - old_seq_logps.detach())  # (B,)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon)
    loss = torch.maximum(unclipped, clipped)  # (B,)
    return PolicyLossOutput(loss=loss, ratio=ratio.detach(), clipped=(clipped > unclipped).float().detach())
