"""Images through the fast sampler (generation.fast), the default: each distinct prompt's images run once in the
prefill, the cache is repeated K times, decoding is text-only. Checked against `generate` (greedy), against the
training pass's log-probs, end to end with no sampler set (as a TRL VLM script runs), and by the vision tower's
own calls. Qwen2-VL, Qwen2.5-VL and Qwen3-VL (3-D rotary positions) included; other models with 3-D positions are
refused by name."""

from __future__ import annotations

import pytest
import standin_vlms
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.data.images import ImagePromptEncoder, image_token_id
from rloo.generation import FastSampler
from rloo.generation import fast as fast_module
from rloo.generation.base import left_pad
from rloo.generation.kv_cache import append_in_place_cache
from rloo.passes import mrope
from rloo.passes.logprobs import completion_logprobs, rope_index_owner
from rloo.passes.prefix_logprobs import shares_image_prompts

QWEN_VL = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe"]  # 3-D rotary positions (mrope)
FAMILIES = ["gemma3", "gemma4", "llava", "llava_next", *QWEN_VL]
K = 3


def _encoded(family: str, model: torch.nn.Module):
    """Three prompts of different lengths (the second is longer, so the others are left-padded), each with an
    image, as the collector encodes them: token ids and the VisionInputs of one row per completion (K each)."""
    processor = standin_vlms.processor(family)
    dataset = standin_vlms.image_dataset(3)
    rows = [dataset[i] for i in range(3)]
    rows[1] = {**rows[1], "prompt": [{"role": "user", "content": "a longer question: how many squares are there?"}]}
    if family in QWEN_VL:  # grids of 8x4, 4x4 and 4x6 patches (the smallest is raised to 4x4): rope deltas -4, -2, -3
        sizes = [(56, 112), (28, 28), (84, 56)]
        rows = [{**row, "image": row["image"].convert("RGB").resize(size)} for row, size in zip(rows, sizes)]
    encoder = ImagePromptEncoder(processor, "image", 4096, image_token_id(model.config, processor))
    prompt_ids, vision = encoder.encode(rows)
    assert len({len(ids) for ids in prompt_ids}) >= 2
    return processor.tokenizer, prompt_ids, vision.repeat(K)


def _sampler(tokenizer, **overrides) -> FastSampler:
    return FastSampler(**{"pad_token_id": tokenizer.pad_token_id, "eos_token_ids": [tokenizer.eos_token_id],
                          "max_new_tokens": 6, **overrides})


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_fast_sampling_equals_greedy_generate_on_image_prompts(family):
    model = standin_vlms.model(family).eval()
    tokenizer, prompt_ids, vision = _encoded(family, model)
    if family in QWEN_VL:  # stale rope deltas kept on the model (one row, wrong value): the sampler must not read them
        rope_index_owner(model).rope_deltas = torch.full((1, 1), 100)
    fast = _sampler(tokenizer, do_sample=False).sample(model, prompt_ids, K, vision=vision)

    ids, mask = left_pad([p for p in prompt_ids for _ in range(K)], tokenizer.pad_token_id)
    generated = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                               eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                               suppress_tokens=[vision.image_token_id], **vision.model_kwargs(ids))[:, ids.shape[1]:]
    assert torch.equal(fast.prompt_ids, ids)
    width = fast.completion_ids.shape[1]
    assert torch.equal(fast.completion_ids, generated[:, :width].masked_fill(fast.completion_mask == 0,
                                                                             tokenizer.pad_token_id))
    # the prompts differ, and so do their completions: the images and prompts were not mixed up between rows
    assert not torch.equal(fast.completion_ids[0], fast.completion_ids[K])


@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_logprobs_equal_the_training_pass(family):
    """The log-probs the fast sampler returns (which the trainer takes as pi_old) are those the training pass
    computes for the sampled tokens with the same images (Gemma 3: with its bidirectional image attention)."""
    sampled, recomputed = _sampled_and_training_logprobs(standin_vlms.model(family).eval(), family)
    torch.testing.assert_close(sampled, recomputed, atol=1e-5, rtol=1e-5)


def _sampled_and_training_logprobs(model, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fast sampler's log-probs of its K completions of the family's prompts (seed 0), and the training pass's
    log-probs of the same tokens with the same images, at the real completion tokens (more than K of them)."""
    tokenizer, prompt_ids, vision = _encoded(family, model)
    torch.manual_seed(0)
    sampled = _sampler(tokenizer).sample(model, prompt_ids, K, vision=vision)
    input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)
    attention_mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
    with torch.no_grad():
        logps, _ = completion_logprobs(model, input_ids, attention_mask, sampled.completion_ids.shape[1],
                                       model_inputs=vision.model_kwargs(input_ids))
    mask = sampled.completion_mask.bool()
    assert mask.sum() > K
    return sampled.logprobs[mask], logps[mask]


def _vision_tower(model):
    return next(module for name, module in model.named_modules() if name.endswith(("vision_tower", "model.visual")))


def _count_images(model, calls):
    """Record the leading size of every input of the vision tower (images, LLaVA-NeXT's tiles, Qwen-VL's patches)."""
    _vision_tower(model).register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((args or (kwargs["pixel_values"],))[0].shape[0]), with_kwargs=True)


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "llava", "qwen2_vl"])
def test_the_prefill_runs_each_prompts_images_once_and_the_fallback_each_rows(family, monkeypatch):
    """One vision-tower call of N images for N prompts x K completions; cache layers that cannot repeat rows
    take one prefill per completion, each with its own image (Qwen2-VL: and its own rope delta), and sample the
    same tokens."""
    model = standin_vlms.model(family).eval()
    tokenizer, prompt_ids, vision = _encoded(family, model)
    calls = []
    _count_images(model, calls)
    shared = _sampler(tokenizer, do_sample=False).sample(model, prompt_ids, K, vision=vision)
    once = 3 if family not in QWEN_VL else sum(int(p["image_grid_thw"].prod()) for p in vision.per_prompt)  # patches
    assert calls == [once], calls

    calls.clear()
    monkeypatch.setattr(fast_module, "can_repeat_rows", lambda cache: False)
    per_row = _sampler(tokenizer, do_sample=False).sample(model, prompt_ids, K, vision=vision)
    assert calls == [once * K], calls
    assert torch.equal(shared.completion_ids, per_row.completion_ids)
    torch.testing.assert_close(shared.logprobs, per_row.logprobs, atol=1e-5, rtol=1e-5)


def test_the_image_token_is_never_sampled():
    """Scores that put almost all the mass on the image token: neither greedy nor sampled decoding draws it, and the
    log-prob returned is the unfiltered one (the training pass does not suppress it)."""
    logits = torch.zeros(4, 10)
    logits[:, 7] = 30.0
    for do_sample in (False, True):
        for top_k in (0, 3):
            sampler = FastSampler(pad_token_id=0, eos_token_ids=[1], max_new_tokens=1, do_sample=do_sample, top_k=top_k)
            token, logprob = sampler._next_token(logits, suppressed=7)
            assert not (token == 7).any(), (do_sample, top_k, token)
            torch.testing.assert_close(logprob, torch.log_softmax(logits, -1).gather(1, token[:, None]).squeeze(1))
    assert (FastSampler(pad_token_id=0, eos_token_ids=[1], max_new_tokens=1, do_sample=False)
            ._next_token(logits)[0] == 7).all()  # without it, the image token wins



def test_the_decode_loop_never_draws_the_image_token_a_model_prefers():
    """End to end through `sample`: a LLaVA whose head puts nearly all the mass on the image token (a hook adds 50
    to its logit) still never gets it drawn, greedy or sampled, when the prompts carry images."""
    model = standin_vlms.model("llava").eval()
    tokenizer, prompt_ids, vision = _encoded("llava", model)
    image_token = vision.image_token_id

    def prefer_the_image_token(module, inputs, output):
        output[..., image_token] += 50.0
        return output

    model.lm_head.register_forward_hook(prefer_the_image_token)
    for do_sample in (False, True):
        sampled = _sampler(tokenizer, do_sample=do_sample).sample(model, prompt_ids, K, vision=vision)
        drawn = sampled.completion_ids[sampled.completion_mask.bool()]
        assert drawn.numel() > 0 and not (drawn == image_token).any(), (do_sample, drawn)


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=4, max_prompt_length=512, learning_rate=1e-3, beta=0.1, max_steps=1,
                  logging_steps=1, save_steps=0, seed=0, report_to="none")
    return RLOOConfig(**{**values, **overrides})


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trainer_with_images_and_no_sampler_set_trains_with_the_fast_sampler(tmp_path, family):
    """As a TRL VLM script runs: no sampler named. The sampling pass runs each prompt's images once (2 prompts), the
    reference pass too where the model shares image prompts (`shares_image_prompts`: LLaVA, Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL), else each row's (2 x K=2), and the training pass each row's; pi_old is the sampler's log-probs (fp32,
    1 iteration)."""
    model = standin_vlms.model(family)
    calls = []
    _count_images(model, calls)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RLOOTrainer(model, _length_reward, args=_config(tmp_path), train_dataset=standin_vlms.image_dataset(4),
                          processing_class=standin_vlms.processor(family))
    assert isinstance(trainer.sampler, FastSampler)
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if "language_model" in n)
    if family in QWEN_VL:  # the tower counts patches, which differ per image: the prefill runs half the rows' (K=2),
        # or all of them where the cache cannot copy rows (Qwen3.5's linear-attention layers: a prefill per completion)
        prefill_rows = 2 if fast_module.can_repeat_rows(append_in_place_cache(model.config, room=1)) else 4
        reference_rows = 2 if shares_image_prompts(model) else 4
        assert len(calls) == 3 and calls[2] == 4 // prefill_rows * calls[0], calls
        assert calls[1] == reference_rows // 2 * calls[2] // 2, calls
        calls.clear()
        assert "eval/reward" in trainer.evaluate(standin_vlms.image_dataset(3, seed=1))
        assert len(calls) == 2, calls  # the eval prefills (2 prompts, then 1)
        return
    per_image = 5 if family == "llava_next" else 1  # LLaVA-NeXT's image is 5 tiles here
    reference_rows = 2 if shares_image_prompts(model) else 4  # Qwen3.5 (linear attention): every row whole
    assert calls == [2 * per_image, reference_rows * per_image, 4 * per_image], calls
    calls.clear()
    assert "eval/reward" in trainer.evaluate(standin_vlms.image_dataset(3, seed=1))
    assert calls == [2 * per_image, per_image], calls  # the eval prefills (2 prompts a batch): each image once


def test_models_with_3d_positions_not_verified_are_refused_by_the_fast_sampler(tmp_path, monkeypatch):
    """A model with `get_rope_index` whose type is not in mrope.VERIFIED_MODEL_TYPES (here Qwen2-VL taken off the
    list) is refused by name, by the sampler and by the trainer; the verified ones and LLaVA are not."""
    model = standin_vlms.model("qwen2_vl")
    assert fast_module.positions_are_3d(model) and not fast_module.positions_are_3d(standin_vlms.model("llava"))
    fast_module.refuse_3d_positions(model)  # verified: no error
    monkeypatch.setattr(mrope, "VERIFIED_MODEL_TYPES", ("qwen2_5_vl", "qwen3_vl"))
    tokenizer, prompt_ids, vision = _encoded("qwen2_vl", model)
    with pytest.raises(ConfigError, match="'qwen2_vl'.*3-D rotary positions.*sampler='generate'"):
        _sampler(tokenizer).sample(model, prompt_ids, K, vision=vision)
    with pytest.raises(ConfigError, match="3-D rotary positions.*sampler='generate'"):
        RLOOTrainer(model, _length_reward, args=_config(tmp_path), train_dataset=standin_vlms.image_dataset(4),
                    processing_class=standin_vlms.processor("qwen2_vl"))
