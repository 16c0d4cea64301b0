"""Sampling with transformers' continuous batching (`model.generate_batch`, paged attention).

Each prompt is one request forked into K children (`num_return_sequences=K`) that share its
prefilled KV blocks; finished requests leave the batch and free their blocks at once instead of
decoding padding until the longest completion ends. Works on CPU (tested against the model's exact
distribution in tests/generation/test_paged_sampler.py); its real gains are on GPUs with many long, uneven
completions. Greedy decoding cannot fork (transformers refuses num_return_sequences > 1 without
sampling), so there each prompt is sent K times; so it is on transformers older than 5.24, whose generate_batch
returns only the parent of a forked request (FORKS_RETURNED).

The KV cache is sized for the call's requests: `num_blocks` holds every completion at full length with
its own copy of its prompt (an upper bound: forks share the prompt's blocks), in blocks of PAGE_SIZE
tokens, and at most MAX_BATCH_TOKENS tokens go through one forward pass; if that does not fit in memory,
transformers sizes the cache as it does by default and queues what does not fit. Left to itself, transformers
sizes the cache from free memory: 60% of free RAM on CPU, 90% of the free GPU memory, which a training
process needs for itself (a tiny model's call took 14 GB on this project's 24 GB machine:
benchmarks/memory/paged_cache_memory.py).

`cache_config` (the config's transformers_continuous_batching_config, TRL's name) holds a user's
ContinuousBatchingConfig arguments, laid over that sizing; one that gives num_blocks or max_memory_percent
sizes the cache itself (transformers' rule from free memory for the latter), with no fallback.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import transformers
from packaging.version import Version
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from rloo.generation.base import SampledBatch, SamplingSettings, batch_from_token_lists

PAGE_SIZE = 32  # tokens per KV block (transformers' default, 256, would give each short completion 256)
MAX_BATCH_TOKENS = 2048  # tokens per forward pass; the attention masks grow with it times the cache's tokens
# The KV block size's keyword: "block_size" in transformers 5.17 (the lower bound rloo supports), "page_size" in
# 5.24, which keeps "block_size" as an alias.
PAGE_SIZE_ARGUMENT = "page_size" if "page_size" in inspect.signature(ContinuousBatchingConfig).parameters else "block_size"
# Whether generate_batch returns a forked request's children (num_return_sequences > 1). transformers 5.17 forks
# them but returns only the parent of each request; 5.24 returns every child. Where it does not, each prompt is
# sent K times instead: the same distribution, and the engine still shares the prompt's KV blocks
# (allow_block_sharing).
FORKS_RETURNED = Version(transformers.__version__) >= Version("5.24")


@dataclass
class PagedSampler(SamplingSettings):
    """K completions per prompt from `model.generate_batch` (transformers >= 5)."""

    do_sample: bool = True
    # Return the engine's per-token log-probs (after temperature and filtering). Off by default:
    # it is the policy itself, and log-probs make the trainer measure the (zero) mismatch with an
    # extra forward pass.
    return_logprobs: bool = False
    # The user's ContinuousBatchingConfig arguments (transformers_continuous_batching_config), over rloo's sizing.
    cache_config: dict | None = None

    def on_optimizer_step(self, model: torch.nn.Module) -> None:
        """Nothing to sync: this sampler runs the policy itself."""

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int,
               max_new_tokens: int | None = None) -> SampledBatch:
        """`max_new_tokens`: this call's length limit (`Sampler.sample`), else the configured one."""
        max_new_tokens = max_new_tokens or self.max_new_tokens
        forks = num_generations if self.do_sample and FORKS_RETURNED else 1
        requests = prompts if forks > 1 else [p for p in prompts for _ in range(num_generations)]
        config = GenerationConfig(
            do_sample=self.do_sample, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
            min_p=self.min_p or None, **self.generation_kwargs,
            num_return_sequences=forks, max_new_tokens=max_new_tokens,
            eos_token_id=list(self.eos_token_ids), pad_token_id=self.pad_token_id,
        )
        given = dict(self.cache_config or {})
        cache = ContinuousBatchingConfig(return_logprobs=self.return_logprobs,
                                         **cache_settings(requests, forks, max_new_tokens, given))
        was_training = model.training
        model.eval()
        try:
            try:
                results = model.generate_batch(requests, generation_config=config, progress_bar=False,
                                               continuous_batching_config=cache)
            except MemoryError:
                if SIZING_KEYS & set(given):
                    raise  # the user sized the cache: theirs to change
                # The call's whole need does not fit: let transformers size the cache from free memory, as
                # it does by default, and queue the requests that do not fit at once.
                cache.num_blocks = None
                results = model.generate_batch(requests, generation_config=config, progress_bar=False,
                                               continuous_batching_config=cache)
        finally:
            model.train(was_training)
        # generate_batch returns the requests in input order, each one's forks next to it.
        outputs = list(results.values())
        failed = [o.error for o in outputs if o.error is not None]
        if failed:
            raise RuntimeError(f"generate_batch failed on {len(failed)} request(s): {failed[0]}")
        return batch_from_token_lists(
            prompts, [o.generated_tokens for o in outputs],
            [o.logprobs for o in outputs] if self.return_logprobs else None,
            num_generations, self.pad_token_id, self.eos_token_ids, next(model.parameters()).device)


SIZING_KEYS = {"num_blocks", "max_memory_percent"}


def cache_settings(requests: list[list[int]], forks: int, max_new_tokens: int, given: dict) -> dict:
    """ContinuousBatchingConfig arguments: rloo's sizing (PAGE_SIZE, MAX_BATCH_TOKENS, blocks for every fork at
    full length) with the user's `given` arguments over it; num_blocks is left out when `given` sizes the cache."""
    page_size = given.get(PAGE_SIZE_ARGUMENT, PAGE_SIZE)  # block_size before transformers 5.24
    settings = {PAGE_SIZE_ARGUMENT: page_size, "max_batch_tokens": MAX_BATCH_TOKENS}
    if not SIZING_KEYS & set(given):
        settings["num_blocks"] = cache_blocks(requests, forks, max_new_tokens, page_size)
    return {**settings, **given}


def cache_blocks(requests: list[list[int]], forks: int, max_new_tokens: int, page_size: int) -> int:
    """KV-cache blocks of `page_size` tokens that hold every fork of every request at full length at once."""
    return sum(math.ceil((len(prompt) + max_new_tokens) / page_size) for prompt in requests) * forks
