"""The fast sampler's 16-bit copy of the weights and the KV cache's size (issue #46).

Under 16-bit autocast on CUDA, `FastSampler` decodes with a copy of the policy whose parameters are 16-bit
(`half_copy`), refreshed in place after each optimizer step, instead of autocast's casts on every call. The
norm weights are 16-bit too, so the keys are: Qwen3's fp32 k-norm weight made the cached keys fp32 under autocast.
Buffers keep their type (rotary inv_freq in bf16 would move every position).
"""

from __future__ import annotations

import copy

import torch


def copyable(model: torch.nn.Module) -> bool:
    """Whether a plain 16-bit copy of `model` decodes as it does: one device, no adapters, no sharded weights."""
    if hasattr(model, "peft_config") or getattr(model, "is_loaded_in_8bit", False) or getattr(
            model, "is_loaded_in_4bit", False):
        return False
    devices = {p.device for p in model.parameters()}
    return len(devices) == 1 and all(type(p.data) is torch.Tensor for p in model.parameters())


def half_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of `model` with its parameters in `dtype` (norm weights included, so the KV cache is `dtype`
    too; buffers such as the rotary inv_freq keep theirs: in bf16 they would move positions), in eval mode,
    on the class's own forward (not a forward an accelerator wrapped on the instance)."""
    grads = {p: p.grad for p in model.parameters()}
    for p in grads:
        p.grad = None  # not copied
    try:
        weights = copy.deepcopy(model)
    finally:
        for p, grad in grads.items():
            p.grad = grad
    weights.__dict__.pop("forward", None)
    for parameter in weights.parameters():  # parameters only: buffers such as rotary inv_freq stay fp32
        parameter.data = parameter.data.to(dtype)
    return weights.requires_grad_(False).eval()


def autocast_would_cast(model: torch.nn.Module) -> bool:
    """Whether autocast is on and `model` has weights it would cast (a graph would capture autocast's cached
    casts): the 16-bit copy has none."""
    device = next(model.parameters()).device.type
    return torch.is_autocast_enabled(device) and any(p.dtype == torch.float32 for p in model.parameters())


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of keys and values one cached token takes across the layers (0 when the config does not say)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_key_value_heads", None)
    heads = heads or getattr(config, "num_attention_heads", None)
    width = getattr(config, "head_dim", None) or (config.hidden_size // config.num_attention_heads
                                                  if getattr(config, "num_attention_heads", None) else None)
    if not (layers and heads and width):
        return 0
    element = next(model.parameters()).element_size()
    return 2 * layers * heads * width * element


def rows_fitting_memory(model: torch.nn.Module, tokens_per_row: int, k: int, share: float) -> int | None:
    """Rows (a multiple of k, at least k) whose KV cache of `tokens_per_row` fits `share` of the free CUDA memory
    (the driver's free memory plus what PyTorch holds unallocated); None off CUDA or when the config does not say."""
    device = next(model.parameters()).device
    per_row = kv_bytes_per_token(model) * tokens_per_row
    if device.type != "cuda" or not per_row:
        return None
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(k, int(share * free // per_row) // k * k)
