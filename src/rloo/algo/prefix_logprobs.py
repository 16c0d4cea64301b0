"""No-grad completion log-probs that run each prompt once per group, not once per completion.

A rollout holds N prompts with K completions each (rows p*K .. p*K + K - 1 share prompt p). The
plain pass (`logprobs.completion_logprobs`) runs all N*K rows of [prompt | completion], so every
prompt goes through the model K times. `grouped_completion_logprobs` instead

  1. runs the N distinct prompts once (prefill), keeping their KV cache;
  2. copies each prompt's cache to its K completion rows and runs only the completions on it, with
     the positions the plain pass gives them (left padding skipped);
  3. reduces the hidden states to log-probs through the tiled LM head (`algo.lm_head`) when it can
     reach the head, else from the logits, exactly as the plain pass does.

Attention is causal, so the prompt's keys and values do not depend on what follows them: the result
equals the plain pass's up to floating-point summation order. It is for the no-grad passes (pi_ref,
and pi_old when a pass computes it); the training forward keeps the plain path. Models whose cache
is not a plain full-attention `DynamicCache` (sliding windows, recurrent layers) are refused by
`can_share_prompts`, and the caller takes the plain path.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .lm_head import tiled_head_logprobs
from .logprobs import position_ids_from_mask, reachable_head, selective_log_softmax


def groups_share_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int) -> bool:
    """True when the (B, P) rows come in groups of `group_size` consecutive rows with one prompt each."""
    if group_size < 1 or prompt_ids.shape[0] % group_size:
        return False
    ids = prompt_ids.view(-1, group_size, prompt_ids.shape[1])  # (N, K, P)
    mask = prompt_mask.view(-1, group_size, prompt_mask.shape[1])
    return bool((ids == ids[:, :1]).all()) and bool((mask == mask[:, :1]).all())


def can_share_prompts(model: torch.nn.Module) -> bool:
    """True when `model`'s cache is made of plain full-attention layers (what step 2 copies)."""
    config = getattr(getattr(model, "module", model), "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        cache = DynamicCache(config=config)
    except Exception:  # a config transformers cannot lay a cache out for
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _run(model: torch.nn.Module, head: torch.nn.Linear | None, **inputs) -> torch.Tensor:
    """The model's final hidden states (head reachable; the head itself computes nothing) or logits."""
    if head is None:
        return model(**inputs).logits
    caught = {}

    def catch_hidden(module, args):  # (b, n, H) -> an empty (b, 0, H): no logits are built
        caught["hidden"] = args[0]
        return (args[0][..., :0, :],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(catch_hidden)
    try:
        model(**inputs)
    finally:
        handle.remove()
    return caught["hidden"]


@torch.no_grad()
def grouped_completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    group_size: int,
    temperature: float = 1.0,
    rows_per_pass: int | None = None,
) -> torch.Tensor:
    """No-grad log-probs of the completion tokens, each group's prompt run once.

    Args:
        model: a causal LM taking input_ids, attention_mask, position_ids, past_key_values, logits_to_keep.
        prompt_ids: (B, P) left-padded prompts, B = N * K, rows p*K .. p*K + K - 1 holding the same prompt.
        prompt_mask: (B, P) 1 for real prompt tokens.
        completion_ids: (B, C) right-padded completions.
        completion_mask: (B, C) 1 for real completion tokens.
        group_size: K.
        temperature: logits are divided by it, as in sampling.
        rows_per_pass: completion rows per forward (and K-groups' prompts per prefill, at least one
            group); None runs everything at once.

    Returns:
        (B, C) fp32 log-probs of the completion tokens (as `completion_logprobs` gives them).
    """
    if not groups_share_prompts(prompt_ids, prompt_mask, group_size):
        raise ValueError(f"rows must come in groups of group_size={group_size} consecutive rows sharing one prompt")
    total, length = completion_ids.shape
    rows_per_pass = rows_per_pass or total
    # Whole groups per prefill: at least one, at most as many as rows_per_pass rows hold.
    groups_per_prefill = max(1, rows_per_pass // group_size)
    chunks = []
    for first_group in range(0, total // group_size, groups_per_prefill):
        rows = slice(first_group * group_size, (first_group + groups_per_prefill) * group_size)
        chunks.append(_groups_logprobs(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                                       completion_mask[rows], group_size, temperature, rows_per_pass))
    return torch.cat(chunks) if chunks else completion_ids.new_zeros(0, length, dtype=torch.float32)


def _groups_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size, temperature,
                     rows_per_pass):
    """grouped_completion_logprobs on whole groups: one prefill, then completions in row blocks."""
    head = reachable_head(model)
    config = getattr(model, "module", model).config
    unique_ids, unique_mask = prompt_ids[::group_size], prompt_mask[::group_size]  # (n, P)
    cache = DynamicCache(config=config)
    # Step 1: the n distinct prompts once; the last position predicts the first completion token.
    first = _run(model, head, input_ids=unique_ids, attention_mask=unique_mask,
                 position_ids=position_ids_from_mask(unique_mask), past_key_values=cache, use_cache=True,
                 logits_to_keep=1)[:, -1]  # (n, H) or (n, V)
    prompt_kv = [(layer.keys, layer.values) for layer in cache.layers]  # per layer (n, heads, P, D) each
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (b, P + C)
    # The positions the plain pass gives the completion tokens (left padding skipped).
    positions = position_ids_from_mask(attention_mask)[:, prompt_ids.shape[1]:]  # (b, C)
    blocks = []
    for start in range(0, completion_ids.shape[0], rows_per_pass):
        rows = torch.arange(start, min(start + rows_per_pass, completion_ids.shape[0]), device=prompt_ids.device)
        owner = rows // group_size  # the prompt of each row
        states = first[owner].unsqueeze(1)  # (r, 1, H) or (r, 1, V)
        if completion_ids.shape[1] > 1:
            # Step 2: this block's copy of its prompts' cache, then the completion tokens but the
            # last (which predicts nothing) on it.
            block_cache = DynamicCache(ddp_cache_data=[(keys[owner], values[owner]) for keys, values in prompt_kv])
            later = _run(model, head, input_ids=completion_ids[rows, :-1], attention_mask=attention_mask[rows, :-1],
                         position_ids=positions[rows, :-1], past_key_values=block_cache, use_cache=True,
                         logits_to_keep=0)  # (r, C - 1, H) or (r, C - 1, V)
            states = torch.cat([states, later], dim=1)  # (r, C, H) or (r, C, V)
        blocks.append(_reduce(model, head, states, completion_ids[rows], temperature))
    return torch.cat(blocks)


def _reduce(model, head, states, targets, temperature):
    """(r, C, H) hidden states or (r, C, V) logits -> (r, C) fp32 log-probs of `targets`, as the plain pass."""
    if head is not None:
        config = getattr(getattr(model, "module", model), "config", None)
        softcap = getattr(config, "final_logit_softcapping", None)
        logps, _ = tiled_head_logprobs(states, head.weight, head.bias, targets, temperature, softcap)
        return logps
    logits = states / temperature if temperature != 1.0 else states
    return selective_log_softmax(logits, targets)
