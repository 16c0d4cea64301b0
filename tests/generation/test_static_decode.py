"""The fast sampler's CUDA decode (issue #46): static buffers, graph capture, end checks every N steps, waves, the
16-bit weight copy. On CPU in fp32 each must draw exactly the tokens the eager loop draws from the same random state;
the graphed step is checked the same way on a GPU (`cuda` tests, scripts/gpu_lease.sh)."""

import pytest
import torch

from rloo.generation import static_decode
from rloo.generation.fast import FastSampler
from rloo.generation.half_weights import half_copy, kv_bytes_per_token
from rloo.generation.static_decode import StaticRowsLayer, static_refusal, takes_prepared_masks


def _prompts(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


PROMPTS = ["1+2=", "12+34=", "7=", "99+99+1="]


def draw(model, tokenizer, prompts, seed=0, k=3, max_new_tokens=9, eos_ids=None, **fields):
    sampler = FastSampler(tokenizer.pad_token_id, eos_ids or [tokenizer.eos_token_id], max_new_tokens=max_new_tokens,
                          **{"temperature": 0.9, "top_k": 12, "top_p": 0.9, **fields})
    torch.manual_seed(seed)
    batch = sampler.sample(model, prompts, num_generations=k)
    return batch.completion_ids, batch.logprobs, batch.completion_mask


def _peaked(model, scale=4.0):
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(scale)
    return model


@pytest.mark.parametrize("block", [256, 4])  # 4: attention's visible length grows block by block
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_static_step_draws_the_eager_loops_tokens(make_model, tokenizer, attention, do_sample, block, monkeypatch):
    monkeypatch.setattr(static_decode, "ATTENTION_BLOCK", block)
    model = _peaked(make_model(seed=3))
    model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention
    prompts = _prompts(tokenizer, PROMPTS)  # left padding: prompts of 2 to 8 tokens
    want = draw(model, tokenizer, prompts, do_sample=do_sample, decode_step="eager")
    got = draw(model, tokenizer, prompts, do_sample=do_sample, decode_step="static")
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


def test_static_step_with_a_shared_prompt_head(make_model, tokenizer):
    """The shared-head prefill leaves head, padding, tail in the cache: the static mask must keep the padding out."""
    model = _peaked(make_model(seed=2))
    head = "You add numbers. Answer with the sum only, then stop. "  # > MIN_SHARED_HEAD characters = tokens
    prompts = _prompts(tokenizer, [head + "1+2=", head + "12+34=", head + "7="])
    want = draw(model, tokenizer, prompts, decode_step="eager")
    got = draw(model, tokenizer, prompts, decode_step="static")
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("decode_step", ["eager", "static"])
def test_checking_for_the_end_every_n_steps_gives_the_same_result(make_model, tokenizer, decode_step):
    """Steps past the last row's end are decoded then dropped: the same tokens, log-probs and length."""
    model = make_model(seed=5)
    prompts = _prompts(tokenizer, PROMPTS)
    ends = [tokenizer.eos_token_id, *range(10, 40)]  # a third of the vocabulary ends a row: rows end at different steps
    want = draw(model, tokenizer, prompts, max_new_tokens=40, eos_ids=ends, decode_step="eager", eos_check_every=1)
    lengths = want[2].sum(dim=1)
    assert lengths.max() < 40 and lengths.max() % 16 != 0  # every row ended early, between two checks
    got = draw(model, tokenizer, prompts, max_new_tokens=40, eos_ids=ends, decode_step=decode_step, eos_check_every=16)
    assert got[0].shape == want[0].shape and torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


def test_waves_of_whole_groups_give_the_greedy_tokens_of_one_pass(make_model, tokenizer):
    model = _peaked(make_model(seed=3))
    prompts = _prompts(tokenizer, PROMPTS)
    want = draw(model, tokenizer, prompts, do_sample=False)
    got = draw(model, tokenizer, prompts, do_sample=False, wave_rows=6)  # two prompts (6 rows) a wave
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


def test_static_layer_writes_at_the_device_slot():
    keys, values = torch.zeros(2, 1, 5, 3), torch.zeros(2, 1, 5, 3)
    slot = torch.tensor([2])
    layer = StaticRowsLayer(keys, values, filled=2, slot=slot)
    out_keys, _ = layer.update(torch.ones(2, 1, 1, 3), torch.ones(2, 1, 1, 3))
    assert out_keys.shape == (2, 1, 5, 3) and out_keys[:, :, 2].eq(1).all() and out_keys[:, :, [0, 1, 3, 4]].eq(0).all()
    assert layer.get_mask_sizes(torch.tensor([2])) == (5, 0) and layer.get_seq_length() == 2
    layer.keys, layer.values = keys[:, :, :4], values[:, :, :4]  # a narrower visible block
    slot.fill_(3)
    out_keys, _ = layer.update(torch.full((2, 1, 1, 3), 2.0), torch.ones(2, 1, 1, 3))
    assert out_keys.shape == (2, 1, 4, 3) and keys[:, :, 3].eq(2).all() and layer.get_mask_sizes() == (4, 0)


def test_models_that_cannot_take_the_static_step_are_named(make_model, tokenizer):
    model = make_model()
    assert takes_prepared_masks(model)
    model.config._attn_implementation = "flash_attention_2"
    assert "attention implementation" in static_refusal(model, None, None)


def test_unqualified_models_fall_back_to_the_eager_loop(make_model, tokenizer, monkeypatch):
    model = make_model(seed=1)
    monkeypatch.setattr(static_decode, "takes_prepared_masks", lambda model: False)
    prompts = _prompts(tokenizer, PROMPTS[:2])
    want = draw(model, tokenizer, prompts, decode_step="eager")
    assert torch.equal(draw(model, tokenizer, prompts, decode_step="static")[0], want[0])


def test_half_copy_is_refreshed_after_an_optimizer_step(make_model, tokenizer):
    model = make_model(seed=0)
    sampler = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4)
    copy = sampler.half_weights(model, torch.bfloat16)
    assert copy is not model and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in copy.parameters())
    assert sampler.half_weights(model, torch.bfloat16) is copy  # made once
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert not torch.equal(copy.lm_head.weight, model.lm_head.weight.bfloat16())  # not yet refreshed
    sampler.on_optimizer_step(model)
    assert sampler.half_weights(model, torch.bfloat16) is copy  # refreshed in place, not rebuilt
    assert torch.equal(copy.lm_head.weight, model.lm_head.weight.bfloat16())
    assert kv_bytes_per_token(copy) == kv_bytes_per_token(model) // 2


def test_half_copy_keys_are_16_bit(tokenizer):
    """Qwen3's k-norm weight is fp32 in an fp32 model, which makes keys fp32 under autocast; in the copy it is not."""
    import transformers

    config = transformers.Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = transformers.Qwen3ForCausalLM(config)
    copy = half_copy(model, torch.bfloat16)
    ids = torch.tensor([[5, 6, 7]])
    out = copy(input_ids=ids, use_cache=True)
    assert out.past_key_values.layers[0].keys.dtype == torch.bfloat16
    assert copy.model.rotary_emb.inv_freq.dtype == torch.float32  # bf16 frequencies would move every position


def test_invalid_fields_are_refused(tokenizer):
    from rloo.config_checks import ConfigError

    for bad in ({"decode_step": "fast"}, {"weights_dtype": "fp8"}, {"eos_check_every": -1}):
        with pytest.raises(ConfigError):
            FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4, **bad)


@pytest.mark.cuda
@pytest.mark.parametrize("do_sample", [False, True])
def test_cuda_graphed_step_draws_the_eager_loops_tokens(make_model, tokenizer, do_sample, monkeypatch):
    monkeypatch.setattr(static_decode, "ATTENTION_BLOCK", 4)  # several graphs, one per block, in one pool
    model = _peaked(make_model(seed=3)).cuda()
    prompts = _prompts(tokenizer, PROMPTS)
    want = draw(model, tokenizer, prompts, do_sample=do_sample, decode_step="eager", eos_check_every=1)
    got = draw(model, tokenizer, prompts, do_sample=do_sample, decode_step="graph", eos_check_every=4)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_bf16_copy_under_autocast_samples(make_model, tokenizer):
    model = _peaked(make_model(seed=3)).cuda()
    sampler = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=8, do_sample=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        batch = sampler.sample(model, _prompts(tokenizer, PROMPTS), num_generations=2)
    assert sampler._copy is not None and next(sampler._copy[1].parameters()).dtype == torch.bfloat16
    assert batch.completion_ids.shape[0] == 8


@pytest.mark.cuda
def test_cuda_waves_fit_the_free_memory(make_model, tokenizer):
    from rloo.generation.half_weights import rows_fitting_memory

    model = make_model(seed=0).cuda()
    rows = rows_fitting_memory(model, tokens_per_row=1000, k=4, share=0.5)
    assert rows % 4 == 0 and rows >= 4
    free, _ = torch.cuda.mem_get_info()
    per_row = 1000 * kv_bytes_per_token(model)
    assert rows * per_row <= 0.5 * (free + torch.cuda.memory_reserved()) + 4 * per_row


def test_waves_off_cuda_take_every_row(make_model, tokenizer):
    sampler = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4)
    assert sampler.rows_per_wave(make_model(), 10, 3) is None  # CPU: one pass
    assert FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4,
                       wave_rows=7).rows_per_wave(make_model(), 10, 3) == 6  # whole groups
