"""Qwen-VL's multimodal rotary positions (3-D: time, row, column for image tokens) in rloo's log-prob passes.

The reference is the model's own plain forward on each unpadded row, built here by hand (the processor and the
model, no rloo code); rloo's rows are left-padded prompts of different lengths and right-padded completions."""

from __future__ import annotations

import pytest
import standin_vlms
import torch
from test_image_path import _config, _length_reward

from rloo import RLOOTrainer
from rloo.algo.logprobs import completion_logprobs, computes_own_positions
from rloo.data.images import ImagePromptEncoder, image_token_id

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


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
