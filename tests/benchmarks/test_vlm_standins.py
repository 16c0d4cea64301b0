"""benchmarks/trl_suite/vlm_standins.py: each stand-in this environment can build loads through the Auto classes TRL's
tests use, under the Hub id TRL's tests load, with the image token where the model looks for it."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "trl_suite"))

from vlm_standins import VLM_STANDINS, build_vlm, buildable  # noqa: E402

# The vision-language ids in TRL's tests/test_rloo_trainer.py (commit f2cd577), as `trl-internal-testing/<id>`.
TRL_VLM_IDS = {"tiny-Gemma3ForConditionalGeneration", "tiny-Gemma4ForConditionalGeneration",
               "tiny-LlavaForConditionalGeneration", "tiny-LlavaNextForConditionalGeneration",
               "tiny-Qwen2_5_VLForConditionalGeneration", "tiny-Qwen2VLForConditionalGeneration",
               "tiny-Qwen3_5ForConditionalGeneration-NoThink", "tiny-Qwen3_5MoeForConditionalGeneration-3.6"}


def test_every_stand_in_is_named_as_a_trl_test_id():
    assert {s.name for s in VLM_STANDINS} <= TRL_VLM_IDS


@pytest.mark.parametrize("standin", VLM_STANDINS, ids=lambda s: s.name)
def test_stand_in_loads_and_reads_an_image(standin, tmp_path):
    if not buildable(standin):
        pytest.skip(f"its processor needs {', '.join(standin.needs)}, not installed here")
    build_vlm(standin, tmp_path)
    model = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path)
    processor = transformers.AutoProcessor.from_pretrained(tmp_path)
    assert type(model).__name__ == standin.model_class and type(processor).__name__ == standin.processor_class
    assert model.dtype == torch.bfloat16
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, size=(40, 50, 3), dtype=np.uint8))
    batch = processor(images=[image], text=[text], return_tensors="pt")
    image_id = model.config.image_token_id
    assert (batch["input_ids"] == image_id).sum() > 0  # the processor writes the token the model replaces (the
    # forward below checks there are as many as the vision tower gives features)
    logits = model(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape and torch.isfinite(logits).all()
    # TRL's test_train_vlm asserts every parameter changes: each one must get a gradient from an image prompt, but for
    # what LLaVA's vision_feature_layer=-2 leaves out by design (the last encoder layer, the pooler's layer norm).
    logits.float().sum().backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    if "Llava" in standin.name:
        unused = [n for n in unused if "encoder.layers.1." not in n and "post_layernorm" not in n]
    assert unused == []
