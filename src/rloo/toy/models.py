"""Tiny causal LMs with seeded random weights, built from a `transformers` config (no download)."""

from __future__ import annotations

import torch
import transformers

_CONFIG_CLASSES = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}


def build_tiny_model(
    tokenizer: transformers.PreTrainedTokenizerBase,
    *,
    arch: str = "qwen2",
    hidden_size: int = 192,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 768,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> transformers.PreTrainedModel:
    """A tiny causal LM with random (seeded) float32 weights, sized for `tokenizer`.

    Args:
        tokenizer: gives the vocabulary size and the pad/eos/bos ids.
        arch: "qwen2" (Qwen2Config: biases on q/k/v) or "llama" (LlamaConfig).
        hidden_size: model width; must be divisible by `num_heads`.
        num_layers: number of decoder layers.
        num_heads: attention (query) heads.
        num_kv_heads: key/value heads (grouped-query attention); divides `num_heads`.
        intermediate_size: width of the gated MLP.
        max_position_embeddings: longest sequence the rotary embedding is set up for.
        seed: the weights are a deterministic function of the seed (the global RNG is untouched).

    Returns:
        A model in eval mode with tied input/output embeddings (about 2.2M parameters with the
        defaults and the character tokenizer) whose generation config knows the pad/eos/bos ids.
    """
    if arch not in _CONFIG_CLASSES:
        raise ValueError(f"arch must be one of {sorted(_CONFIG_CLASSES)}, got {arch!r}")
    config = _CONFIG_CLASSES[arch](
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    # A forked RNG makes the weights depend on `seed` alone, without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    set_generation_ids(model, tokenizer)
    return model.eval()


def set_generation_ids(model: transformers.PreTrainedModel, tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    """Give the generation config the tokenizer's special ids, so `generate` needs no hints."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
