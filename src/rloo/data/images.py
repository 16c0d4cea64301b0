"""Images in prompts: dataset rows with an `image` or `images` column turned into the processor's inputs.

A row `{"prompt": [{"role": "user", "content": "How many squares?"}], "image": <PIL.Image>}` (or `images`: a
list) becomes a multimodal conversation, `[{"role": "user", "content": [{"type": "image", "image": ...},
{"type": "text", "text": "How many squares?"}]}]` as TRL's `prepare_multimodal_messages` builds it, and the
processor (the `processing_class`) renders it with its chat template and returns the prompt's token ids
(image tokens expanded) and its vision tensors: `pixel_values`, and whatever the family adds
(`image_sizes` for LLaVA-NeXT, `token_type_ids` for Gemma 3, `image_grid_thw` for Qwen-VL ...).

Each prompt is encoded alone, so its tensors need no padding, and `VisionInputs` keeps them per prompt next
to the prompt ids. A pass over rows (sampling, the no-grad old/reference passes, the training pass)
concatenates the tensors of each row's prompt along dim 0: a group's K completions each carry a copy of
their prompt's image tensors (K copies per group in every pass; see docs/vision.md for what that costs).
Per-token inputs (`token_type_ids`) are not carried: they are derived from the ids each pass runs
(1 at the image token), so they always match its layout.

Images are PIL images, paths, or what the `datasets.Image` feature yields (PIL images); a dict with
`bytes` or `path` (an Image feature read with decode=False) is opened too.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rloo.config import ConfigError

IMAGE_COLUMNS = ("image", "images")  # TRL's names; reward functions receive them under the same names
PER_TOKEN_INPUTS = ("token_type_ids", "mm_token_type_ids")  # derived from the ids of each pass, not carried


def image_column(column_names: list[str]) -> str | None:
    """The dataset's image column ("images" wins over "image", as in TRL), or None for a text-only dataset."""
    return next((name for name in reversed(IMAGE_COLUMNS) if name in column_names), None)


def open_image(image: Any) -> Any:
    """A PIL image (RGB) from a PIL image, a path, or a datasets.Image dict ({"bytes"} or {"path"})."""
    from PIL import Image

    if isinstance(image, dict):
        image = io.BytesIO(image["bytes"]) if image.get("bytes") is not None else image.get("path")
    if isinstance(image, (str, Path, io.BytesIO)):
        try:
            image = Image.open(image)
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot open the image {str(image)[:200]!r}: {error}. Give PIL images, paths to "
                              f"image files, or a datasets.Image column.") from error
    if not isinstance(image, Image.Image):
        raise ConfigError(f"an image is a {type(image).__name__}; give PIL images, paths to image files, or a "
                          f"datasets.Image column.")
    return image.convert("RGB") if image.mode != "RGB" else image


def row_images(row: dict[str, Any], column: str) -> list[Any]:
    """The images of one row: the `images` list, or the single `image` (none when it is None)."""
    value = row.get(column)
    if value is None:
        return []
    values = value if column == "images" else [value]
    return [open_image(image) for image in values]


def multimodal_messages(prompt: Any, images: list[Any]) -> list[dict[str, Any]]:
    """The conversation with its images in content parts (TRL's `prepare_multimodal_messages`).

    Image parts that already carry an image keep it; empty `{"type": "image"}` placeholders are filled in
    order; with no placeholder at all, the images go before the text of the first user message. Every
    string content becomes `[{"type": "text", "text": ...}]`."""
    if not isinstance(prompt, list):
        raise ConfigError("a prompt with images must be conversational (a list of {'role', 'content'} messages), "
                          "so that the processor's chat template places the images; give the raw messages, not "
                          "text with a chat template already applied.")
    messages = [{**m, "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str)
                 else [dict(part) for part in m["content"]]} for m in prompt]
    placeholders = [part for m in messages for part in m["content"]
                    if part.get("type") == "image" and part.get("image") is None]
    if not placeholders and images:
        first_user = next((m for m in messages if m["role"] == "user"), None)
        if first_user is None:
            raise ConfigError("a prompt with images has no user message to place them in.")
        placeholders = [{"type": "image"} for _ in images]
        first_user["content"] = placeholders + first_user["content"]
    if len(placeholders) != len(images):
        raise ConfigError(f"the prompt has {len(placeholders)} image placeholders but its row has {len(images)} "
                          f"images; give one image per {{'type': 'image'}} part, or no placeholders at all.")
    for part, image in zip(placeholders, images):
        part["image"] = image
    return messages


@dataclass
class VisionInputs:
    """The vision tensors of a batch's prompts, and which prompt each row belongs to.

    per_prompt[p] holds the processor's tensors for prompt p alone (leading dim: that prompt's images,
    or its patches for Qwen-VL), on the device. rows[i] is the prompt of row i (B rows, groups
    contiguous: row p*K + k belongs to prompt p). image_token_id marks the image tokens from which
    per-token inputs (Gemma 3's token_type_ids) are derived; derive_token_types says whether the model takes them.
    """

    per_prompt: list[dict[str, torch.Tensor]]
    rows: list[int]
    image_token_id: int | None = None
    derive_token_types: bool = False
    token_types_name: str = "token_type_ids"
    num_images: list[int] = field(default_factory=list)  # per prompt
    # For a vLLM engine, which takes the images themselves and expands their placeholders on its own: per prompt, its
    # images (PIL) and its token ids as the chat template renders it, image placeholders not expanded.
    images: list[list[Any]] = field(default_factory=list)
    template_ids: list[list[int]] = field(default_factory=list)

    def repeat(self, num_generations: int) -> "VisionInputs":
        """Each row repeated K times, groups contiguous (the sampler's layout)."""
        return self.select([row for row in self.rows for _ in range(num_generations)])

    def select(self, rows: list[int] | range) -> "VisionInputs":
        """The rows at positions `rows` (the prompts' tensors are shared, not copied)."""
        return VisionInputs(self.per_prompt, [self.rows[i] for i in rows], self.image_token_id,
                            self.derive_token_types, self.token_types_name, self.num_images, self.images,
                            self.template_ids)

    def slice(self, start: int, size: int) -> "VisionInputs":
        """Rows [start, start + size), as `Rollout.micro_batch` takes them."""
        return self.select(range(start, min(start + size, len(self.rows))))

    @staticmethod
    def concat(parts: list["VisionInputs"]) -> "VisionInputs":
        """The rows of several batches in order, as one (dynamic sampling's kept groups of several rounds).

        Each part's prompts that its rows use are kept (their tensors shared, not copied), renumbered in the order of
        their first row; prompts no row uses (a dropped group's) are left out."""
        first = parts[0]
        per_prompt, rows, num_images, images, template_ids = [], [], [], [], []
        for part in parts:
            if (part.image_token_id, part.derive_token_types, part.token_types_name) != (
                    first.image_token_id, first.derive_token_types, first.token_types_name):
                raise RuntimeError("vision inputs of different image encoders cannot be concatenated.")
            renumbered: dict[int, int] = {}
            for prompt in part.rows:
                if prompt not in renumbered:
                    renumbered[prompt] = len(per_prompt)
                    per_prompt.append(part.per_prompt[prompt])
                    # The per-prompt lists a batch may leave empty (a VisionInputs built without them) stay empty.
                    num_images += part.num_images[prompt: prompt + 1]
                    images += part.images[prompt: prompt + 1]
                    template_ids += part.template_ids[prompt: prompt + 1]
                rows.append(renumbered[prompt])
        return VisionInputs(per_prompt, rows, first.image_token_id, first.derive_token_types, first.token_types_name,
                            num_images, images, template_ids)

    def model_kwargs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The keyword arguments a forward over these rows takes next to `input_ids` (len(rows), T):
        every vision tensor of every row's prompt, concatenated along dim 0 (one copy per row),
        and the per-token types derived from `input_ids`."""
        if input_ids.shape[0] != len(self.rows):
            raise RuntimeError(f"vision inputs for {len(self.rows)} rows given with {input_ids.shape[0]} rows of ids.")
        kwargs = {name: torch.cat([self.per_prompt[p][name] for p in self.rows]).to(input_ids.device)
                  for name in self.per_prompt[0]}
        if self.derive_token_types:
            kwargs[self.token_types_name] = (input_ids == self.image_token_id).long()
        return kwargs


def image_token_id(model_config: Any, processor: Any) -> int | None:
    """The id of the token that stands for image features (the config's, else the processor's)."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(model_config, name, None)
        if isinstance(value, int):
            return value
    return getattr(processor, "image_token_id", None)


@dataclass
class ImagePromptEncoder:
    """Renders rows with images through the processor: `encode(rows)` -> prompt token ids and `VisionInputs`."""

    processor: Any
    column: str  # "image" or "images"
    max_prompt_length: int | None  # None: no limit
    image_token_id: int | None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    device: torch.device | str = "cpu"

    def encode(self, rows: list[dict[str, Any]]) -> tuple[list[list[int]], VisionInputs]:
        prompt_ids, per_prompt, counts, token_types, opened, template_ids = [], [], [], None, [], []
        for row in rows:
            images = row_images(row, self.column)
            messages = multimodal_messages(row["prompt"], images)
            encoded = self.processor.apply_chat_template([messages], add_generation_prompt=True, tokenize=True,
                                                         return_dict=True, return_tensors="pt",
                                                         **self.chat_template_kwargs)
            ids = encoded["input_ids"][0].tolist()
            if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
                raise ConfigError(f"a prompt with images renders to {len(ids)} tokens, more than max_prompt_length="
                                  f"{self.max_prompt_length}; prompts with images are not truncated (that would cut "
                                  f"image tokens). Raise max_prompt_length or use smaller images.")
            token_types = token_types or next((n for n in PER_TOKEN_INPUTS if n in encoded), None)
            prompt_ids.append(ids)
            counts.append(len(images))
            opened.append(images)
            template_ids.append(self.template_ids(messages))
            per_prompt.append({name: value.to(self.device) for name, value in encoded.items()
                               if name not in ("input_ids", "attention_mask", *PER_TOKEN_INPUTS)})
        return prompt_ids, VisionInputs(per_prompt, list(range(len(rows))), self.image_token_id,
                                        derive_token_types=token_types is not None,
                                        token_types_name=token_types or "token_type_ids", num_images=counts,
                                        images=opened, template_ids=template_ids)

    def template_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt's ids as its chat template renders it, each image one placeholder (not expanded): what a vLLM
        engine takes with the images, expanding the placeholders itself (given the expanded ids, vLLM 0.32 expands
        some families' placeholders a second time)."""
        text = self.processor.apply_chat_template([messages], add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)
        text = text[0] if isinstance(text, list) else text
        bos = self.processor.tokenizer.bos_token  # the processor adds special tokens unless the template starts with bos
        return self.processor.tokenizer(text, add_special_tokens=not (bos is not None and text.startswith(bos)))["input_ids"]


def is_processor(processing_class: Any) -> bool:
    """Whether `processing_class` is a multimodal processor (it holds a tokenizer and an image processor)."""
    return processing_class is not None and hasattr(processing_class, "tokenizer") and hasattr(
        processing_class, "image_processor")


# Module names of the vision side of the VLM families transformers ships (tower and projector): `connector` is
# Idefics3's and SmolVLM's projector, `embed_vision` Gemma 4's; Gemma 4's audio tower and projector (`audio_tower`,
# `embed_audio`; the E2B and E4B checkpoints have one) are kept off the language model's adapters too.
VISION_MODULES = (r".*(vision_tower|vision_model|visual|multi_modal_projector|vision_embed|connector|embed_vision"
                  r"|audio_tower|embed_audio).*")


def language_model_only(peft_config: Any, model: Any) -> Any:
    """The LoRA config with the vision tower and projector (and an audio tower) excluded, for a model that has a
    vision tower and a config that excludes nothing (a copy; the user's object is untouched). A config with
    `exclude_modules` set, even to [], is taken as given: that is how to put adapters on the vision tower too."""
    has_vision = any(name.split(".")[-1] in ("vision_tower", "visual", "vision_model") for name, _ in
                     model.named_modules())
    if not has_vision or not hasattr(peft_config, "exclude_modules") or peft_config.exclude_modules is not None:
        return peft_config
    import copy

    config = copy.copy(peft_config)
    config.exclude_modules = VISION_MODULES
    return config


def save_images(images: list[Any], folder: str | Path) -> list[str]:
    """Write each image as a PNG under `folder`, named by its content's hash (a group's K rows, and the same
    image at later steps, share one file); returns the paths relative to folder's parent ("images/<hash>.png")."""
    import hashlib

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for image in images:
        buffer = io.BytesIO()
        open_image(image).save(buffer, format="PNG")
        name = hashlib.sha256(buffer.getvalue()).hexdigest()[:16] + ".png"
        if not (folder / name).exists():
            (folder / name).write_bytes(buffer.getvalue())
        names.append(f"{folder.name}/{name}")
    return names


def logged_image_files(rows: list[dict[str, Any]], column: str, num_generations: int, num_rows: int,
                       output_dir: str | Path) -> list[list[str] | None]:
    """log_multimodal: for each of the B = rows * K completions, the files of its prompt's images (written under
    output_dir/images/) for the first `num_rows` completions (the rows the completions table shows), None after."""
    per_completion = [row.get(column) if column == "images" else [row.get(column)] for row in rows
                      for _ in range(num_generations)]
    return completion_image_files(per_completion, num_rows, output_dir)


def completion_image_files(images: list[list[Any] | None], num_rows: int,
                           output_dir: str | Path) -> list[list[str] | None]:
    """`logged_image_files` from each completion's images as `Samples.images` holds them (a list per completion, as
    the dataset holds them): the files of the first `num_rows` completions' images, None after."""
    return [save_images([image for image in (row or []) if image is not None], Path(output_dir) / "images")
            if index < num_rows else None for index, row in enumerate(images)]
