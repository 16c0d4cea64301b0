"""Tiny Gemma 3, Gemma 4, LLaVA, LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and Qwen3.5-MoE models (random float32
weights) with their real processor classes, from the TRL-suite stand-ins (benchmarks/trl_suite/vlm_standins.py), and a small image
data set, for the image-path tests."""

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

FAMILIES = {"gemma3": "tiny-Gemma3ForConditionalGeneration", "gemma4": "tiny-Gemma4ForConditionalGeneration",
            "llava": "tiny-LlavaForConditionalGeneration",
            "llava_next": "tiny-LlavaNextForConditionalGeneration",
            "qwen2_vl": "tiny-Qwen2VLForConditionalGeneration", "qwen2_5_vl": "tiny-Qwen2_5_VLForConditionalGeneration",
            "qwen3_vl": "tiny-Qwen3VLForConditionalGeneration", "qwen3_5": "tiny-Qwen3_5ForConditionalGeneration",
            "qwen3_5_moe": "tiny-Qwen3_5MoeForConditionalGeneration"}
# Not one of TRL's test ids (so not in the TRL-suite stand-ins): Qwen3-VL, interleaved multimodal RoPE, 16-pixel patches.
QWEN3_VL = vlm_standins.VLMStandIn(
    "tiny-Qwen3VLForConditionalGeneration", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor",
    "Qwen2VLImageProcessorPil", None, vlm_standins.QWEN2_VL_TOKENS, image_processor_kwargs={"patch_size": 16},
    config={"text_config": {**vlm_standins.TEXT, "head_dim": 8, "vocab_size": 151936, "rope_parameters": {
        "rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True, "rope_theta": 5e6}},
        "vision_config": {"depth": 2, "hidden_size": 16, "num_heads": 4, "intermediate_size": 32, "out_hidden_size": 16,
                          "deepstack_visual_indexes": [1], "num_position_embeddings": 64}})

# Qwen3.5 (and its MoE), not buildable from TRL's ids here either: a linear-attention layer (Gated DeltaNet, whose cache
# cannot copy rows) then a full-attention one, interleaved multimodal RoPE, Qwen3-VL's processor with Qwen3.5's ids.
_QWEN3_5_TEXT = {**vlm_standins.TEXT, "head_dim": 8, "vocab_size": 248320, "eos_token_id": 248046, "pad_token_id": 248044,
                 "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
                 "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                 "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True,
                                     "rope_theta": 1e7, "partial_rotary_factor": 1.0}}
_QWEN3_5_VISION = {"depth": 2, "hidden_size": 16, "num_heads": 4, "intermediate_size": 32, "out_hidden_size": 16,
                   "num_position_embeddings": 64}
QWEN3_5 = vlm_standins.VLMStandIn(
    "tiny-Qwen3_5ForConditionalGeneration", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration", "Qwen3VLProcessor",
    "Qwen2VLImageProcessorPil", None, vlm_standins.QWEN35_TOKENS, image_processor_kwargs={"patch_size": 16},
    config={"text_config": _QWEN3_5_TEXT, "vision_config": _QWEN3_5_VISION})
QWEN3_5_MOE = vlm_standins.VLMStandIn(
    "tiny-Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration",
    "Qwen3VLProcessor", "Qwen2VLImageProcessorPil", None, vlm_standins.QWEN35_TOKENS,
    image_processor_kwargs={"patch_size": 16},
    config={"text_config": {**_QWEN3_5_TEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                            "shared_expert_intermediate_size": 16}, "vision_config": _QWEN3_5_VISION})


def _image_only_processor(standin: vlm_standins.VLMStandIn, image_processor_class: str):
    """The family's real processor class with a PIL (slow) image processor and no video processor.

    Its default video processor and `BaseVideoProcessor` (which the processor's constructor checks its
    video_processor argument against, even when None) need torchvision, which is not installed here;
    the image path never touches the video processor, so the check is skipped for a missing one.
    Qwen-VL's take Qwen2VLImageProcessorPil; Gemma 4's, Gemma4ImageProcessorPil and its audio feature extractor."""
    base = getattr(transformers, standin.processor_class)

    class ImageOnly(base):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

        def save_pretrained(self, save_directory, **kwargs):  # ProcessorMixin's would save the missing video processor
            self.tokenizer.save_pretrained(save_directory)
            self.image_processor.save_pretrained(save_directory)

    parts = {"feature_extractor": getattr(transformers, standin.feature_extractor_class)()} \
        if standin.feature_extractor_class else {}
    return ImageOnly(image_processor=getattr(transformers, image_processor_class)(**standin.image_processor_kwargs),
                     tokenizer=vlm_standins.build_tokenizer(standin.tokenizer), video_processor=None,
                     chat_template=standin.tokenizer.chat_template, **parts, **standin.processor_kwargs)


def _standin(family: str) -> vlm_standins.VLMStandIn:
    return next(s for s in [*vlm_standins.VLM_STANDINS, QWEN3_VL, QWEN3_5, QWEN3_5_MOE] if s.name == FAMILIES[family])


@functools.lru_cache(maxsize=None)
def processor(family: str):
    if family.startswith("qwen"):
        return _image_only_processor(_standin(family), "Qwen2VLImageProcessorPil")
    if family == "gemma4":
        return _image_only_processor(_standin(family), "Gemma4ImageProcessorPil")
    return vlm_standins.build_processor(_standin(family))


def model(family: str, seed: int = 0, **text_config) -> torch.nn.Module:
    """A fresh float32 model of the family's conditional-generation class, seeded random weights; `text_config`
    overrides fields of its language model's config (e.g. sliding_window=None)."""
    standin = _standin(family)
    config = getattr(transformers, standin.config_class)(**standin.config)
    text = config.get_text_config()
    for name, value in text_config.items():
        setattr(text, name, value)
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    torch.manual_seed(seed)  # the weights init_small_weights leaves alone (convolutions) come from the global RNG
    built = getattr(transformers, standin.model_class)(config)
    vlm_standins.init_small_weights(built, seed)
    for parameter in built.parameters():  # Gemma 3's projector is a bare zero-initialised matrix: the image would not count
        if parameter.dim() >= 2 and not parameter.any():
            torch.nn.init.xavier_uniform_(parameter.data)
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
