"""Greedy evaluation: the library's fast sampler with sampling off, scored by exact match."""

from __future__ import annotations

import torch
import transformers
from datasets import Dataset

from rloo.data.prompts import tokenize_prompts
from rloo.generation import FastSampler
from rloo.rewards import exact_match


@torch.no_grad()
def greedy_completions(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
) -> list[str]:
    """Greedy completions of `prompts`, decoded without special tokens and stripped.

    Decoding is `rloo.generation.FastSampler(do_sample=False)` with one completion per prompt,
    whose output tests/generation/test_decoding.py checks equal to greedy `generate`.

    Args:
        model: a causal LM; put in eval mode.
        tokenizer: gives the pad and eos ids and decodes the completions.
        prompts: prompt strings, tokenized as the trainer tokenizes them (`data.prompts.tokenize_prompts`).
        max_new_tokens: longest completion in tokens; generation also stops at eos.
        batch_size: prompts per sampler call.

    Returns:
        One completion string per prompt, in order.
    """
    model.eval()
    sampler = FastSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=max_new_tokens, do_sample=False)
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        # Tokenized as the trainer tokenizes prompts (the tokenizer's default special tokens, e.g. BOS).
        prompt_ids = tokenize_prompts(prompts[start : start + batch_size], tokenizer, tokenizer.model_max_length)
        batch = sampler.sample(model, prompt_ids, num_generations=1)  # pads on the left itself
        texts += [t.strip() for t in tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)]
    return texts


def greedy_accuracy(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    dataset: Dataset,
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
) -> float:
    """Fraction of rows whose greedy completion matches "answer" by the built-in `exact_match`.

    Args:
        model: a causal LM; put in eval mode.
        tokenizer: gives the pad and eos ids and decodes the completions.
        dataset: rows with "prompt" and "answer" strings.
        max_new_tokens: longest completion in tokens; a completion cut off here counts as wrong
            unless it already equals the answer.
        batch_size: prompts per sampler call.

    Returns:
        Accuracy in [0, 1]; 0.0 for an empty dataset.
    """
    if len(dataset) == 0:
        return 0.0
    texts = greedy_completions(model, tokenizer, list(dataset["prompt"]), max_new_tokens=max_new_tokens, batch_size=batch_size)
    return sum(exact_match(texts, list(dataset["answer"]))) / len(dataset)
