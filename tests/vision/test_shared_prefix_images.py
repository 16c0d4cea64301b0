"""Prompts with images through the shared-prefix passes (passes.prefix_logprobs): one prefill of the distinct prompts
with their images, once each, then the K completions text-only on copies of its KV cache. The no-grad pass
(`grouped_completion_logprobs`, pi_old and pi_ref) and the training pass (`shared_prompt_logprobs`,
shared_prefix_forward) give the whole-row pass's log-probs and gradients (vision tower included), while the
vision tower sees N images, not N*K. Qwen2-VL, Qwen2.5-VL and Qwen3-VL (3-D rotary positions) included; the families
whose cache cannot be shared or whose positions are not verified keep the whole-row pass or are refused by name.
Gemma 3 (one sliding layer of 16 tokens, one full) and LLaVA-NeXT's Mistral (both layers sliding, 40 tokens) run
with windows shorter than their rows (60-89 tokens), which the attention mask applies over the copied prompt cache."""

from __future__ import annotations

import dataclasses

import pytest
import standin_vlms
import torch
from test_fast_sampler import _count_images, _encoded, _vision_tower

from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.data.images import ImagePromptEncoder, image_token_id
from rloo.passes import mrope
from rloo.passes.logprobs import completion_logprobs
from rloo.passes.prefix_logprobs import grouped_completion_logprobs, shared_prompt_logprobs, shares_image_prompts

QWEN_VL = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]  # 3-D rotary positions, full-attention caches
SHARED = ["gemma3", "gemma4", "llava", "llava_next", *QWEN_VL]
K = 3


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    """The family's stand-in; Gemma 3's and LLaVA-NeXT's sliding windows (512 and Mistral's default 4096) shrunk
    below the rows' lengths, Gemma 3's first layer sliding and its second full as the family mixes them, so that
    the windows cut into every row (they change the log-probs: checked below) while the completions still see the
    image (through the full layer, or through two 40-token windows)."""
    windows = {"gemma3": {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
               "gemma4": {"sliding_window": 16},  # its stand-in's first layer slides, its second is full
               "llava_next": {"sliding_window": 40}}
    return standin_vlms.model(family, seed, **windows.get(family, {}))


def _batch(family: str, model: torch.nn.Module, same_text: bool = False, seed: int = 0):
    """Three prompts of different lengths (left padding; Qwen-VL: grids of 8x4, 4x4 and 4x6 patches) with K random
    right-padded completions each: (prompt_ids, prompt_mask, completion_ids, completion_mask, vision), B = 3K rows.
    `same_text`: three prompts with the same text and same-sized images (the same ids), only their images differ."""
    if same_text:
        processor = standin_vlms.processor(family)
        dataset = standin_vlms.image_dataset(3)
        rows = [{"prompt": [{"role": "user", "content": "How many squares?"}],
                 "image": dataset[i]["image"].convert("RGB").resize((40, 40))} for i in range(3)]
        prompt_ids, vision = ImagePromptEncoder(processor, "image", 4096, image_token_id(model.config, processor)).encode(rows)
        assert prompt_ids[0] == prompt_ids[1] == prompt_ids[2]
        tokenizer, vision = processor.tokenizer, vision.repeat(K)
    else:
        tokenizer, prompt_ids, vision = _encoded(family, model)
    width = max(map(len, prompt_ids))
    prompt_ids_t = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompt_ids])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    gen = torch.Generator().manual_seed(seed)
    rows, length = 3 * K, 5
    completion_mask = (torch.arange(length)[None] < torch.randint(2, length + 1, (rows, 1), generator=gen)).long()
    completion_ids = torch.randint(3, 1000, (rows, length), generator=gen)  # never the image token (its id is larger)
    assert vision.image_token_id >= 1000
    completion_ids = completion_ids * completion_mask + tokenizer.pad_token_id * (1 - completion_mask)
    return (prompt_ids_t.repeat_interleave(K, 0), prompt_mask.repeat_interleave(K, 0), completion_ids, completion_mask,
            vision)


def _whole_rows(model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision, **kwargs):
    """The whole-row pass: every row [prompt | completion] with its own copy of its prompt's vision tensors."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    return completion_logprobs(model, ids, torch.cat([prompt_mask, completion_mask], 1), completion_ids.shape[1],
                               model_inputs=vision.model_kwargs(ids), **kwargs)


def _images_per_pass(family: str, vision, rows) -> int:
    """What the vision tower's input counts for the prompts of `rows` run once each: images (LLaVA-NeXT: its tiles),
    or Qwen-VL's patches."""
    prompts = sorted({vision.rows[i] for i in rows})
    if family in QWEN_VL:
        return sum(int(vision.per_prompt[p]["image_grid_thw"].prod()) for p in prompts)
    return sum(vision.per_prompt[p]["pixel_values"].shape[0] * (vision.per_prompt[p]["pixel_values"].shape[1]
                                                                 if family == "llava_next" else 1) for p in prompts)


@pytest.mark.parametrize("family", SHARED)
def test_no_grad_grouped_logprobs_equal_the_whole_row_pass_and_run_each_image_once(family):
    """(a) and (c), no grad: the same log-probs as the whole-row pass (1e-5), one vision-tower call per prefill of
    the distinct prompts' images: N in all (rows_per_pass=6: two groups, then one), N*K for the whole-row pass."""
    model = _model(family).eval()
    assert shares_image_prompts(model)
    prompt_ids, prompt_mask, completion_ids, completion_mask, vision = _batch(family, model)
    calls = []
    _count_images(model, calls)
    with torch.no_grad():
        want, _ = _whole_rows(model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision, temperature=0.7)
    assert sum(calls) == K * _images_per_pass(family, vision, range(3 * K)), calls
    calls.clear()
    got = grouped_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, K, 0.7,
                                      rows_per_pass=6, vision=vision)
    assert calls == [_images_per_pass(family, vision, range(6)), _images_per_pass(family, vision, range(6, 9))], calls
    mask = completion_mask.bool()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)
    # the images count: with every image mirrored, the whole-row log-probs move
    mirrored = dataclasses.replace(vision, per_prompt=[{**p, "pixel_values": p["pixel_values"].flip(-1)}
                                                       for p in vision.per_prompt])
    with torch.no_grad():
        other, _ = _whole_rows(model, prompt_ids, prompt_mask, completion_ids, completion_mask, mirrored, temperature=0.7)
    assert (other[mask] - want[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("family", SHARED)
def test_the_training_pass_gives_the_whole_row_logprobs_and_gradients_vision_tower_included(family):
    """(b) and (c), with grad: a micro-batch that cuts the first and last groups (rows 2-7), the same log-probs,
    entropies and gradients of every parameter as the whole-row pass, from one vision-tower call of its 3 prompts'
    images (the whole-row pass: 6 rows' copies)."""
    model = _model(family).train()
    prompt_ids, prompt_mask, completion_ids, completion_mask, vision = _batch(family, model)
    rows = slice(2, 8)
    gen = torch.Generator().manual_seed(1)
    weights_lp, weights_h = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    calls = []
    _count_images(model, calls)

    def run(forward):
        model.zero_grad(set_to_none=True)
        calls.clear()
        logps, entropy = forward()
        mask = completion_mask[rows]
        ((logps * weights_lp + entropy * weights_h) * mask).sum().backward()
        grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
        return logps.detach() * mask, entropy.detach() * mask, grads, list(calls)

    sliced = vision.slice(2, 6)
    want = run(lambda: _whole_rows(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                                   completion_mask[rows], sliced, temperature=0.7, with_entropy=True, entropy_grad=True))
    got = run(lambda: shared_prompt_logprobs(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                                             completion_mask[rows], 0.7, with_entropy=True, entropy_grad=True,
                                             vision=sliced))
    assert want[3] == [sum(_images_per_pass(family, vision, [i]) for i in range(2, 8))], want[3]
    assert got[3] == [_images_per_pass(family, vision, range(2, 8))], got[3]
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    tower = {f"{name}.{p}" for name, module in model.named_modules() if module is _vision_tower(model)
             for p, _ in module.named_parameters()}
    # every parameter the whole-row pass reaches (LLaVA's last CLIP layer and pooler feed nothing: -2 is its feature layer)
    assert got[2].keys() == want[2].keys(), set(got[2]) ^ set(want[2])
    assert any(want[2][name].abs().max() > 0 for name in tower & want[2].keys())
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_gemma4_with_layers_that_reuse_earlier_layers_keys_and_values_keeps_the_whole_rows():
    """Gemma 4's E2B/E4B layout: the last layers read the keys and values an earlier layer cached
    (num_kv_shared_layers), and transformers gives them placeholder cache layers that hold none, so there is nothing
    to copy for them: the no-grad passes run whole rows and shared_prefix_forward is refused (its fix named)."""
    import transformers

    from rloo.passes.prefix_logprobs import check_shared_prompt_model

    text = {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2}
    standin = standin_vlms._standin("gemma4")
    config = transformers.Gemma4Config(**{**standin.config, "text_config": {**standin.config["text_config"], **text}})
    model = transformers.Gemma4ForConditionalGeneration(config)
    assert not shares_image_prompts(model)
    with pytest.raises(ValueError, match="KV cache holds attention keys and values.*turn shared_prefix_forward off"):
        check_shared_prompt_model(model)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_prompts_with_the_same_ids_and_other_images_are_not_merged(family):
    """Three prompts whose ids are equal (same text, same image size) but whose images differ: both passes give
    each its own prefill, so each completion is scored against its own prompt's image."""
    model = _model(family).eval()
    prompt_ids, prompt_mask, completion_ids, completion_mask, vision = _batch(family, model, same_text=True)
    with torch.no_grad():
        want, _ = _whole_rows(model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision)
        got, _ = shared_prompt_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision=vision)
    grouped = grouped_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, K,
                                          vision=vision)
    mask = completion_mask.bool()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped[mask], want[mask], atol=1e-5, rtol=1e-5)



@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_gradient_checkpointing_of_the_shared_prefix_pass_with_images(family):
    """With gradient_checkpointing under shared_prefix_forward, rloo recomputes each decoder layer that runs on the
    `ReplayableCache` (`model_loading.checkpoint_layers`): with images in the prefill, the same log-probs and
    gradients as the whole-row pass."""
    from rloo.model_loading import checkpoint_layers

    model = _model(family).train()
    prompt_ids, prompt_mask, completion_ids, completion_mask, vision = _batch(family, model)

    def run(forward):
        model.zero_grad(set_to_none=True)
        logps, _ = forward()
        (logps * completion_mask).sum().backward()
        return logps.detach() * completion_mask, {n: p.grad.clone() for n, p in model.named_parameters()
                                                  if p.grad is not None}

    want = run(lambda: _whole_rows(model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision))
    assert checkpoint_layers(model) > 0
    got = run(lambda: shared_prompt_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                             vision=vision))
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=1e-5, rtol=1e-4, msg=name)

def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=6, num_generations=K,
                  max_completion_length=4, max_prompt_length=512, learning_rate=1e-3, beta=0.1, max_steps=1,
                  logging_steps=1, save_steps=0, seed=0, report_to="none", shared_prefix_forward=True)
    return RLOOConfig(**{**values, **overrides})


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


@pytest.mark.parametrize("family", SHARED)
def test_a_trainer_step_with_shared_prefix_forward_runs_each_image_once_per_pass(tmp_path, family):
    """(d) A 1-step train() on an image dataset with shared_prefix_forward=True (K=3, beta 0.1): the sampler's
    prefill, the reference pass and the training pass each give the vision tower one call of the 2 prompts' images,
    and the weights move, vision tower included."""
    model = _model(family)
    calls = []
    _count_images(model, calls)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RLOOTrainer(model, _length_reward, args=_config(tmp_path), train_dataset=standin_vlms.image_dataset(4),
                          processing_class=standin_vlms.processor(family))
    trainer.train()
    assert len(calls) == 3 and calls[0] == calls[1] == calls[2], calls
    if family not in QWEN_VL:
        assert calls[0] == 2 * (5 if family == "llava_next" else 1), calls  # LLaVA-NeXT: 5 tiles an image
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any("language_model" in n for n in changed)
    assert any(n.startswith(("model.vision_tower", "model.visual")) for n in changed), sorted(changed)[:5]



@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_under_lora_the_shared_reference_pass_equals_the_samplers_logprobs(tmp_path, family):
    """LoRA (adapters on the language model, B = 0 at the start): the reference is the policy with its adapters
    disabled, run on the shared-prefix path with each prompt's images once, and at the first step it is the policy
    the fast sampler drew from, so the measured KL (pi_old: the sampler's log-probs) is 0 up to float rounding."""
    from peft import LoraConfig

    model = _model(family)
    calls = []
    _count_images(model, calls)
    trainer = RLOOTrainer(model, _length_reward, args=_config(tmp_path), train_dataset=standin_vlms.image_dataset(4),
                          processing_class=standin_vlms.processor(family),
                          peft_config=LoraConfig(r=4, target_modules="all-linear"))
    trainer.train()
    assert len(calls) == 3 and calls[0] == calls[1] == calls[2], calls
    assert abs(trainer.state.log_history[0]["objective/kl"]) < 1e-5, trainer.state.log_history[0]["objective/kl"]

def test_the_whole_row_path_stays_for_caches_and_positions_that_cannot_be_shared(monkeypatch):
    """Qwen3.5 (linear attention), Gemma 3 under flash attention (its window applied by the kernel) and a
    3-D-position model not in mrope.VERIFIED_MODEL_TYPES run their no-grad passes whole; the stand-ins above share,
    Gemma 3 and the LLaVA-NeXT stand-in as TRL builds it (sliding windows of 512 and 4096) included."""
    for family in ["gemma3", "llava_next"]:
        assert shares_image_prompts(standin_vlms.model(family)), family
    assert not shares_image_prompts(standin_vlms.model("qwen3_5"))
    gemma = standin_vlms.model("gemma3")
    gemma.config.get_text_config()._attn_implementation = "flash_attention_2"
    assert not shares_image_prompts(gemma)
    qwen = _model("qwen2_vl")
    assert shares_image_prompts(qwen)
    monkeypatch.setattr(mrope, "VERIFIED_MODEL_TYPES", ("qwen2_5_vl", "qwen3_vl"))
    assert not shares_image_prompts(qwen)


@pytest.mark.parametrize("family", ["gemma3", "llava_next"])
def test_the_window_cuts_into_the_rows_of_the_sliding_window_stand_ins(family):
    """The windows above matter: the same weights with full attention give other whole-row log-probs, so the
    shared passes' equality with the whole rows covers the window applied over the copied prompt."""
    model = _model(family).eval()
    prompt_ids, prompt_mask, completion_ids, completion_mask, vision = _batch(family, model)
    full_attention = {"layer_types": ["full_attention"] * 2} if family == "gemma3" else {"sliding_window": None}
    unwindowed = standin_vlms.model(family, **full_attention).eval()
    unwindowed.load_state_dict(model.state_dict())
    with torch.no_grad():
        want, _ = _whole_rows(model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision)
        full, _ = _whole_rows(unwindowed, prompt_ids, prompt_mask, completion_ids, completion_mask, vision)
    mask = completion_mask.bool()
    assert (full[mask] - want[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["qwen3_5", "qwen2_vl_unverified"])
def test_shared_prefix_forward_is_refused_by_name_where_it_cannot_run(tmp_path, family, monkeypatch):
    """(e) shared_prefix_forward=True with images: Qwen3.5's linear-attention cache holds no keys to copy, and a
    model with 3-D positions not verified here (Qwen2-VL taken off the list) would get its completion positions from
    an unverified rule; each is refused with the fix (turn it off)."""
    sampler = {}
    if family == "qwen2_vl_unverified":
        monkeypatch.setattr(mrope, "VERIFIED_MODEL_TYPES", ("qwen2_5_vl", "qwen3_vl"))
        family, sampler = "qwen2_vl", {"sampler": "generate"}  # the fast sampler refuses it first (sampler='generate')
        error, match = ConfigError, ("shared_prefix_forward=True with images on Qwen2VLForConditionalGeneration "
                                     r"\(model_type 'qwen2_vl'\).*3-D rotary positions.*shared_prefix_forward=False")
    else:
        error, match = ValueError, "shared_prefix_forward needs a decoder whose KV cache holds attention keys.*off"
    with pytest.raises(error, match=match):
        RLOOTrainer(standin_vlms.model(family), _length_reward, args=_config(tmp_path, **sampler),
                    train_dataset=standin_vlms.image_dataset(4), processing_class=standin_vlms.processor(family))
