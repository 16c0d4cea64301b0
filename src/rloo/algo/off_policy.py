"""The off-policy toolkit: importance ratios at the token or the sequence level, masking of sequences
that drifted too far from the policy that sampled them, and the sampler's top-k/top-p truncation.

Notation: pi is the policy being trained (with grad), pi_old the policy at sampling time (detached),
pi_s the distribution the sampler actually drew from (another engine, or pi_old after top-k/top-p).
For completion i with tokens t = 1..|y_i| (|y_i| counts its mask):

* token level (PPO, GRPO):     log rho_it = log pi(y_t) - log pi_old(y_t)
* sequence level (GSPO, Zheng et al., 2025, eq. 7: the length-normalised sequence ratio)
                               log s_i = (1/|y_i|) * sum_t (log pi(y_t) - log pi_old(y_t))
  Every token of completion i gets s_i, so its clip decides for the whole completion at once.
* off-policy sequence masking (DeepSeek-V3.2, eq. 9): completion i is dropped from the loss when
  A_i < 0 and (1/|y_i|) * sum_t (log pi_s(y_t) - log pi(y_t)) > delta: a negative sample the current
  policy has moved away from teaches little and destabilises.
* the ratio band (masked importance sampling): the sampler correction w = pi_old / pi_s, per token
  or per sequence (sum of token log-ratios), either truncated to [low, high] or set to 0 outside it.
* truncation: a sampler with top-k / top-p draws from pi restricted to a kept set S and renormalised,
  q(y) = pi(y) / pi(S) on S. Its log-prob is log pi(y) - log pi(S); a ratio against the unfiltered
  pi is off by the kept mass pi(S) (TRL issue 6789). `kept_log_mass` returns log pi(S) per position.
"""

from __future__ import annotations

import math

import torch

from rloo.algo.choices import IMPORTANCE_SAMPLING_LEVELS, SAMPLER_CORRECTION_MODES


def masked_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) values, (B, T) mask -> (B,) mean over each row's masked positions (0 for an empty row)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def importance_log_ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor,
                         level: str = "token") -> torch.Tensor:
    """Per-token log importance ratios at the token or the sequence (GSPO) level.

    Args:
        logps: (B, T) token log-probs under the policy being trained (with grad).
        old_logps: (B, T) the same under pi_old (detached here).
        mask: (B, T) 1 for completion tokens.
        level: "token" (log pi_t - log pi_old_t) or "sequence" (every token of a row gets the row's
            length-normalised mean of those, GSPO's log s_i, whose gradient reaches every token / |y_i|).

    Returns:
        (B, T) log-ratios; at padding the token level keeps its (meaningless) values, the sequence
        level the row's value. Callers mask.
    """
    token = logps - old_logps.detach()  # (B, T)
    if level == "token":
        return token
    if level == "sequence":
        return masked_sequence_mean(token, mask).unsqueeze(-1).expand_as(token)  # (B, T)
    raise ValueError(f"unknown importance_sampling_level {level!r}; choose one of {IMPORTANCE_SAMPLING_LEVELS}")


def off_policy_sequence_mask(advantages: torch.Tensor, logps: torch.Tensor, sampler_logps: torch.Tensor,
                             mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask: 0 for completions with a negative advantage whose mean
    per-token KL estimate from the sampler to the current policy exceeds `threshold`, else 1.

    Args:
        advantages: (B,) completion advantages.
        logps: (B, T) current policy log-probs (detached here: the mask carries no gradient).
        sampler_logps: (B, T) log-probs of the policy that sampled (pi_old, or the engine's own).
        mask: (B, T) 1 for completion tokens.
        threshold: delta > 0.

    Returns:
        (B,) float mask, 1 = keep.
    """
    drift = masked_sequence_mean(sampler_logps.float() - logps.detach().float(), mask)  # (B,)
    return ((advantages >= 0) | (drift <= threshold)).float()


def sampler_correction_weights(old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                               mode: str, low: float | None, high: float | None) -> torch.Tensor:
    """Importance weights w = pi_old / pi_s for a sampler that is not exactly pi_old, kept in a band.

    Args:
        old_logps: (B, T) log pi_old of the sampled tokens.
        sampler_logps: (B, T) the sampler's log-probs of the same tokens.
        mask: (B, T) 1 for completion tokens.
        mode: "token_truncate" (each token's ratio clamped to [low, high]), "token_mask" (a token's
            weight is 0 outside the band, its ratio inside), "sequence_truncate" / "sequence_mask" (the
            same on the sequence ratio exp(sum_t log-ratio_t), one weight for every token of the row).
        low, high: the band; None leaves that side open.

    Returns:
        (B, T) detached weights, 1 at padding.
    """
    if mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"unknown sampler correction mode {mode!r}; choose one of {SAMPLER_CORRECTION_MODES}")
    mask = mask.bool()
    log_ratio = torch.where(mask, (old_logps - sampler_logps).detach().float(), torch.zeros_like(old_logps.float()))
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)  # (B, T), the row's sum everywhere
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        weights = ratio.clamp(min=low, max=high)
    else:
        outside = (ratio < (-math.inf if low is None else low)) | (ratio > (math.inf if high is None else high))
        weights = ratio.masked_fill(outside, 0.0)
    return torch.where(mask, weights, torch.ones_like(weights))


def sampling_keep_mask(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The tokens a top-k / top-p sampler can draw: (..., V) scores (logits / temperature) -> (..., V) bool.

    Same order and tie rules as transformers' logits processors: top-k first (ties with the k-th
    kept), then top-p on what is left (the smallest most-likely set whose mass reaches top_p); the
    most likely token always stays.
    """
    keep = torch.ones_like(scores, dtype=torch.bool)
    if 0 < top_k < scores.shape[-1]:
        kth_best = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # (..., 1)
        keep = scores >= kth_best
    if top_p < 1.0:
        masked = scores.masked_fill(~keep, float("-inf"))
        sorted_scores, order = torch.sort(masked, dim=-1, descending=False)
        # A token goes when the mass of the tokens at or below it (ascending) is <= 1 - top_p.
        removed_sorted = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        removed_sorted[..., -1] = False
        keep = keep & ~removed_sorted.scatter(-1, order, removed_sorted)
    return keep


def kept_log_mass(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """log pi(S): the log of the probability the unfiltered softmax puts on the sampler's kept set.

    Args:
        scores: (..., V) logits / temperature (with grad if the correction should carry it).
        top_k, top_p: the sampler's filter (see `sampling_keep_mask`).

    Returns:
        (...) log masses <= 0; exactly 0 with no filter. The truncated sampler's log-prob of a kept
        token y is log_softmax(scores)[y] - kept_log_mass(scores).
    """
    scores = scores.float()
    keep = sampling_keep_mask(scores.detach(), top_k, top_p)
    kept = torch.logsumexp(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return kept - torch.logsumexp(scores, dim=-1)


def truncated_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0) -> torch.Tensor:
    """Log-probs of `targets` under the distribution a top-k / top-p sampler draws from.

    Args:
        logits: (B, T, V) raw logits.
        targets: (B, T) token ids.
        temperature: logits are divided by it first.
        top_k, top_p: the sampler's filter.

    Returns:
        (B, T) fp32 log-probs renormalised over the kept set; -inf for a target outside it.
    """
    scores = logits.float() / temperature
    keep = sampling_keep_mask(scores.detach(), top_k, top_p)
    filtered = torch.log_softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return filtered.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
