"""Token log-probs and entropies of completions, computed without materialising more than needed.

Only the logits that predict completion tokens are computed (`logits_to_keep`), and the
log-softmax is taken a block of rows at a time so that a (B, T, V) fp32 copy of the logits never
exists at once.
"""

from __future__ import annotations

import torch


# Rows of logits turned into fp32 together: big enough to amortise per-op overhead on small
# vocabularies, small enough (64 MiB of fp32) that no full (B, T, V) fp32 copy is made on big ones.
CHUNK_ELEMENTS = 1 << 24


def _row_chunks(logits: torch.Tensor):
    """Split (B, T, V) logits into row blocks of at most CHUNK_ELEMENTS elements (at least one row each)."""
    rows_per_chunk = max(1, CHUNK_ELEMENTS // max(1, logits[0].numel()))
    return logits.split(rows_per_chunk, dim=0)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without building the full log-softmax tensor.

    Args:
        logits: (B, T, V) unnormalised scores.
        index: (B, T) token ids whose log-probs are wanted.

    Returns:
        (B, T) fp32 log-probs.
    """
    picked = logits.gather(dim=-1, index=index.unsqueeze(-1)).squeeze(-1).float()  # (B, T)
    # A block of rows at a time bounds the fp32 copy at CHUNK_ELEMENTS instead of B * T * V.
    log_normalizer = torch.cat([torch.logsumexp(chunk.float(), dim=-1) for chunk in _row_chunks(logits)])  # (B, T)
    return picked - log_normalizer


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution at every position, a block of rows at a time.

    It carries grad when grad is enabled (the entropy bonus needs it); callers that only log it
    run it under `torch.no_grad()`.

    Args:
        logits: (B, T, V) unnormalised scores.

    Returns:
        (B, T) fp32 entropies in nats.
    """
    blocks = []
    for chunk in _row_chunks(logits):  # (b, T, V)
        logp = torch.log_softmax(chunk.float(), dim=-1)
        blocks.append(-(logp.exp() * logp).sum(dim=-1))
    return torch.cat(blocks)


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
