"""Completion log-probs that run each prompt once per group, not once per completion.

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
and pi_old when a pass computes it). `shared_prompt_logprobs` is the same computation with grad for
the training forward (`shared_prefix_forward`): the copies of the cache stay in the autograd graph,
so the prompt's gradients add up as the whole-row pass's K copies do. Sliding-window layers share too: the
copied cache keeps every prompt key and the model's attention mask applies the window over them, as in the
whole-row pass (eager and sdpa attention; `MASKED_WINDOW_ATTENTION`). Models whose cache holds no attention
keys (recurrent or linear-attention layers), or whose sliding window a kernel applies, are refused by
`can_share_prompts`, and the caller takes the plain path.

Prompts with images (`vision`, a `data.images.VisionInputs` with one row per completion): the prefill takes
each distinct prompt's vision tensors once (n images for n prompts, not n*K), the image features go into the
prompts' keys and values, and the completions after it are text only, on copies of that cache; with grad,
the vision tower's gradients add up over the copies as over the whole-row pass's K images. Models with 3-D
rotary positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) get the model's own prefill positions (`get_rope_index`)
and each completion token n + rope delta on all three axes (`passes.mrope`), the positions the whole-row pass
gives them; other models with 3-D positions are left to their whole-row pass (`shares_image_prompts`).

Both passes run on a `ReplayableCache`, whose layers return their fixed prefix (nothing for the
prefill, the prompt's keys and values for the completions) followed by the new states however often
they are called. A decoder layer can then be recomputed in backward (gradient checkpointing,
`model_loading.checkpoint_layers`) without a second call growing the cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from rloo.passes import mrope
from rloo.passes.logprobs import (
    cache_argument,
    is_right_padded,
    logprobs_from_states,
    position_ids_from_mask,
    reachable_head,
    run_to_head,
)

if TYPE_CHECKING:
    from rloo.data.images import VisionInputs


class ReplayableLayer(DynamicLayer):
    """A full-attention cache layer whose `update` returns prefix + new states, where the prefix is what the
    layer held at its first update (the prompt's (b, heads, P, D) keys and values, or nothing): called again
    with the same states, as a recomputed decoder layer calls it, it gives the same tensors."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        super().__init__()
        self.prefix = None
        if keys is not None:
            self.lazy_initialization(keys, values)
            self.keys, self.values = keys, values

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.prefix is None:
            self.prefix = (self.keys, self.values)
        self.keys = torch.cat([self.prefix[0], key_states], dim=-2)
        self.values = torch.cat([self.prefix[1], value_states], dim=-2)
        return self.keys, self.values


class ReplayableCache(DynamicCache):
    """A `DynamicCache` of `ReplayableLayer`s: empty ones (`layers` a count) or prefilled ((keys, values) per layer)."""

    def __init__(self, layers: int | list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self.layers = ([ReplayableLayer() for _ in range(layers)] if isinstance(layers, int)
                       else [ReplayableLayer(keys, values) for keys, values in layers])


def grouped_pays(device: torch.device) -> bool:
    """Whether the no-grad passes take the grouped layout on `device`. Not on CUDA (issue #46): the whole rows run
    with no mask (padding moved behind the completions), so SDPA keeps its flash kernel, while the grouped layout
    hands it a mask (no flash kernel, `repeat_kv` copies) and launches many small prefills: on the card that costs
    more than running each prompt K times saves. benchmarks/gpu/gpu_micro.py times both."""
    return torch.device(device).type != "cuda"


def groups_share_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                         vision: VisionInputs | None = None) -> bool:
    """True when the (B, P) rows come in groups of `group_size` consecutive rows with one prompt each (and,
    with `vision`, one prompt's images each: the same ids can carry different images)."""
    if group_size < 1 or prompt_ids.shape[0] % group_size:
        return False
    ids = prompt_ids.view(-1, group_size, prompt_ids.shape[1])  # (N, K, P)
    mask = prompt_mask.view(-1, group_size, prompt_mask.shape[1])
    same_images = vision is None or all(vision.rows[i] == vision.rows[i - i % group_size] for i in range(len(vision.rows)))
    return bool((ids == ids[:, :1]).all()) and bool((mask == mask[:, :1]).all()) and same_images


# Attention implementations that apply a sliding window as the attention mask the model builds from its config
# over every key it is given. The shared prompt's cache keeps every key (`ReplayableLayer`), so on these a
# sliding-window layer masks exactly as in the whole-row pass; a kernel that applies the window itself
# (flash attention) is not verified here.
MASKED_WINDOW_ATTENTION = ("eager", "sdpa")


def _cache_layers(model: torch.nn.Module) -> list | None:
    """The layers of the cache transformers lays out for `model`'s config, or None (no decoder cache)."""
    config = getattr(getattr(model, "module", model), "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return None
    try:
        return DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot lay a cache out for
        return None


def attention_implementation(model: torch.nn.Module) -> str | None:
    """The attention implementation `model`'s language model runs ("sdpa", "eager", "flash_attention_2", ...)."""
    config = getattr(getattr(model, "module", model), "config", None)
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    return getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)


def _share_refusal(model: torch.nn.Module) -> str | None:
    """Why completions cannot run on a copy of their prompt's cache on `model`, or None when they can."""
    layers = _cache_layers(model)
    if layers is None or not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers):
        return ("shared_prefix_forward needs a decoder whose KV cache holds attention keys and values (full or "
                "sliding-window attention layers, not recurrent or linear-attention ones), so that completions can run "
                "on a copy of their prompt's cache; turn shared_prefix_forward off for this model.")
    implementation = attention_implementation(model)
    if any(type(layer) is DynamicSlidingWindowLayer for layer in layers) and implementation not in MASKED_WINDOW_ATTENTION:
        return (f"shared_prefix_forward on a sliding-window model runs with attn_implementation 'sdpa' or 'eager' (the "
                f"window is then the attention mask over the shared prompt's keys), not {implementation!r}; load the "
                f"model with attn_implementation='sdpa' or turn shared_prefix_forward off.")
    return None


def can_share_prompts(model: torch.nn.Module) -> bool:
    """True when `model`'s completions can run on copies of their prompt's cache: every cache layer is full
    attention, or sliding-window attention whose window the attention mask applies (`MASKED_WINDOW_ATTENTION`)."""
    return _share_refusal(model) is None


def shares_image_prompts(model: torch.nn.Module) -> bool:
    """True when prompts with images can run once per group on `model`: its cache can be shared and the
    completions' positions are given here correctly (1-D positions, or a verified 3-D type: `mrope.positions_verified`)."""
    return can_share_prompts(model) and mrope.positions_verified(model)


def check_shared_prompt_model(model: torch.nn.Module) -> None:
    """Refuse, with the fix, a model whose cache `shared_prompt_logprobs` cannot share (shared_prefix_forward)."""
    refusal = _share_refusal(model)
    if refusal is not None:
        raise ValueError(refusal)
    inner = getattr(model, "module", model)
    # Newer transformers renamed is_gradient_checkpointing (which now warns) to is_activation_checkpointing.
    name = "is_activation_checkpointing" if hasattr(type(inner), "is_activation_checkpointing") else "is_gradient_checkpointing"
    if getattr(inner, name, False):
        raise ValueError("shared_prefix_forward needs the KV cache, which transformers turns off under gradient "
                         "checkpointing; call model.gradient_checkpointing_disable() and set gradient_checkpointing=True "
                         "in the config instead (with shared_prefix_forward rloo recomputes the layers itself), or turn "
                         "shared_prefix_forward off.")


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
    vision: VisionInputs | None = None,
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
        vision: the rows' image inputs (one row per completion, groups contiguous), or None; each distinct
            prompt's go to the prefill once (the model must pass `shares_image_prompts`).

    Returns:
        (B, C) fp32 log-probs of the completion tokens (as `completion_logprobs` gives them).
    """
    if not groups_share_prompts(prompt_ids, prompt_mask, group_size, vision):
        raise ValueError(f"rows must come in groups of group_size={group_size} consecutive rows sharing one prompt")
    total, length = completion_ids.shape
    rows_per_pass = rows_per_pass or total
    # Whole groups per prefill: at least one, at most as many as rows_per_pass rows hold.
    rows_per_prefill = max(1, rows_per_pass // group_size) * group_size
    chunks = []
    for start in range(0, total, rows_per_prefill):
        rows = slice(start, start + rows_per_prefill)
        owner = torch.arange(completion_ids[rows].shape[0], device=completion_ids.device) // group_size
        logps, _ = _prompt_once(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                                completion_mask[rows], owner, temperature, rows_per_pass,
                                vision=None if vision is None else vision.slice(start, rows_per_prefill))
        chunks.append(logps)
    return torch.cat(chunks) if chunks else completion_ids.new_zeros(0, length, dtype=torch.float32)


def shared_prompt_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    vision: VisionInputs | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The training forward of a micro-batch with each distinct prompt run once (`shared_prefix_forward`).

    Consecutive rows with the same prompt share one prefill; the completions run on copies of its KV
    cache, which stay in the autograd graph, so the prompt's gradients add up as the whole-row
    pass's copies do: the same log-probs and gradients as `completion_logprobs` on the whole rows.

    Args:
        model: as for `grouped_completion_logprobs`.
        prompt_ids, prompt_mask: (B, P) left-padded prompts; a micro-batch may cut groups.
        completion_ids, completion_mask: (B, C) right-padded completions.
        temperature, with_entropy, entropy_grad: as in `logprobs.completion_logprobs`.
        vision: the rows' image inputs (`Rollout.vision` of the micro-batch), or None: consecutive rows share a
            prefill only when they also share the prompt's images, which then run once.

    Returns:
        (B, C) fp32 log-probs, and (B, C) entropies or None.
    """
    new_prompt = torch.ones(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)  # (B,)
    new_prompt[1:] = ((prompt_ids[1:] != prompt_ids[:-1]) | (prompt_mask[1:] != prompt_mask[:-1])).any(dim=1)
    if vision is not None:  # the same ids (image tokens expanded) can carry another image
        image_rows = torch.tensor(vision.rows, device=prompt_ids.device)
        new_prompt[1:] |= image_rows[1:] != image_rows[:-1]
    owner = new_prompt.long().cumsum(0) - 1  # (B,) index of each row's prompt among the distinct ones
    logps, entropy = _prompt_once(model, prompt_ids, prompt_mask, completion_ids, completion_mask, owner, temperature,
                                  None, with_entropy, vision)
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return logps, entropy


def _prompt_once(model, prompt_ids, prompt_mask, completion_ids, completion_mask, owner, temperature, rows_per_pass,
                 with_entropy=False, vision=None):
    """Rows whose prompts are the distinct prompts `owner` points to: one prefill of those prompts (with
    their images, once each), then the completions in row blocks on copies of their cache. Returns (b, C)
    log-probs, entropies."""
    head = reachable_head(model)
    config = getattr(model, "module", model).config
    first_rows = torch.cat([owner.new_zeros(1), (owner[1:] != owner[:-1]).nonzero().flatten() + 1])  # (n,)
    unique_ids, unique_mask = prompt_ids[first_rows], prompt_mask[first_rows]  # (n, P)
    cache, cache_name = ReplayableCache(len(DynamicCache(config=config).layers)), cache_argument(model)
    images = {} if vision is None else vision.select(first_rows.tolist()).model_kwargs(unique_ids)
    prompt_positions, rope_deltas = mrope.prefill_positions(model, unique_ids, unique_mask, images)
    # Step 1: the n distinct prompts once; the last position predicts the first completion token.
    first = run_to_head(model, head, input_ids=unique_ids, attention_mask=unique_mask,
                        position_ids=prompt_positions, **{cache_name: cache}, use_cache=True,
                        logits_to_keep=1, **images)[:, -1]  # (n, H) or (n, V)
    prompt_kv = [(layer.keys, layer.values) for layer in cache.layers]  # per layer (n, heads, P, D) each
    # A completion's right padding stays unmasked (causal attention keeps real tokens from seeing it):
    # with prompts of one length the mask is then all ones, which transformers applies more cheaply.
    if is_right_padded(completion_mask):
        completion_mask = torch.ones_like(completion_mask)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (b, P + C)
    # The positions the plain pass gives the completion tokens (left padding skipped): (b, C), or with 3-D
    # positions (3, b, C), each its 1-D position + its prompt's rope delta on all three axes.
    positions = position_ids_from_mask(attention_mask)[:, prompt_ids.shape[1]:]
    if rope_deltas is not None:
        positions = mrope.decode_positions(positions, rope_deltas[owner])
    total = completion_ids.shape[0]
    rows_per_pass = rows_per_pass or total
    logps, entropies = [], []
    for start in range(0, total, rows_per_pass):
        rows = torch.arange(start, min(start + rows_per_pass, total), device=prompt_ids.device)
        states = first[owner[rows]].unsqueeze(1)  # (r, 1, H) or (r, 1, V)
        if completion_ids.shape[1] > 1:
            # Step 2: this block's copy of its prompts' cache, then the completion tokens but the
            # last (which predicts nothing) on it.
            block_cache = ReplayableCache([(keys[owner[rows]], values[owner[rows]]) for keys, values in prompt_kv])
            later = run_to_head(model, head, input_ids=completion_ids[rows, :-1],
                                attention_mask=attention_mask[rows, :-1], position_ids=positions[..., rows, :-1],
                                **{cache_name: block_cache}, use_cache=True,
                                logits_to_keep=0)  # (r, C - 1, H) or (r, C - 1, V)
            states = torch.cat([states, later], dim=1)  # (r, C, H) or (r, C, V)
        block_logps, block_entropy = logprobs_from_states(model, head, states, completion_ids[rows],
                                                          temperature, with_entropy, entropy_grad=True)
        logps.append(block_logps)
        entropies.append(block_entropy)
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None
