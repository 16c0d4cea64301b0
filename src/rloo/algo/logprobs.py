"""Token log-probs and entropies of completions, computed without materialising the logits.

The default path (`algo.lm_head`) takes the final hidden states of the completion positions (the
LM head's input, caught by a pre-hook that hands the head an empty slice so it computes nothing)
and pushes them through the head weight a tile of tokens at a time, forward and backward: the
(B, C, V) logits never exist. Models whose head it cannot reach (no `get_output_embeddings()`,
a head that is not a plain `nn.Linear`, e.g. LoRA or `modules_to_save` on lm_head, or a logit
scale after the head) take the plain path: logits of the completion positions only
(`logits_to_keep`), reduced a block of rows at a time.
"""

from __future__ import annotations

import torch

from .lm_head import tiled_head_logprobs

# Plain path only: logits elements turned into fp32 together, counted per whole row of the batch
# (a row is T * V, so one chunk is at least one (T, V) row, however long; the tiled path has no
# such floor). The fp32 copies of every chunk stay alive for backward.
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
    head = reachable_head(model)
    if head is not None:
        return _tiled_completion_logprobs(model, head, input_ids, attention_mask, completion_length, temperature,
                                          with_entropy, entropy_grad)
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


def reachable_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's LM head if the tiled path can compute through it exactly, else None.

    Works through accelerate/DDP (`.module`) and PEFT wrappers, whose attribute lookups reach the
    base model. A head that is not exactly `nn.Linear` (LoRA or modules_to_save on lm_head, a
    quantised head), a head partitioned by DeepSpeed ZeRO-3, or a logit scale applied after the
    head (Cohere's logit_scale, Granite's logits_scaling) sends the model down the plain path.
    """
    inner = getattr(model, "module", model)
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if type(head) is not torch.nn.Linear:
        return None
    # ZeRO-3 partitions parameters and gathers them only inside their module's forward; the tiled
    # path reads the head's weight outside it (where it is empty), so a partitioned head takes the plain path.
    if hasattr(head.weight, "ds_id"):
        return None
    config = getattr(inner, "config", None)
    if getattr(config, "logit_scale", 1.0) not in (None, 1.0) or getattr(config, "logits_scaling", 1.0) not in (None, 1.0):
        return None
    return head


def run_to_head(model: torch.nn.Module, head: torch.nn.Linear | None, **inputs) -> torch.Tensor:
    """The model's final hidden states (b, n, H) when `head` is given, its logits (b, n, V) otherwise.

    With a head, a hook hands it an empty (b, 0, H) input, so the model builds no logits."""
    if head is None:
        return model(**inputs).logits
    caught = {}

    def catch_hidden(module, args):
        caught["hidden"] = args[0]
        return (args[0][..., :0, :],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(catch_hidden)
    try:
        model(**inputs)
    finally:
        handle.remove()
    return caught["hidden"]


def logprobs_from_states(model: torch.nn.Module, head: torch.nn.Linear | None, states: torch.Tensor,
                         targets: torch.Tensor, temperature: float, with_entropy: bool
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(b, C, H) hidden states through the tiled head, or (b, C, V) logits when `head` is None ->
    (b, C) fp32 log-probs of `targets`, and entropies when `with_entropy`."""
    if head is not None:
        config = getattr(getattr(model, "module", model), "config", None)
        softcap = getattr(config, "final_logit_softcapping", None)
        return tiled_head_logprobs(states, head.weight, head.bias, targets, temperature, softcap, with_entropy)
    logits = states / temperature if temperature != 1.0 else states
    return selective_log_softmax(logits, targets), entropy_from_logits(logits) if with_entropy else None


def _tiled_completion_logprobs(model, head, input_ids, attention_mask, completion_length, temperature,
                               with_entropy, entropy_grad):
    """completion_logprobs through `algo.lm_head`: the model runs up to its head, which computes nothing."""
    hidden = run_to_head(model, head, input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids_from_mask(attention_mask),
                         logits_to_keep=completion_length + 1, use_cache=False)  # (B, C + 1, H)
    # Position t predicts token t + 1: the last kept position predicts nothing in the completion.
    logps, entropy = logprobs_from_states(model, head, hidden[:, -(completion_length + 1) : -1, :],
                                          input_ids[:, -completion_length:], temperature, with_entropy)
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return logps, entropy
