"""FastSampler's shared head: prompts that begin alike run their common head once, then only their tails.

A row's cache then reads head, padding, tail instead of padding, head, tail; with the padding masked and
positions counting real tokens only, the samples and their log-probs must be those of the whole-row prefill.
"""

import pytest
import torch
import transformers

from conftest import gpt2_model
from rloo.generation import fast
from rloo.generation.fast import FastSampler, shared_head_length
from rloo.passes.logprobs import completion_logprobs


@pytest.mark.parametrize("prompts,expected", [
    ([[1, 2, 3, 4], [1, 2, 3, 5]], 3),
    ([[1, 2, 3, 4], [1, 2, 3, 4, 9]], 3),  # the shorter prompt keeps its last token
    ([[5, 6, 7], [5, 6, 7]], 2),
    ([[1, 2], [3, 4]], 0),
    ([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 8]], 2),
])
def test_shared_head_length(prompts, expected):
    assert shared_head_length(prompts) == expected


def _prompts(tokenizer, head_text, tails):
    """Prompts of one long common head (above MIN_SHARED_HEAD) and tails of different lengths."""
    head = tokenizer(head_text, add_special_tokens=False)["input_ids"]
    assert len(head) >= fast.MIN_SHARED_HEAD
    return [head + tokenizer(tail, add_special_tokens=False)["input_ids"] for tail in tails]


def _record_calls(model):
    shapes = []
    model.register_forward_hook(lambda module, args, kwargs, output: shapes.append(tuple(kwargs["input_ids"].shape)),
                                with_kwargs=True)
    return shapes


def _models(make_model, tokenizer):
    return {"qwen2 (rotary)": make_model(seed=3), "gpt2 (absolute positions)": gpt2_model(tokenizer)}


@pytest.mark.parametrize("name", ["qwen2 (rotary)", "gpt2 (absolute positions)"])
def test_greedy_samples_and_logprobs_equal_the_whole_row_prefill(make_model, tokenizer, monkeypatch, name):
    model = _models(make_model, tokenizer)[name]
    prompts = _prompts(tokenizer, "12+34+56+78+90+11=", ["1+2=", "345+6789=", "7=", "99+99+1="])
    sampler = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=8, do_sample=False)
    shapes = _record_calls(model)
    shared = sampler.sample(model, prompts, num_generations=2)
    head = shared_head_length(prompts)
    assert shapes[:2] == [(1, head), (4, 9 - 1 + 1)]  # the head once, then the 4 tails (longest 9 tokens), padded

    monkeypatch.setattr(fast, "MIN_SHARED_HEAD", 10**9)  # the whole-row prefill
    shapes.clear()
    whole = sampler.sample(model, prompts, num_generations=2)
    assert shapes[0] == (4, max(map(len, prompts)))
    assert torch.equal(shared.completion_ids, whole.completion_ids)
    assert torch.equal(shared.prompt_ids, whole.prompt_ids) and torch.equal(shared.prompt_mask, whole.prompt_mask)
    torch.testing.assert_close(shared.logprobs, whole.logprobs, atol=1e-5, rtol=0)

    output = model.generate(input_ids=whole.prompt_ids, attention_mask=whole.prompt_mask, do_sample=False,
                            max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    assert torch.equal(shared.completion_ids, output[:, whole.prompt_ids.shape[1]:][:, :shared.completion_ids.shape[1]])


@pytest.mark.parametrize("name", ["qwen2 (rotary)", "gpt2 (absolute positions)"])
def test_sampled_logprobs_equal_the_training_pass(make_model, tokenizer, name):
    """The importance correction trusts the sampler's log-probs: with a shared head they are still the policy's."""
    model = _models(make_model, tokenizer)[name]
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)  # a peaked distribution: positions off by one show
    prompts = _prompts(tokenizer, "98+76+54+32+10+12=", ["3=", "45+6=", "789+1+2="])
    torch.manual_seed(0)
    batch = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=10).sample(model, prompts, 3)
    with torch.no_grad():
        expected, _ = completion_logprobs(model, torch.cat([batch.prompt_ids, batch.completion_ids], dim=1),
                                          torch.cat([batch.prompt_mask, batch.completion_mask], dim=1),
                                          batch.completion_ids.shape[1])
    mask = batch.completion_mask.bool()
    assert mask.sum() > 20
    torch.testing.assert_close(batch.logprobs[mask], expected[mask], atol=1e-5, rtol=0)


def test_sliding_window_caches_keep_the_whole_row_prefill(tokenizer):
    config = transformers.MistralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                        sliding_window=8, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).eval()
    prompts = _prompts(tokenizer, "12+34+56+78+90+11=", ["1+2=", "345+6789="])
    shapes = _record_calls(model)
    FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=3, do_sample=False).sample(model, prompts, 2)
    assert shapes[0] == (2, max(map(len, prompts)))
