"""Prompts with images for a vLLM engine, the same in the training process (colocate, generation/vllm.py) and on
`rloo vllm-serve` (vllm_server.py, whose client vllm_client.py checks what it ran): the requests the engine takes,
and the check that the prompt it ran is the one the training passes run (docs/vision.md)."""

from __future__ import annotations

from typing import Any


def image_requests(prompts: list[list[int]], images: list[list[Any]]) -> list[dict[str, Any]]:
    """vLLM's requests for prompts with images: each prompt's chat-template ids (one placeholder per image, which the
    engine expands) and its images as `multi_modal_data` (one image alone, several as a list; none: a text request)."""
    if len(prompts) != len(images):
        raise ValueError(f"{len(prompts)} prompts given with images for {len(images)}.")
    return [{"prompt_token_ids": list(ids), **({"multi_modal_data": {"image": imgs if len(imgs) > 1 else imgs[0]}}
                                               if imgs else {})}
            for ids, imgs in zip(prompts, images)]


def check_expanded(ran: list[list[int]], expanded: list[list[int]]) -> None:
    """Refuse a batch whose prompt `p` the engine ran as other ids than the processor's `expanded[p]`: the training
    passes run the processor's ids, so they would score completions sampled from another prompt."""
    if len(ran) != len(expanded):
        raise RuntimeError(f"vLLM ran {len(ran)} prompts for {len(expanded)} asked.")
    for index, (ids, want) in enumerate(zip(ran, expanded)):
        if list(ids) != list(want):
            raise RuntimeError(f"vLLM expanded prompt {index}'s image placeholders into {len(ids)} ids, not the "
                               f"processor's {len(want)}: the training passes would score its completions against "
                               f"another prompt. This model's processor and vLLM's disagree; use sampler='fast' or "
                               f"'generate' for it.")
