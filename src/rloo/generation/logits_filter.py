"""The sampling distribution's filters (temperature, top-k, top-p, min-p), as transformers' logits processors apply them."""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> torch.Tensor:
    """Scores whose softmax is the sampling distribution: filtered-out tokens get -inf.

    Same order and tie rules as transformers' logits processors (temperature, top-k, top-p, min-p);
    at least one token always survives.

    Args:
        logits: (B, V) next-token scores.
        temperature: divides the logits; must be > 0.
        top_k: keep the k highest scores (ties with the k-th kept too); 0 disables.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 disables.
        min_p: keep the tokens whose probability (after the filters above) is at least min_p times
            the most likely token's; 0 disables.

    Returns:
        (B, V) fp32 scores.
    """
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    if 0 < top_k < scores.shape[-1]:
        kth_best = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        # A token goes when the mass of the tokens at or below it (ascending) is <= 1 - top_p.
        removed_sorted = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        removed_sorted[:, -1] = False  # the most likely token always stays
        removed = removed_sorted.scatter(1, order, removed_sorted)
        scores = scores.masked_fill(removed, float("-inf"))
    if min_p > 0.0:
        probs = scores.softmax(dim=-1)  # (B, V)
        removed = probs < min_p * probs.amax(dim=-1, keepdim=True)  # the most likely token never goes
        scores = scores.masked_fill(removed, float("-inf"))
    return scores
