"""Truncated importance sampling (TIS): correcting for a sampler that is not exactly the policy.

An engine such as vLLM (or the policy run in another precision) samples from pi_sampler, close to
but not the trained policy pi_old. The policy gradient wants tokens from pi_old, so each token's
loss is weighted by the importance ratio pi_old(y_t|.) / pi_sampler(y_t|.), capped from above so
that a token the sampler found unlikely cannot blow the gradient up (Yao et al., 2025, "Your
efficient RL framework secretly brings you off-policy RL training"; TRL's and verl's `tis`):

    w_t = min(exp(log pi_old_t - log pi_sampler_t), cap)

The weights carry no gradient. The mismatch is logged as the mean and max of |log pi_old_t -
log pi_sampler_t| over completion tokens and the fraction of tokens whose ratio was capped.
"""

from __future__ import annotations

import torch


def truncated_importance_weights(old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """Per-token capped ratios pi_old / pi_sampler.

    Args:
        old_logps: (B, C) log-probs of the sampled tokens under the trained policy at sampling time.
        sampler_logps: (B, C) the sampler's own log-probs of the same tokens.
        mask: (B, C) 1 for completion tokens.
        cap: the upper bound of a weight (>= 1).

    Returns:
        (B, C) detached weights, min(ratio, cap) on completion tokens and 1 at padding.
    """
    log_ratio = (old_logps - sampler_logps).detach().float()
    weights = torch.exp(log_ratio).clamp(max=cap)
    return torch.where(mask.bool(), weights, torch.ones_like(weights))


def mismatch_sums(old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                  cap: float) -> torch.Tensor:
    """(4,) sums one process contributes to the mismatch metrics: [sum |log-ratio|, tokens,
    tokens whose ratio exceeds cap, max |log-ratio|] over completion tokens (B, C inputs)."""
    mask = mask.bool()
    log_ratio = (old_logps - sampler_logps).detach().float()
    absolute = log_ratio.abs()[mask]
    capped = (torch.exp(log_ratio) > cap)[mask]
    largest = absolute.max() if absolute.numel() else absolute.new_zeros(())
    return torch.stack([absolute.sum(), absolute.new_tensor(float(absolute.numel())), capped.float().sum(), largest])


def mismatch_metrics(sums: torch.Tensor) -> dict[str, float]:
    """Metrics from (N, 4) `mismatch_sums` rows gathered over N processes."""
    tokens = sums[:, 1].sum().clamp(min=1.0)
    return {
        "sampler/mean_abs_log_ratio": (sums[:, 0].sum() / tokens).item(),
        "sampler/max_abs_log_ratio": sums[:, 3].max().item(),
        "sampler/frac_capped": (sums[:, 2].sum() / tokens).item(),
    }
