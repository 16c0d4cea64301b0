"""Qwen-VL's multimodal rotary positions (3-D: time, row, column for image tokens) in rloo's log-prob passes and in
the fast sampler's decode loop (passes.mrope).

The reference is the model's own plain forward on each unpadded row, built here by hand (the processor and the
model, no rloo code); rloo's rows are left-padded prompts of different lengths and right-padded completions."""

from __future__ import annotations

import pytest
import standin_vlms
import torch
from test_image_path import _config, _length_reward

from rloo import RLOOTrainer
from rloo.data.images import ImagePromptEncoder, image_token_id
from rloo.generation import FastSampler
from rloo.generation.fast import can_repeat_rows
from rloo.generation.kv_cache import append_in_place_cache
from rloo.passes import mrope
from rloo.passes.logprobs import completion_logprobs, computes_own_positions

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe"]


def _rows():
    from PIL import Image

    sizes, texts = [(56, 84), (28, 28), (84, 56)], ["How many squares are there in this picture?", "Count.", "Hi"]
    images = [Image.new("RGB", size, color=(40 * i, 200 - 50 * i, 90)) for i, size in enumerate(sizes)]
    for i, image in enumerate(images):
        image.putpixel((i, i), (255, 255, 255))
    return [{"prompt": [{"role": "user", "content": text}], "image": image} for text, image in zip(texts, images)]


def _reference_logprobs(model, processor, row, completion: list[int]) -> torch.Tensor:
    """(C,) log-probs of `completion` after the row's prompt, from the model's own forward on the unpadded row."""
    messages = [{"role": "user", "content": [{"type": "image", "image": row["image"]},
                                             {"type": "text", "text": row["prompt"][0]["content"]}]}]
    encoded = processor.apply_chat_template([messages], add_generation_prompt=True, tokenize=True, return_dict=True,
                                            return_tensors="pt")
    ids = torch.cat([encoded["input_ids"], torch.tensor([completion])], dim=1)
    types = torch.cat([encoded["mm_token_type_ids"], torch.zeros(1, len(completion), dtype=torch.long)], dim=1)
    logits = model(input_ids=ids, mm_token_type_ids=types, pixel_values=encoded["pixel_values"],
                   image_grid_thw=encoded["image_grid_thw"]).logits[0, -len(completion) - 1:-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def _padded_batch(processor, model, rows, completions):
    """rloo's layout: (B, P + C) ids and mask, left-padded prompts, right-padded completions, and the VisionInputs."""
    encoder = ImagePromptEncoder(processor, "image", 4096, image_token_id(model.config, processor))
    prompt_ids, vision = encoder.encode(rows)
    pad = processor.tokenizer.pad_token_id
    width, length = max(map(len, prompt_ids)), max(map(len, completions))
    ids = [[pad] * (width - len(p)) + p + c + [pad] * (length - len(c)) for p, c in zip(prompt_ids, completions)]
    mask = [[0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c)) for p, c in zip(prompt_ids, completions)]
    return torch.tensor(ids), torch.tensor(mask), vision, length


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "training"])
def test_padded_passes_match_the_models_own_forward_row_by_row(family, grad):
    model, processor = standin_vlms.model(family), standin_vlms.processor(family)
    assert computes_own_positions(model)
    rows = _rows()
    completions = [[300, 301, 302, 303], [17, 18], [5, 6, 7]]
    ids, mask, vision, length = _padded_batch(processor, model, rows, completions)
    assert len(set(mask[:, :-length].sum(dim=1).tolist())) == 3  # three prompt lengths: left padding differs
    with torch.set_grad_enabled(grad):
        logps, _ = completion_logprobs(model, ids, mask, length, model_inputs=vision.model_kwargs(ids))
    assert logps.requires_grad == grad
    with torch.no_grad():
        for row, completion, got in zip(rows, completions, logps):
            expected = _reference_logprobs(model, processor, row, completion)
            torch.testing.assert_close(got[: len(completion)].detach(), expected, rtol=1e-4, atol=1e-4)


def test_image_tokens_get_rows_and_columns_not_their_sequence_index():
    """The check above can fail: 1-D positions (broadcast to the three axes) give other log-probs."""
    model, processor = standin_vlms.model("qwen2_vl"), standin_vlms.processor("qwen2_vl")
    row, completion = _rows()[0], [300, 301, 302, 303]
    ids, mask, vision, length = _padded_batch(processor, model, [row], [completion])
    with torch.no_grad():
        flat = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(ids.shape[1])[None],
                     **vision.model_kwargs(ids)).logits[0, -length - 1:-1]
        flat = torch.log_softmax(flat.float(), dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]
        expected = _reference_logprobs(model, processor, row, completion)
    assert not torch.allclose(flat, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_step_train_with_generate(tmp_path, family):
    """Every forward that runs the images (generate's prefill, pi_old, the reference, the training pass) gets
    no 1-D positions: none (the model builds them from
    mm_token_type_ids, which it is given) or 3-D ones (generate's prefill: (4, B, L), text positions first,
    with the images' features computed ahead as mm_encoder_outputs)."""
    model = standin_vlms.model(family)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = []
    model.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (kwargs.get("position_ids"), kwargs.get("mm_token_type_ids")))
        if kwargs.get("pixel_values") is not None or kwargs.get("mm_encoder_outputs") else None, with_kwargs=True)
    trainer = RLOOTrainer(model, _length_reward, args=_config(tmp_path, beta=0.1),
                          train_dataset=standin_vlms.image_dataset(4), processing_class=standin_vlms.processor(family))
    trainer.train()
    assert len(seen) == 4 and all(types is not None for _, types in seen)
    assert all(p is None or p.dim() == 3 for p, _ in seen), [None if p is None else p.shape for p, _ in seen]
    assert any("language_model" in n for n, p in model.named_parameters() if not torch.equal(p, before[n]))


def test_prompt_positions_and_rope_deltas_by_hand():
    """One left-padded row: pad, two text tokens, an image of 4x4 patches (2x2 after the 2x2 merge), two text
    tokens. Text runs 0, 1; the image sits at time 2, rows 2-3, columns 2-3; the text after it continues at 2 +
    max(2, 2) = 4, 5. Delta = largest position + 1 - real tokens = 6 - 8 = -2, so the next token (after 8 real
    ones) is at 8 - 2 = 6 on all three axes, then 7."""
    model = standin_vlms.model("qwen2_vl")
    image = model.config.image_token_id
    ids = torch.tensor([[0, 5, 6, image, image, image, image, 7, 8]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 1]])
    kwargs = {"mm_token_type_ids": (ids == image).long(), "image_grid_thw": torch.tensor([[1, 4, 4]])}
    positions, deltas = mrope.prompt_positions(model, ids, mask, kwargs)
    assert positions.tolist() == [[[0, 0, 1, 2, 2, 2, 2, 4, 5]],   # time
                                  [[0, 0, 1, 2, 2, 3, 3, 4, 5]],   # row
                                  [[0, 0, 1, 2, 3, 2, 3, 4, 5]]]   # column
    assert deltas.tolist() == [[-2]]
    for step, expected in enumerate([6, 7]):
        next_position = mask.sum(dim=1, keepdim=True) + step  # (B, 1): real tokens before the new one
        assert mrope.decode_positions(next_position, deltas).tolist() == [[[expected]]] * 3


def test_decode_positions_per_row():
    """(B, 1) counts and deltas -> (3, B, 1), the same on the three axes, each row its own delta."""
    got = mrope.decode_positions(torch.tensor([[10], [7], [7]]), torch.tensor([[-2], [0], [-5]]))
    assert got.shape == (3, 3, 1) and got.tolist() == [[[8], [7], [2]]] * 3


@pytest.mark.parametrize("family", FAMILIES)
def test_one_step_train_with_the_fast_sampler_gives_no_1d_positions(tmp_path, family):
    """No sampler set (as a TRL Qwen-VL script runs): the fast sampler's prefill gets the model's 3-D positions, and
    so does every decode step (text only: (3, B, 1), next = real tokens + the row's rope delta); the passes with
    images get none (the model builds them). No forward of the language model gets 1-D positions."""
    model = standin_vlms.model(family)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = []
    model.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs.get("position_ids")),
                                          with_kwargs=True)
    trainer = RLOOTrainer(model, _length_reward, args=_config(tmp_path, beta=0.1, sampler="fast"),
                          train_dataset=standin_vlms.image_dataset(4), processing_class=standin_vlms.processor(family))
    assert isinstance(trainer.sampler, FastSampler)
    trainer.train()
    shapes = [None if p is None else tuple(p.shape) for p in seen]
    decode_steps = [s for s in shapes if s is not None and s[-1] == 1]
    # the prefill, 3-D: 2 prompts, or 4 rows where the cache cannot copy rows (Qwen3.5: a prefill per completion)
    prefill_rows = 2 if can_repeat_rows(append_in_place_cache(model.config, room=1)) else 4
    assert shapes[0] is not None and shapes[0][:2] == (3, prefill_rows), shapes
    assert decode_steps and all(s == (3, 4, 1) for s in decode_steps), shapes  # 2 prompts x K=2 rows
    assert all(s is None or len(s) == 3 for s in shapes), shapes
    assert any("language_model" in n for n, p in model.named_parameters() if not torch.equal(p, before[n]))
