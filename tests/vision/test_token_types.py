"""Per-token image types in every pass: Gemma 3's `token_type_ids` and Gemma 4's `mm_token_type_ids` (1 at an image
token) switch on bidirectional attention among an image's tokens (Gemma 3: in every layer; Gemma 4: in its sliding
layers, full-attention layers stay causal). rloo derives them from the ids of each pass (data.images.VisionInputs).

The reference is the model's own plain forward on each unpadded row, with the types the processor itself returns
(no rloo code); rloo's rows are left-padded prompts of different lengths and right-padded completions."""

from __future__ import annotations

import pytest
import standin_vlms
import torch
from test_image_path import _config, _length_reward

from rloo import RLOOTrainer
from rloo.data.images import ImagePromptEncoder, image_token_id
from rloo.generation import FastSampler
from rloo.passes.logprobs import completion_logprobs

TYPES = {"gemma3": "token_type_ids", "gemma4": "mm_token_type_ids"}


def _rows():
    texts = ["How many squares are there in this picture?", "Count.", "Hi"]
    return [{"prompt": [{"role": "user", "content": text}], "image": image}
            for text, image in zip(texts, standin_vlms.images(3, seed=3))]


def _reference_logprobs(model, processor, row, completion: list[int], types: bool = True) -> torch.Tensor:
    """(C,) log-probs of `completion` after the row's prompt: the model's forward on the unpadded row, given every
    tensor the processor returns (its own per-token types, extended with 0 over the completion) or, with
    types=False, none of the per-token types."""
    messages = [{"role": "user", "content": [{"type": "image", "image": row["image"]},
                                             {"type": "text", "text": row["prompt"][0]["content"]}]}]
    encoded = dict(processor.apply_chat_template([messages], add_generation_prompt=True, tokenize=True,
                                                 return_dict=True, return_tensors="pt"))
    ids = torch.cat([encoded.pop("input_ids"), torch.tensor([completion])], dim=1)
    encoded.pop("attention_mask")
    for name in TYPES.values():
        if name in encoded:
            per_token = encoded.pop(name)
            if types:
                encoded[name] = torch.cat([per_token, torch.zeros(1, len(completion), dtype=torch.long)], dim=1)
    logits = model(input_ids=ids, **encoded).logits[0, -len(completion) - 1:-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "training"])
def test_padded_passes_match_the_models_own_forward_row_by_row(family, grad):
    model, processor = standin_vlms.model(family).eval(), standin_vlms.processor(family)
    rows, completions = _rows(), [[300, 301, 302, 303], [17, 18], [5, 6, 7]]
    encoder = ImagePromptEncoder(processor, "image", 4096, image_token_id(model.config, processor))
    prompt_ids, vision = encoder.encode(rows)
    assert vision.derive_token_types and vision.token_types_name == TYPES[family]
    pad = processor.tokenizer.pad_token_id
    width, length = max(map(len, prompt_ids)), max(map(len, completions))
    ids = torch.tensor([[pad] * (width - len(p)) + p + c + [pad] * (length - len(c))
                        for p, c in zip(prompt_ids, completions)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c))
                         for p, c in zip(prompt_ids, completions)])
    assert len(set(map(len, prompt_ids))) == 3  # three prompt lengths: the left padding differs
    with torch.set_grad_enabled(grad):
        logps, _ = completion_logprobs(model, ids, mask, length, model_inputs=vision.model_kwargs(ids))
    with torch.no_grad():
        for row, completion, got in zip(rows, completions, logps):
            expected = _reference_logprobs(model, processor, row, completion)
            torch.testing.assert_close(got[: len(completion)].detach(), expected, rtol=1e-5, atol=1e-5)  # 1e-6 measured
            # the check can fail: without the types, the image attends causally and the log-probs move (the tiny
            # random models measured 8e-5 to 1e-3 for Gemma 3, 3e-3 to 8e-3 for Gemma 4)
            causal = _reference_logprobs(model, processor, row, completion, types=False)
            assert (causal - expected).abs().max() > 2e-5


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
def test_every_forward_with_images_gets_the_types_of_its_own_ids(tmp_path, family):
    """A 1-step train() with the fast sampler (no sampler set, as a TRL script): its prefill, the reference's prefill
    and the training pass each get the per-token types, 1 exactly at the image tokens of the ids they run."""
    model = standin_vlms.model(family)
    image = image_token_id(model.config, standin_vlms.processor(family))
    seen = []
    model.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (kwargs["input_ids"], kwargs.get(TYPES[family]))) if kwargs.get("pixel_values") is not None else None,
        with_kwargs=True)
    trainer = RLOOTrainer(model, _length_reward, args=_config(tmp_path, beta=0.1, sampler="fast"),
                          train_dataset=standin_vlms.image_dataset(4), processing_class=standin_vlms.processor(family))
    assert isinstance(trainer.sampler, FastSampler)
    trainer.train()
    # the sampler's prefill (2 prompts), the reference's shared-prefix prefill (2 prompts), the training pass (4 rows)
    assert [ids.shape[0] for ids, _ in seen] == [2, 2, 4]
    for ids, types in seen:
        assert types is not None and torch.equal(types, (ids == image).long()) and types.sum() > 0
