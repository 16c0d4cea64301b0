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

import functools
import inspect
from typing import Any

import torch

from rloo.algo.lm_head import tiled_head_logprobs

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


def _forward_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int, tiled: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The rows as the forward runs them: (ids, mask, position ids, lead), each (B, P + C) but lead (B,).

    Right padding of the completions is unmasked (see completion_logprobs); on the tiled path each row's
    left padding is moved behind its completion (lead: how many positions it moved), so the mask is all
    ones. Otherwise, or with a mask that has holes, the rows run as given with their mask (lead None)."""
    rows, length = input_ids.shape
    prompt_length = length - completion_length
    if is_right_padded(attention_mask[:, prompt_length:]):
        attention_mask = torch.cat([attention_mask[:, :prompt_length],
                                    torch.ones_like(attention_mask[:, prompt_length:])], dim=1)
    moved = padding_to_the_end(input_ids, attention_mask, completion_length) if tiled else None
    if moved is None:
        return input_ids, attention_mask, position_ids_from_mask(attention_mask), None
    ids, lead = moved
    return ids, torch.ones_like(attention_mask), torch.arange(length, device=ids.device).expand(rows, length), lead


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    router_aux: dict | None = None,
    model_inputs: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and optionally entropies) of the completion tokens of prompt+completion rows.

    Padding costs no mask where it can be avoided. With any zero in the mask transformers builds a
    (B, 1, T, T) mask, which SDPA turns into fp32 and keeps for backward in every layer (2.2 GB per
    layer at 8 rows of 8,208 tokens). The completions' right padding is left unmasked (causal
    attention keeps real tokens from seeing what follows them), and on the tiled path each row's left
    padding is moved behind its completion (`padding_to_the_end`), so the rows run with no mask at
    all. The plain path keeps its left padding masked: moving it would keep more (B, ., V) logits.

    Args:
        model: a causal LM taking input_ids, attention_mask, position_ids and logits_to_keep.
        input_ids: (B, P + C) left-padded prompts followed by right-padded completions.
        attention_mask: (B, P + C) 1 for real tokens.
        completion_length: C, the number of trailing completion positions.
        temperature: logits are divided by it, matching the sampling distribution.
        with_entropy: also return per-token entropies.
        entropy_grad: let the entropies carry grad (for entropy_coef > 0); otherwise they are detached.
        router_aux: a dict to receive a MoE model's router load-balancing loss (`output_router_logits=True`),
            a scalar with grad, under "aux_loss"; None asks for none.
        model_inputs: more keyword arguments of the forward, one entry per row (a VLM's pixel_values, image_sizes,
            token_type_ids: `data.images.VisionInputs.model_kwargs`); the rows then run as given (their per-token
            inputs were derived from this layout), left padding masked; no position ids if `computes_own_positions`.

    Returns:
        (B, C) fp32 log-probs of the completion tokens, and (B, C) entropies or None. Values at
        padded completion positions are meaningless (callers mask them).
    """
    head = reachable_head(model)
    ids, mask, positions, lead = _forward_layout(input_ids, attention_mask, completion_length,
                                                 tiled=head is not None and not model_inputs)
    positions = None if model_inputs and computes_own_positions(model) else positions  # Qwen-VL: the model's own
    max_lead = 0 if lead is None else int(lead.max())
    # The last C + 1 positions hold every completion when nothing moved; moving a row's lead of
    # padding back shifts its completion up to max_lead positions earlier.
    keep = completion_length + 1 + max_lead
    extra = {} if router_aux is None else {"output_router_logits": True}
    states = run_to_head(model, head, router_aux, input_ids=ids, attention_mask=mask, position_ids=positions,
                         logits_to_keep=keep, use_cache=False, **extra, **(model_inputs or {}))  # (B, keep, H) or (B, keep, V)
    if max_lead == 0:
        # Position t predicts token t + 1: the last kept position predicts nothing in the completion.
        states = states[:, :-1]  # (B, C, H|V)
    else:
        # Row b's completion starts lead_b positions earlier; the state predicting its first token sits
        # at kept index max_lead - lead_b.
        index = (max_lead - lead)[:, None] + torch.arange(completion_length, device=ids.device)  # (B, C)
        states = states.gather(1, index[..., None].expand(-1, -1, states.shape[-1]))
    logps, entropy = logprobs_from_states(model, head, states, input_ids[:, -completion_length:], temperature,
                                          with_entropy, entropy_grad)
    return logps, entropy


def computes_own_positions(model: torch.nn.Module) -> bool:
    """Whether the model builds its own 3-D rotary positions from the ids, the image grids and the mask
    (multimodal RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5; their model has `get_rope_index`).

    1-D position ids would be broadcast to all three axes by these models, silently giving every image
    token its sequence index instead of its row and column; with position_ids=None the model computes
    them from `mm_token_type_ids`, `image_grid_thw` and the attention mask (left padding skipped), which
    is what its own forward of each unpadded row uses."""
    return rope_index_owner(model) is not None


def rope_index_owner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module that has `get_rope_index` (the model or its `.model`, through DDP and PEFT wrappers), or None."""
    inner = getattr(model, "module", model)  # DDP / accelerate
    base = inner.get_base_model() if callable(getattr(inner, "get_base_model", None)) else inner  # PEFT
    return next((part for part in (base, getattr(base, "model", None))
                 if callable(getattr(part, "get_rope_index", None))), None)


def is_right_padded(mask: torch.Tensor) -> bool:
    """True when every row of the (B, C) mask is ones followed by zeros (padding only at the right)."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def padding_to_the_end(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int
                       ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows with their left padding moved to the end, so that they need no mask.

    A row [pad pad | p1 p2 | c1 c2 c3] becomes [p1 p2 | c1 c2 c3 | pad pad]: every real token keeps
    the same predecessors and (counting from 0) the same position, and causal attention never lets
    it see the padding behind it.

    Args:
        input_ids: (B, P + C) left-padded prompts followed by completions.
        attention_mask: (B, P + C) zeros only as left padding of the prompts (a completion's right
            padding already unmasked by the caller).
        completion_length: C.

    Returns:
        (B, P + C) moved ids and the (B,) number of left padding positions per row; None when the
        mask has any other zero (then the rows must run with their mask).
    """
    length = input_ids.shape[1]
    prompt_mask = attention_mask[:, : length - completion_length]  # (B, P)
    lead = (prompt_mask.cumsum(dim=1) == 0).sum(dim=1)  # (B,) leading zeros of each prompt
    if not bool((attention_mask.sum(dim=1) + lead == length).all()):
        return None
    if not bool(lead.any()):
        return input_ids, lead
    index = (torch.arange(length, device=input_ids.device) + lead[:, None]) % length  # (B, T)
    return input_ids.gather(1, index), lead


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
    config = head_config(model)
    if getattr(config, "logit_scale", 1.0) not in (None, 1.0) or getattr(config, "logits_scaling", 1.0) not in (None, 1.0):
        return None
    return head


def head_config(model: torch.nn.Module) -> Any:
    """The config that holds the LM head's settings (`final_logit_softcapping`, `logit_scale`): the text config of a
    vision-language model (Gemma 4 keeps its softcap there, not on the top-level config), else the model's config."""
    config = getattr(getattr(model, "module", model), "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    return get_text_config() if callable(get_text_config) else config


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: "cache" where transformers has it (5.24 deprecates
    "past_key_values", to be removed in 5.40), else "past_key_values" (older transformers, remote code)."""
    inner = getattr(model, "module", model)  # DDP / accelerate
    base = inner.get_base_model() if callable(getattr(inner, "get_base_model", None)) else inner  # PEFT
    return _cache_argument(type(base))


@functools.cache
def _cache_argument(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters and "past_key_values" not in parameters else "past_key_values"


def run_to_head(model: torch.nn.Module, head: torch.nn.Linear | None, sink: dict | None = None,
                **inputs) -> torch.Tensor:
    """The model's final hidden states (b, n, H) when `head` is given, its logits (b, n, V) otherwise.

    With a head, a hook hands it an empty (b, 0, H) input, so the model builds no logits. `sink`, when
    given, receives the output's `aux_loss` (a MoE router loss; None when the model computes none)."""
    if head is None:
        out = model(**inputs)
        if sink is not None:
            sink["aux_loss"] = getattr(out, "aux_loss", None)
        return out.logits
    caught = {}

    def catch_hidden(module, args):
        caught["hidden"] = args[0]
        return (args[0][..., :0, :],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(catch_hidden)
    try:
        out = model(**inputs)
    finally:
        handle.remove()
    if sink is not None:
        sink["aux_loss"] = getattr(out, "aux_loss", None)
    return caught["hidden"]


def logprobs_from_states(model: torch.nn.Module, head: torch.nn.Linear | None, states: torch.Tensor,
                         targets: torch.Tensor, temperature: float, with_entropy: bool, entropy_grad: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(b, C, H) hidden states through the tiled head, or (b, C, V) logits when `head` is None ->
    (b, C) fp32 log-probs of `targets`, and entropies when `with_entropy` (detached unless `entropy_grad`)."""
    if head is not None:
        softcap = getattr(head_config(model), "final_logit_softcapping", None)
        logps, entropy = tiled_head_logprobs(states, head.weight, head.bias, targets, temperature, softcap,
                                             with_entropy)
        return logps, entropy if entropy is None or entropy_grad else entropy.detach()
    logits = states / temperature if temperature != 1.0 else states
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            entropy = entropy_from_logits(logits)
    return selective_log_softmax(logits, targets), entropy
