"""Tiny Gemma 3, LLaVA and LLaVA-NeXT models (random float32 weights) with their real processor classes, from the
TRL-suite stand-ins (benchmarks/trl_suite/vlm_standins.py), and a small image data set, for the image-path tests.
Qwen2-VL and Qwen2.5-VL build as models only: their processors need torchvision, which is not installed here."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from datasets import Dataset, Features, Image, Value

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "trl_suite"))
import vlm_standins  # noqa: E402

FAMILIES = {"gemma3": "tiny-Gemma3ForConditionalGeneration", "llava": "tiny-LlavaForConditionalGeneration",
            "llava_next": "tiny-LlavaNextForConditionalGeneration", "qwen2_vl": "tiny-Qwen2VLForConditionalGeneration",
            "qwen2_5_vl": "tiny-Qwen2_5_VLForConditionalGeneration"}


def _standin(family: str) -> vlm_standins.VLMStandIn:
    return next(s for s in vlm_standins.VLM_STANDINS if s.name == FAMILIES[family])


@functools.lru_cache(maxsize=None)
def processor(family: str):
    return vlm_standins.build_processor(_standin(family))


def model(family: str, seed: int = 0) -> torch.nn.Module:
    """A fresh float32 model of the family's conditional-generation class, seeded random weights."""
    standin = _standin(family)
    config = getattr(transformers, standin.config_class)(**standin.config)
    text = config.get_text_config()
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    built = getattr(transformers, standin.model_class)(config)
    vlm_standins.init_small_weights(built, seed)
    for parameter in built.parameters():  # Gemma 3's projector is a bare zero-initialised matrix: the image would not count
        if parameter.dim() >= 2 and not parameter.any():
            torch.nn.init.xavier_uniform_(parameter.data)
    if vlm_standins.buildable(standin):
        tokenizer = processor(family).tokenizer
        built.generation_config.eos_token_id = tokenizer.eos_token_id
        built.generation_config.pad_token_id = tokenizer.pad_token_id
    return built


def images(count: int, seed: int = 0) -> list:
    """`count` seeded random RGB PIL images, 32 to 63 pixels a side."""
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    return [PILImage.fromarray(rng.integers(0, 256, size=(*rng.integers(32, 64, size=2), 3), dtype=np.uint8))
            for _ in range(count)]


def image_dataset(rows: int = 4, seed: int = 0) -> Dataset:
    """Conversational prompts (string content) and an `image` column of the datasets.Image feature."""
    message = [{"role": Value("string"), "content": Value("string")}]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"How many squares? {i}"}] for i in range(rows)],
                              "image": images(rows, seed), "answer": [str(i) for i in range(rows)]},
                             features=Features(prompt=message, image=Image(), answer=Value("string")))


class QwenVLParts:
    """A Qwen-VL stand-in's tokenizer and image processor, as a processor holds them; without the video processor
    (it needs torchvision), so it renders nothing: enough for checks made before any prompt is encoded."""

    def __init__(self, family: str) -> None:
        standin = _standin(family)
        self.tokenizer = vlm_standins.build_tokenizer(standin.tokenizer)
        self.image_processor = getattr(transformers, standin.image_processor_class)()
