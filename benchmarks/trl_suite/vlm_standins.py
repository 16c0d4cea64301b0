"""Local stand-ins for the vision-language Hub ids of TRL's RLOO tests, and the image data sets they load.

Each model is the conditional-generation class the Hub repository holds, built from transformers' own config
class for the family (so the image, vision-start and video token ids are the real ones) with a tiny text and
vision tower (hidden size 16, two layers) and random weights in bfloat16. Its processor is the family's real
processor class, built locally from its image processor (and video processor where the class takes one) and a
byte-level tokenizer (`standins.build_tokenizer`) whose vocabulary has the config's size, with the family's
special tokens at the config's ids, named as the processor reads them (`image_token`, `boi_token`, ...), and
a chat template that renders multimodal messages in the family's format. Nothing is downloaded.

The data sets are TRL's `zen-image` and `zen-multi-image` prompt-only configurations rebuilt from the Zen of
Python prompts (`standins.zen_lines`) with seeded random images of 32 to 63 pixels a side.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from datasets import Dataset, Features, Image, List, Value
from standins import TokenizerSpec, build_tokenizer, init_small_weights

QWEN_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN35_NOTHINK_TEMPLATE = QWEN_VL_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\\n' }}{% endif %}", "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{% endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ IMAGE }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# Gemma 4's turns: <|turn>role ... <turn|>, the assistant as "model", text parts trimmed, an image as <|image|> (the
# processor expands it to <|image> + one <|image|> per soft token + <image|>). Thinking and tools left out.
GEMMA4_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<turn|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ ' [/INST]' }}"
    "{% else %}{% if message['content'] is string %}{{ ' ' + message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ ' ' + part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "{{ ('USER: ' if message['role'] == 'user' else 'ASSISTANT: ') }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token if message['role'] == 'assistant' else ' ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

TEXT = {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 32}
QWEN_ROPE = {"rope_type": "default", "mrope_section": [1, 1]}


@dataclass
class VLMStandIn:
    """One vision-language Hub id: config, model and processor classes, the config's arguments, the tokenizer."""

    name: str
    config_class: str
    model_class: str
    processor_class: str
    image_processor_class: str
    video_processor_class: str | None
    tokenizer: TokenizerSpec
    config: dict = field(default_factory=dict)
    processor_kwargs: dict = field(default_factory=dict)
    image_processor_kwargs: dict = field(default_factory=dict)
    float32_params: tuple[str, ...] = ()  # parameters the real checkpoint keeps in float32
    needs: tuple[str, ...] = ()  # modules the processor class needs (Qwen's video processor: torchvision)
    feature_extractor_class: str | None = None  # the audio feature extractor of processors that take one (Gemma 4)


def _qwen_vl_tokens(vocab_size: int, base: int, eos: str = "<|im_end|>") -> TokenizerSpec:
    """Qwen's ChatML tokens and vision tokens, numbered from `base` (<|endoftext|>) as Qwen's tokenizers number them."""
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
             "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
             "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
    specials = {token: base + i for i, token in enumerate(names)}
    return TokenizerSpec(vocab_size, specials, eos=eos, pad="<|endoftext|>", chat_template=QWEN_VL_TEMPLATE,
                         named={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"})


QWEN2_VL_TOKENS = _qwen_vl_tokens(151936, 151643)  # <|vision_start|> 151652, <|image_pad|> 151655
QWEN35_TOKENS = _qwen_vl_tokens(248320, 248044)  # <|vision_start|> 248053, <|image_pad|> 248056, <|video_pad|> 248057
QWEN35_NOTHINK_TOKENS = TokenizerSpec(**{**QWEN35_TOKENS.__dict__, "chat_template": QWEN35_NOTHINK_TEMPLATE})
GEMMA3_TOKENS = TokenizerSpec(
    262208, {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 105, "<end_of_turn>": 106,
             "<start_of_image>": 255999, "<end_of_image>": 256000, "<image_soft_token>": 262144},
    eos="<end_of_turn>", pad="<pad>", bos="<bos>", add_bos=False,
    chat_template=GEMMA_TEMPLATE.replace("IMAGE", "'<start_of_image>'"),
    named={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
GEMMA4_TOKENS = TokenizerSpec(  # Gemma 4's turn markers and its image, audio and video tokens at Gemma4Config's ids
    262144, {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<|turn>": 105, "<turn|>": 106, "<|image>": 255999,
             "<|audio>": 256000, "<|image|>": 258880, "<|audio|>": 258881, "<image|>": 258882, "<audio|>": 258883,
             "<|video|>": 258884},
    eos="<turn|>", pad="<pad>", bos="<bos>", chat_template=GEMMA4_TEMPLATE,
    named={"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>", "boa_token": "<|audio>",
           "eoa_token": "<audio|>", "audio_token": "<|audio|>"})  # Gemma4Processor refuses a tokenizer without boa/eoa
LLAVA_NEXT_TOKENS = TokenizerSpec(32064, {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000}, eos="</s>", pad="<unk>",
                                  bos="<s>", chat_template=MISTRAL_TEMPLATE, named={"image_token": "<image>"})

LLAVA_TOKENS = TokenizerSpec(**{**LLAVA_NEXT_TOKENS.__dict__, "chat_template": LLAVA_TEMPLATE})

LLAVA_PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]  # LLaVA-NeXT's any-resolution tiles, at 28-pixel tiles

VLM_STANDINS = [
    VLMStandIn("tiny-Qwen2VLForConditionalGeneration", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
               "Qwen2VLProcessor", "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", QWEN2_VL_TOKENS, needs=("torchvision",),
               config={"text_config": {**TEXT, "vocab_size": 151936, "rope_parameters": QWEN_ROPE,
                                       "eos_token_id": 151645, "pad_token_id": 151643},
                "vision_config": {"hidden_size": 16, "embed_dim": 64, "num_heads": 4, "depth": 2}}),
    VLMStandIn("tiny-Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
               "Qwen2_5_VLProcessor", "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor",
               QWEN2_VL_TOKENS, needs=("torchvision",),
               config={"text_config": {**TEXT, "vocab_size": 151936, "rope_parameters": QWEN_ROPE,
                                       "eos_token_id": 151645, "pad_token_id": 151643},
                "vision_config": {"hidden_size": 16, "num_heads": 4, "depth": 2, "fullatt_block_indexes": [1],
                                  "out_hidden_size": 16, "intermediate_size": 32}}),
    VLMStandIn("tiny-Gemma3ForConditionalGeneration", "Gemma3Config", "Gemma3ForConditionalGeneration",
               "Gemma3Processor", "Gemma3ImageProcessor", None, GEMMA3_TOKENS,
               {"text_config": {**TEXT, "head_dim": 4, "layer_types": None, "sliding_window": 512},
                "vision_config": {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4,
                                  "intermediate_size": 32, "image_size": 224, "patch_size": 14,
                                  "vision_use_head": False},  # as Gemma 3 checkpoints: no pooling head
                "mm_tokens_per_image": 16},
               processor_kwargs={"image_seq_length": 16},
               image_processor_kwargs={"size": {"height": 224, "width": 224}}),
    # Gemma 4 (TRL's id is built from gemma-4-E2B-it): a sliding-attention layer then a full-attention one (the family
    # interleaves them; the last is always full), per-layer inputs (PLE) of width 4, bidirectional attention among an
    # image's tokens in the sliding layers (`use_bidirectional_attention="vision"`, as Gemma 4's larger checkpoints),
    # no audio tower. Images: 16-pixel patches pooled 3x3, at most 70 soft tokens an image (the smallest budget the
    # image processor takes, as in TRL's tiny model).
    VLMStandIn("tiny-Gemma4ForConditionalGeneration", "Gemma4Config", "Gemma4ForConditionalGeneration",
               "Gemma4Processor", "Gemma4ImageProcessorPil", "Gemma4VideoProcessor", GEMMA4_TOKENS,
               {"text_config": {**TEXT, "head_dim": 4, "global_head_dim": 8, "hidden_size_per_layer_input": 4,
                                "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512,
                                "use_bidirectional_attention": "vision", "final_logit_softcapping": 30.0},
                "vision_config": {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4,
                                  "num_key_value_heads": 4, "head_dim": 4, "intermediate_size": 32,
                                  "position_embedding_size": 630},
                "audio_config": None},
               processor_kwargs={"image_seq_length": 70}, image_processor_kwargs={"max_soft_tokens": 70},
               needs=("torchvision",), feature_extractor_class="Gemma4AudioFeatureExtractor"),
    VLMStandIn("tiny-LlavaForConditionalGeneration", "LlavaConfig", "LlavaForConditionalGeneration",
               "LlavaProcessor", "CLIPImageProcessor", None, LLAVA_TOKENS,
               {"text_config": {**TEXT, "model_type": "llama", "vocab_size": 32064, "head_dim": 4, "eos_token_id": 2,
                                "bos_token_id": 1, "pad_token_id": 0},
                "vision_config": {"model_type": "clip_vision_model", "hidden_size": 16, "num_attention_heads": 4,
                                  "num_hidden_layers": 2, "intermediate_size": 32, "image_size": 28, "patch_size": 14,
                                  "projection_dim": 16},
                "image_token_index": 32000, "vision_feature_select_strategy": "default", "vision_feature_layer": -2},
               processor_kwargs={"patch_size": 14, "vision_feature_select_strategy": "default",
                                 "num_additional_image_tokens": 1},
               image_processor_kwargs={"size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28}}),
    VLMStandIn("tiny-LlavaNextForConditionalGeneration", "LlavaNextConfig", "LlavaNextForConditionalGeneration",
               "LlavaNextProcessor", "LlavaNextImageProcessor", None, LLAVA_NEXT_TOKENS,
               {"text_config": {**TEXT, "model_type": "mistral", "vocab_size": 32064, "head_dim": 4, "eos_token_id": 2,
                                "bos_token_id": 1, "pad_token_id": 0},
                "vision_config": {"model_type": "clip_vision_model", "hidden_size": 16, "num_attention_heads": 4,
                                  "num_hidden_layers": 2, "intermediate_size": 32, "image_size": 28, "patch_size": 14,
                                  "projection_dim": 16},
                "image_token_index": 32000, "image_grid_pinpoints": LLAVA_PINPOINTS,
                "vision_feature_select_strategy": "default", "vision_feature_layer": -2},
               processor_kwargs={"patch_size": 14, "vision_feature_select_strategy": "default",
                                 "num_additional_image_tokens": 1},
               image_processor_kwargs={"size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28},
                                       "image_grid_pinpoints": LLAVA_PINPOINTS}),
]


def buildable(standin: VLMStandIn) -> bool:
    """Whether this environment can build (and load) the stand-in's processor."""
    return all(importlib.util.find_spec(module) is not None for module in standin.needs)


def build_processor(standin: VLMStandIn) -> transformers.ProcessorMixin:
    tokenizer = build_tokenizer(standin.tokenizer)
    parts = {"image_processor": getattr(transformers, standin.image_processor_class)(**standin.image_processor_kwargs),
             "tokenizer": tokenizer}
    if standin.feature_extractor_class:
        parts["feature_extractor"] = getattr(transformers, standin.feature_extractor_class)()
    if standin.video_processor_class:
        parts["video_processor"] = getattr(transformers, standin.video_processor_class)()
    return getattr(transformers, standin.processor_class)(**parts, chat_template=standin.tokenizer.chat_template,
                                                          **standin.processor_kwargs)


def build_vlm(standin: VLMStandIn, target: Path) -> None:
    """Write `standin`'s config, bfloat16 weights, processor and generation config into `target`."""
    config = getattr(transformers, standin.config_class)(**standin.config)
    text = config.get_text_config()
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    model = getattr(transformers, standin.model_class)(config)
    init_small_weights(model)
    for param in model.parameters():  # matrices outside nn.Linear that start at zero (Gemma 3's mm_input_projection)
        if param.dim() >= 2 and not param.any():  # would pass no gradient to the vision tower on the first step
            torch.nn.init.xavier_uniform_(param.data)
    for name, param in model.named_parameters():
        param.data = param.data.float() if name.endswith(standin.float32_params or ("\0",)) else param.data.bfloat16()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    build_processor(standin).save_pretrained(target)
    spec = standin.tokenizer
    ends = sorted({spec.specials[spec.eos], *([text.eos_token_id] if isinstance(text.eos_token_id, int) else [])})
    transformers.GenerationConfig(eos_token_id=ends, pad_token_id=spec.specials.get(spec.pad),
                                  bos_token_id=spec.specials.get(spec.bos) if spec.bos else None,
                                  do_sample=True, temperature=0.7).save_pretrained(target)


def _random_images(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    return [rng.integers(0, 256, size=(*rng.integers(32, 64, size=2), 3), dtype=np.uint8) for _ in range(count)]


def zen_image_datasets(prompts: list[str]) -> dict[str, dict[str, dict[str, Dataset]]]:
    """{repo name: {config: {split: Dataset}}}: zen-image (one image per prompt, the text as a string) and
    zen-multi-image (one to three images placed around the text, as content parts)."""
    rng = np.random.default_rng(0)
    message = [{"role": Value("string"), "content": Value("string")}]
    one = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts],
                             "image": _random_images(rng, len(prompts))},
                            features=Features(prompt=message, image=Image()))
    rows, images = [], []
    for index, text in enumerate(prompts):
        count = 1 + index % 3
        parts = [{"type": "image", "text": None}] * count
        parts.insert(index % (count + 1), {"type": "text", "text": text})
        rows.append([{"role": "user", "content": parts}])
        images.append(_random_images(rng, count))
    part = {"type": Value("string"), "text": Value("string")}
    multi = Dataset.from_dict({"prompt": rows, "images": images},
                              features=Features(prompt=[{"role": Value("string"), "content": List(part)}],
                                                images=List(Image())))
    out = {}
    for repo, data in (("zen-image", one), ("zen-multi-image", multi)):
        split = data.train_test_split(test_size=0.1, shuffle=False)
        out[repo] = {"conversational_prompt_only": {"train": split["train"], "test": split["test"]}}
    return out


__all__ = ["VLM_STANDINS", "build_vlm", "build_processor", "zen_image_datasets"]
