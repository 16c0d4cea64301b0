"""Multimodal rotary positions (mrope) for the fast sampler's hand-written decode loop.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5 give each token a (time, row, column) position: text tokens have the
same number on the three axes, an image's tokens their place in the image's grid. The model builds a
prompt's positions itself (`get_rope_index`, from the ids, the per-token `mm_token_type_ids`,
`image_grid_thw` and the attention mask, left padding skipped). Text after the prompt continues on all
three axes at the prompt's largest position + 1, + 1 a token. `get_rope_index` also returns, per row,
`rope_deltas` = that largest position + 1 - the row's number of real tokens, so the token that follows
n real tokens sits at n + rope_delta. `generate` gives the same positions (transformers 5.24: it builds the
prompt's with `get_rope_index` and gives each new token the last one's + 1; the model's own forward, given a
cache and no positions, adds its stored deltas to the 1-D positions that skip the padding).

The fast sampler computes these positions explicitly instead of relying on the `rope_deltas` that the
model keeps on itself between calls: that state has one row per prefilled prompt (N), while decoding
runs N*K rows, and any other forward (a log-prob pass) overwrites it. The shared-prefix log-prob passes
(`passes.prefix_logprobs`: one prefill of each distinct prompt, then its K completions on copies of its cache)
give their prefill and completion tokens the same positions, for the same reason.
"""

from __future__ import annotations

import torch

from rloo.passes.logprobs import computes_own_positions, position_ids_from_mask, rope_index_owner

# The model types whose decode positions are the rule above, tested against `generate` and the training pass
# (tests/vision/test_fast_sampler.py) and, for those whose cache can be shared, in the shared-prefix passes
# (tests/vision/test_shared_prefix_images.py). Other models with `get_rope_index` (Qwen-Omni, GLM-4V, ERNIE-VL, ...)
# are refused by the fast sampler and by shared_prefix_forward by name until they have a stand-in and the same tests;
# their no-grad passes run every row whole, letting the model place its own tokens.
VERIFIED_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe")


def model_type(model: torch.nn.Module) -> str | None:
    """The `config.model_type` of the module that owns `get_rope_index` (None without one)."""
    owner = rope_index_owner(model)
    return None if owner is None else getattr(owner.config, "model_type", None)


def positions_verified(model: torch.nn.Module) -> bool:
    """Whether the tokens after a prompt with images can be given their positions here rather than by the model's own
    forward over the whole row: a model with 1-D positions, or one with 3-D positions of a verified type."""
    return not computes_own_positions(model) or model_type(model) in VERIFIED_MODEL_TYPES


def prompt_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     vision_kwargs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own 3-D positions of left-padded prompts with images, and each row's rope delta.

    Args:
        model: a model with `get_rope_index` (`rope_index_owner`).
        input_ids: (B, P) left-padded prompt ids, image tokens expanded.
        attention_mask: (B, P) 1 for real tokens.
        vision_kwargs: the rows' forward inputs (`VisionInputs.model_kwargs(input_ids)`): `mm_token_type_ids`
            (B, P) and `image_grid_thw` (images, 3) are read.

    Returns:
        positions (3, B, P) (padding at 0), and rope_deltas (B, 1): largest position + 1 - real tokens.
    """
    positions, deltas = rope_index_owner(model).get_rope_index(
        input_ids, mm_token_type_ids=vision_kwargs["mm_token_type_ids"],
        image_grid_thw=vision_kwargs.get("image_grid_thw"), attention_mask=attention_mask)
    return positions, deltas.reshape(-1, 1).to(input_ids.device)


def prefill_positions(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      images: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A prefill's position ids and rope deltas: (3, B, P) and (B, 1) from the model's own `get_rope_index`
    (`prompt_positions`) for prompts with images on a model with 3-D positions; otherwise (B, P) positions that
    skip the left padding, and None."""
    if images and computes_own_positions(model):
        return prompt_positions(model, prompt_ids, prompt_mask, images)
    return position_ids_from_mask(prompt_mask), None


def decode_positions(next_position: torch.Tensor, rope_deltas: torch.Tensor) -> torch.Tensor:
    """3-D positions of the tokens after the prompt (decoded, or a completion run on its prompt's cache): text
    continues on all three axes.

    Args:
        next_position: (B, T) the number of real tokens before each new one (prompt without its padding,
            plus the tokens before it): its 1-D position (T = 1 in a decode step).
        rope_deltas: (B, 1) each row's delta (`prompt_positions`), one row per completion (a prompt's delta
            repeated K times when its cache was).

    Returns:
        (3, B, T) long positions, the same on the three axes: next_position + rope_deltas.
    """
    return (next_position + rope_deltas).unsqueeze(0).expand(3, -1, -1)
