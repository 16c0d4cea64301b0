"""PagedSampler (transformers continuous batching) draws from the model's exact distribution, as FastSampler does."""

import math

import torch
from test_decoding import _exact_marginals, _prompts, _total_variation

from rloo.generation.paged import PAGE_SIZE_ARGUMENT, PagedSampler


def test_greedy_matches_generate(make_model, tokenizer):
    model = make_model(seed=3)
    prompts = _prompts(tokenizer, ["1+2=", "12+34=", "7="])
    batch = PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=7, do_sample=False).sample(
        model, prompts, num_generations=2)
    assert batch.prompt_ids.shape == (6, 6) and batch.prompt_mask[0].sum() == 4  # group of prompt 0 first, left-padded
    for row in range(6):
        prompt = torch.tensor([prompts[row // 2]])
        expected = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=7,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)[0, prompt.shape[1]:]
        length = int(batch.completion_mask[row].sum())
        assert batch.completion_ids[row, :length].tolist() == expected[:length].tolist()
        assert length == len(expected) or expected[length - 1] == tokenizer.eos_token_id


def _expected_total_variation(probs, n):
    """E[TV] between n draws from `probs` and `probs`: 0.5 * sum sqrt(2 p (1 - p) / (pi n)) (normal approximation)."""
    return 0.5 * (2 * probs * (1 - probs) / (math.pi * n)).sqrt().sum().item()


def test_sampled_token_frequencies_match_the_model(make_model, tokenizer):
    """Tokens 1 and 2 (the second drawn after the K forks share the prompt's KV blocks)."""
    torch.manual_seed(0)
    model = make_model(seed=1)
    prompts = _prompts(tokenizer, ["5+5=", "123+4="])
    settings = dict(temperature=0.8, top_k=30, top_p=0.95)
    k = 1500  # continuous batching is slow on CPU: about 15 ms per request here
    sampler = PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=2, **settings)
    batch = sampler.sample(model, prompts, num_generations=k)
    for index, prompt in enumerate(prompts):
        rows = batch.completion_ids[index * k : (index + 1) * k]  # this prompt's group
        assert (batch.prompt_ids[index * k : (index + 1) * k, -len(prompt):] == torch.tensor(prompt)).all()
        first, second = _exact_marginals(model, prompt, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                                         **settings)
        # 1.5 times the TV distance expected from sampling noise alone (a 3000-draw run measured 1.0-1.2x).
        first_bound = 1.5 * _expected_total_variation(first, k)
        assert _total_variation(rows[:, 0], first) < first_bound
        assert _total_variation(rows[:, 1], second) < 1.5 * _expected_total_variation(second, k)
        # The test can fail: the untempered, unfiltered distribution is measurably different.
        wrong, _ = _exact_marginals(model, prompt, 1.0, 0, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id)
        assert _total_variation(rows[:, 0], wrong) > first_bound


def test_eos_ends_completions_and_logprobs_are_the_models(make_model, tokenizer):
    from rloo.passes.logprobs import completion_logprobs

    torch.manual_seed(0)
    model = make_model(seed=4)
    prompts = _prompts(tokenizer, ["1+1=", "22+2="])
    every_token_ends = list(range(len(tokenizer)))
    batch = PagedSampler(tokenizer.pad_token_id, every_token_ends, max_new_tokens=10).sample(model, prompts, 4)
    assert batch.completion_ids.shape == (8, 1) and batch.has_eos.all() and batch.completion_mask.all()

    sampler = PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=5, temperature=0.7,
                           return_logprobs=True)
    batch = sampler.sample(model, prompts, 3)
    assert not batch.has_eos.all()  # a random tiny model rarely says EOS: truncated rows stay truncated
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    expected, _ = completion_logprobs(model, ids, mask, batch.completion_ids.shape[1], 0.7)
    torch.testing.assert_close(batch.logprobs, expected * batch.completion_mask, atol=1e-4, rtol=1e-4)


def test_the_kv_cache_is_sized_for_the_call_not_from_free_memory(make_model, tokenizer):
    """transformers sizes the cache from free memory unless told (60% of free RAM on CPU: 14 GB for this tiny
    model on a 24 GB machine, benchmarks/memory/paged_cache_memory.py); the sampler asks for the call's need."""
    from rloo.generation.paged import cache_blocks

    model = make_model()
    seen = []
    original = model.generate_batch

    def generate_batch(*args, continuous_batching_config, **kwargs):
        seen.append(continuous_batching_config)
        return original(*args, continuous_batching_config=continuous_batching_config, **kwargs)

    model.generate_batch = generate_batch
    prompts = _prompts(tokenizer, ["1+2=", "12+34=", "7="])  # 4, 6 and 2 tokens
    PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=30).sample(model, prompts, 4)
    # page 32: ceil(34/32) + ceil(36/32) + ceil(32/32) = 2 + 2 + 1 blocks per fork, 4 forks each
    page_size = getattr(seen[0], PAGE_SIZE_ARGUMENT)  # "block_size" on transformers 5.17
    assert (page_size, seen[0].num_blocks, seen[0].max_batch_tokens) == (32, 20, 2048)
    assert cache_blocks([[1] * 40], forks=3, max_new_tokens=100, page_size=32) == 15  # ceil(140/32) = 5, x 3


def test_a_call_whose_cache_does_not_fit_falls_back_to_transformers_sizing(make_model, tokenizer):
    """Every fork at full length may not fit (many long completions on a GPU): transformers then raises
    MemoryError while sizing the cache, and the sampler asks again with the cache sized from free memory."""
    model = make_model()
    seen = []
    original = model.generate_batch

    def generate_batch(*args, continuous_batching_config, **kwargs):
        seen.append(continuous_batching_config.num_blocks)
        if len(seen) == 1:
            raise MemoryError("Memory footprint 25889566720 is more than available memory 14851289088")
        continuous_batching_config.num_blocks = 64  # not the free-memory sizing itself: 60% of RAM in a test
        return original(*args, continuous_batching_config=continuous_batching_config, **kwargs)

    model.generate_batch = generate_batch
    batch = PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=5).sample(
        model, _prompts(tokenizer, ["1+2=", "7="]), 2)
    assert seen == [4, None] and batch.completion_ids.shape[0] == 4


def test_the_users_continuous_batching_config_goes_over_rloos_sizing(make_model, tokenizer):
    """transformers_continuous_batching_config (TRL's name) reaches generate_batch: its keys over rloo's sizing,
    and a max_memory_percent leaves num_blocks to transformers' rule from free memory."""
    model = make_model()
    seen = []
    original = model.generate_batch

    def generate_batch(*args, continuous_batching_config, **kwargs):
        c = continuous_batching_config
        seen.append((getattr(c, PAGE_SIZE_ARGUMENT), c.num_blocks, c.max_batch_tokens, c.max_memory_percent))
        c.num_blocks = c.num_blocks or 64  # not transformers' sizing from 20% of the RAM, in a test
        return original(*args, continuous_batching_config=continuous_batching_config, **kwargs)

    model.generate_batch = generate_batch
    prompts = _prompts(tokenizer, ["1+2=", "12+34=", "7="])  # 4, 6 and 2 tokens
    PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=30,
                 cache_config={PAGE_SIZE_ARGUMENT: 16, "max_batch_tokens": 256}).sample(model, prompts, 4)
    # page 16: ceil(34/16) + ceil(36/16) + ceil(32/16) = 3 + 3 + 2 blocks per fork, 4 forks each
    assert seen[0] == (16, 32, 256, None)
    PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=30,
                 cache_config={"max_memory_percent": 0.2}).sample(model, prompts, 4)
    assert seen[1] == (32, None, 2048, 0.2)
