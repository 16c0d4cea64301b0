"""FastSampler draws from the same distribution as `generate`: filters, greedy outputs, token statistics, EOS."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rloo.generation import GenerateSampler, completion_mask_from_eos
from rloo.generation.fast import FastSampler, filter_logits
from rloo.generation.kv_cache import AppendInPlaceLayer
from rloo.passes.logprobs import completion_logprobs


def _peaked(model, scale=4.0):
    """Sharpen a random model's near-uniform next-token distribution (tied embeddings scale the logits)."""
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(scale)
    return model


def _prompts(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.6)])
def test_filter_logits_matches_transformers_warpers(temperature, top_k, top_p):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, :10] = logits[0, 0]  # ties at the top-k boundary
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    torch.testing.assert_close(filter_logits(logits, temperature, top_k, top_p), expected)


def test_greedy_matches_generate_with_left_padding(make_model, tokenizer):
    model = make_model(seed=3)
    prompts = _prompts(tokenizer, ["1+2=", "12+34=", "7=", "99+99+1="])
    fast = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=7, do_sample=False)
    batch = fast.sample(model, prompts, num_generations=3)
    assert batch.prompt_ids.shape == (12, 8) and batch.prompt_mask[2].sum() == 4  # row 2 is prompt 0, left-padded
    output = model.generate(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask, do_sample=False,
                            max_new_tokens=7, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    expected = output[:, batch.prompt_ids.shape[1]:]
    assert torch.equal(batch.completion_ids, expected[:, : batch.completion_ids.shape[1]])


def _exact_marginals(model, prompt, temperature, top_k, top_p, eos_id, pad_id):
    """Exact distribution of completion tokens 1 and 2 of one prompt: (V,) and (V,)."""
    with torch.no_grad():
        ids = torch.tensor([prompt])
        first = filter_logits(model(ids).logits[:, -1], temperature, top_k, top_p).softmax(-1)[0]  # (V,)
        vocab = first.shape[0]
        extended = torch.cat([ids.repeat(vocab, 1), torch.arange(vocab).unsqueeze(1)], dim=1)  # every first token
        second_given_first = filter_logits(model(extended).logits[:, -1], temperature, top_k, top_p).softmax(-1)  # (V, V)
    second_given_first[eos_id] = 0.0
    second_given_first[eos_id, pad_id] = 1.0  # after EOS the sampler only pads
    return first, first @ second_given_first


def _total_variation(samples, probs):
    counts = torch.bincount(samples, minlength=probs.shape[0]).float()
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


def test_sampled_token_frequencies_match_the_model(make_model, tokenizer):
    torch.manual_seed(0)
    model = make_model(seed=1)
    prompts = _prompts(tokenizer, ["5+5=", "123+4="])
    settings = dict(temperature=0.8, top_k=30, top_p=0.95)
    k = 3000
    fast = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=2, **settings)
    batch = fast.sample(model, prompts, num_generations=k)
    for index, prompt in enumerate(prompts):
        rows = batch.completion_ids[index * k : (index + 1) * k]  # this prompt's group
        first, second = _exact_marginals(model, prompt, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, **settings)
        # Under the right distribution the TV distance of 3000 draws over ~30 tokens is about 0.04.
        assert _total_variation(rows[:, 0], first) < 0.07
        assert _total_variation(rows[:, 1], second) < 0.07
        # The test can fail: the untempered, unfiltered distribution is measurably different.
        wrong, _ = _exact_marginals(model, prompt, 1.0, 0, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id)
        assert _total_variation(rows[:, 0], wrong) > 0.1


def _mean_logprob_and_error(model, batch):
    """Mean and standard error over rows of the summed log-prob of each sampled completion."""
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    with torch.no_grad():
        logps, _ = completion_logprobs(model, input_ids, attention_mask, batch.completion_ids.shape[1])
    per_row = (logps * batch.completion_mask).sum(1)
    return per_row.mean().item(), per_row.std().item() / per_row.numel() ** 0.5


def test_same_statistics_as_generate_sampler(make_model, tokenizer):
    torch.manual_seed(1)
    model = _peaked(make_model(seed=2))
    prompts = _prompts(tokenizer, ["9+1=", "45+6="])
    args = (tokenizer.pad_token_id, [tokenizer.eos_token_id], 4)
    fast = FastSampler(*args, temperature=0.5).sample(model, prompts, 2000)
    reference = GenerateSampler(*args, temperature=0.5).sample(model, prompts, 2000)
    fast_mean, fast_error = _mean_logprob_and_error(model, fast)
    reference_mean, reference_error = _mean_logprob_and_error(model, reference)
    # A z-test: under the same distribution |z| > 4 happens once in 15,000 runs.
    assert abs(fast_mean - reference_mean) < 4 * (fast_error ** 2 + reference_error ** 2) ** 0.5
    # ...and it has power: sampling at temperature 1 moves the statistic by many standard errors.
    hotter_mean, _ = _mean_logprob_and_error(model, FastSampler(*args, temperature=1.0).sample(model, prompts, 2000))
    assert abs(hotter_mean - reference_mean) > 8 * (fast_error ** 2 + reference_error ** 2) ** 0.5


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 0, 1.0), (1.0, 5, 0.9)])
def test_from_the_same_random_state_draws_the_tokens_generate_draws(make_model, tokenizer, temperature, top_k, top_p):
    """One prompt's K samples, as TRL samples them (`generate` on the prompt repeated K times): the
    same filtered distribution and the same multinomial call per position consume the same random
    numbers, so the draws agree token for token (on the real model too: benchmarks/speed/sampler_vs_generate.py).
    A slight change of the distribution can leave every draw as it was (a draw moves only when the
    cumulative probability crosses its random number); the statistics test above measures those."""
    model = _peaked(make_model(seed=3))
    prompt = _prompts(tokenizer, ["12+30="])[0]
    k, new_tokens = 6, 8
    torch.manual_seed(7)
    fast = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], new_tokens, temperature=temperature,
                       top_k=top_k, top_p=top_p).sample(model, [prompt], k)
    torch.manual_seed(7)
    with torch.no_grad():
        generated = model.generate(torch.tensor([prompt] * k), attention_mask=torch.ones(k, len(prompt), dtype=torch.long),
                                   do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p,
                                   max_new_tokens=new_tokens, eos_token_id=tokenizer.eos_token_id,
                                   pad_token_id=tokenizer.pad_token_id)[:, len(prompt):]
    generated_mask, _ = completion_mask_from_eos(generated, [tokenizer.eos_token_id])
    drawn = [ids[:int(m.sum())].tolist() for ids, m in zip(fast.completion_ids, fast.completion_mask)]
    expected = [ids[:int(m.sum())].tolist() for ids, m in zip(generated, generated_mask)]
    assert len({tuple(d) for d in drawn}) > 1  # the draws differ between samples: this compares sampling
    assert drawn == expected


def test_stops_once_every_row_has_ended_and_prefills_each_prompt_once(make_model, tokenizer):
    model = make_model()
    rows_seen = []
    model.register_forward_hook(lambda module, args, kwargs, output: rows_seen.append(kwargs["input_ids"].shape),
                                with_kwargs=True)
    prompts = _prompts(tokenizer, ["1+1=", "22+2="])
    every_token_ends = list(range(len(tokenizer)))
    batch = FastSampler(tokenizer.pad_token_id, every_token_ends, max_new_tokens=10).sample(model, prompts, 4)
    assert rows_seen == [(2, 5)]  # one prefill of the 2 distinct prompts, no decode step
    assert batch.completion_ids.shape == (8, 1) and batch.has_eos.all() and batch.completion_mask.all()


def test_padding_after_eos_and_truncation(make_model, tokenizer):
    torch.manual_seed(0)
    model = make_model(seed=4)
    eos = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]  # frequent enough to end some rows early
    batch = FastSampler(tokenizer.pad_token_id, eos, max_new_tokens=6).sample(model, _prompts(tokenizer, ["3+4="]), 64)
    ids, mask = batch.completion_ids, batch.completion_mask
    lengths = mask.sum(1)
    assert batch.has_eos.any() and (~batch.has_eos).any(), "the test needs both ended and truncated rows"
    for row, length, ended in zip(ids, lengths, batch.has_eos):
        assert (row[length:] == tokenizer.pad_token_id).all()
        assert (int(row[length - 1]) in eos) == bool(ended)
        assert not any(int(t) in eos for t in row[: length - 1])
    assert (lengths[~batch.has_eos] == 6).all()


def test_append_in_place_layer_matches_concatenation_and_overflows_gracefully():
    layer, reference = AppendInPlaceLayer(room=2), DynamicLayer()
    chunks = [torch.randn(2, 3, n, 4) for n in (5, 1, 1)]  # prefill, then two decode steps
    for index, chunk in enumerate(chunks):
        keys, values = layer.update(chunk, -chunk)
        expected_keys, expected_values = reference.update(chunk, -chunk)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        if index == 0:  # share the prefill across K = 3 samples, as FastSampler does
            layer.batch_repeat_interleave(3)
            reference.batch_repeat_interleave(3)
            chunks[1:] = [c.repeat_interleave(3, dim=0) for c in chunks[1:]]
    assert keys.data_ptr() == layer._key_buffer.data_ptr()  # a view of the buffer, not a copy
    overflow = torch.randn(6, 3, 1, 4)  # the room (2) is used up: falls back to concatenation
    assert torch.equal(layer.update(overflow, overflow)[0], reference.update(overflow, overflow)[0])


def test_config_selects_the_sampler(tmp_path, make_model, tokenizer, digit_dataset):
    from conftest import digit_fraction
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.config import ConfigError

    for name, expected in (("fast", FastSampler), ("generate", GenerateSampler)):
        args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, beta=0.0,
                          max_completion_length=4, max_steps=1, save_steps=0, sampler=name)
        trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
        assert type(trainer.sampler) is expected
        rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
        assert rollout.completion_ids.shape[0] == 8
    with pytest.raises(ConfigError, match="sampler"):
        RLOOConfig(sampler="vllm")
