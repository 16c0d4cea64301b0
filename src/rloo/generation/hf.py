"""Sampling with Hugging Face `generate`: simple and general, the reference for faster backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rloo.generation.base import SampledBatch, SamplingSettings, completion_mask_from_eos, left_pad


@dataclass
class GenerateSampler(SamplingSettings):
    """Sampling with Hugging Face `generate`: simple and general, the reference for faster backends."""


    def on_optimizer_step(self, model: torch.nn.Module) -> None:
        """Nothing to sync: this sampler runs the policy itself."""

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int,
               vision: Any = None, max_new_tokens: int | None = None) -> SampledBatch:
        """`vision`: the rows' image inputs (`data.images.VisionInputs`, one row per completion): the prefill
        takes every row's copy of its prompt's pixel values; an image token is never sampled (it would need
        image features the prompt does not have, as TRL suppresses it). `max_new_tokens`: this call's length limit
        (`Sampler.sample`), else the configured one."""
        device = next(model.parameters()).device
        repeated = [p for p in prompts for _ in range(num_generations)]  # groups stay contiguous
        prompt_ids, prompt_mask = left_pad(repeated, self.pad_token_id, device)
        images = {} if vision is None else {**vision.model_kwargs(prompt_ids), "suppress_tokens": [vision.image_token_id]}
        was_training = model.training
        model.eval()
        output = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,  # 0 disables; None would fall back to generation_config (50)
            min_p=self.min_p or None,
            max_new_tokens=max_new_tokens or self.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            **self.generation_kwargs,
            **images,
        )
        model.train(was_training)
        completion_ids = output[:, prompt_ids.shape[1]:]  # (B, C), C <= max_new_tokens
        completion_mask, has_eos = completion_mask_from_eos(completion_ids, self.eos_token_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.pad_token_id)
        return SampledBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, has_eos)
