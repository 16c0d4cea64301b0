"""Token log-probs and entropies of completions, computed without materialising more than needed.

Only the logits that predict completion tokens are computed (`logits_to_keep`), and the
log-softmax is taken row by row so that a (B, T, V) fp32 copy of the logits never exists at once.
"""

from __future__ import annotations

import torch


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without building the full log-softmax tensor.

    Args:
        logits: (B, T, V) unnormalised scores.
        index: (B, T) token ids whose log-probs are wanted.

    Returns:
        (B, T) fp32 log-probs.
    """
    picked = logits.gather(dim=-1, index=index.unsqueeze(-1)).squeeze(-1).float()  # (B, T)
    # One row at a time keeps the peak at (T, V) in fp32 instead of (B, T, V).
    log_normalizer = torch.stack([torch.logsumexp(row.float(), dim=-1) for row in logits])  # (B, T)
    return picked - log_normalizer


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution at every position, row by row.

    It carries grad when grad is enabled (the entropy bonus needs it); callers that only log it
    run it under `torch.no_grad()`.

    Args:
        logits: (B, T, V) unnormalised scores.

    Returns:
        (B, T) fp32 entropies in nats.
    """
    rows = []
    for row in logits:  # (T, V)
        row = row.float()
        logp = torch.log_softmax(row, dim=-1)
        rows.append(-(logp.exp() * logp).sum(dim=-1))
    return torch.stack(rows)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses them: (B, T) -> (B, T)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and optionally entropies) of the completion tokens of prompt+completion rows.

    Args:
        model: a causal LM taking input_ids, attention_mask, position_ids and logits_to_keep.
        input_ids: (B, P + C) left-padded prompts followed by right-padded completions.
        attention_mask: (B, P + C) 1 for real tokens.
        completion_length: C, the number of trailing completion positions.
        temperature: logits are divided by it, matching the sampling distribution.
        with_entropy: also return per-token entropies.
        entropy_grad: let the entropies carry grad (for entropy_coef > 0); otherwise they are detached.

    Returns:
        (B, C) fp32 log-probs of the completion tokens, and (B, C) entropies or None.
    """
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=completion_length + 1,
        use_cache=False,
    )
    # Position t predicts token t + 1: the last kept logit predicts nothing in the completion.
    logits = outputs.logits[:, -(completion_length + 1) : -1, :]  # (B, C, V)
    if temperature != 1.0:
        logits = logits / temperature
    logps = selective_log_softmax(logits, input_ids[:, -completion_length:])  # (B, C)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            entropy = entropy_from_logits(logits)
    return logps, entropy
