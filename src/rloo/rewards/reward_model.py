"""Reward models: a sequence classifier with one output, behind the reward-function interface.

`RewardModel(model, tokenizer)(prompts, completions)` returns one float per completion, so the
trainer treats a reward model like any other reward function. Each prompt + completion is
written out with the reward model's own tokenizer: conversational prompts (lists of messages)
go through its chat template with the completion as the assistant's message; plain prompts are
concatenated with the completion. Scoring is batched, without gradients, on the model's device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from rloo.config import ConfigError
from rloo.data.prompts import is_conversational


class RewardModel:
    """A sequence-classification model (num_labels=1) scoring prompt + completion pairs.

    Args:
        model: an `AutoModelForSequenceClassification` with `num_labels == 1`.
        tokenizer: the reward model's tokenizer (its chat template renders conversations).
        batch_size: completions per forward pass.
        name: the name in logs (`rewards/{name}/mean`); defaults to the model's directory name.

    Example:
        >>> rm = RewardModel.from_pretrained("path/to/reward-model", device="cuda")  # doctest: +SKIP
        >>> rm(prompts=["2+2="], completions=["4"])  # doctest: +SKIP
        [1.37]
    """

    def __init__(self, model: PreTrainedModel, tokenizer: Any, batch_size: int = 32, name: str | None = None) -> None:
        num_labels = getattr(model.config, "num_labels", None)
        if num_labels != 1:
            raise ValueError(f"a reward model must output one score per sequence (num_labels=1); this one has "
                             f"num_labels={num_labels}. Load it with AutoModelForSequenceClassification(num_labels=1).")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            # The classifier reads the last non-pad token; it needs to know which id pads.
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.__name__ = name or Path(str(model.config._name_or_path or "reward_model")).name or "reward_model"

    @classmethod
    def from_pretrained(cls, path: str, tokenizer: Any = None, device: str | torch.device | None = None,
                        dtype: torch.dtype | str = "auto", batch_size: int | None = None,
                        name: str | None = None, **init_kwargs: Any) -> "RewardModel":
        """Load a reward model (and, unless given, its tokenizer) from a model id or local path;
        `init_kwargs` (attn_implementation, revision, trust_remote_code, ...) go to `from_pretrained`."""
        from rloo.model_loading import from_pretrained, load_tokenizer

        init_kwargs.setdefault("trust_remote_code", False)
        model = from_pretrained(AutoModelForSequenceClassification.from_pretrained, path, "reward model", num_labels=1,
                                dtype=dtype, **init_kwargs)
        if device is not None:
            model = model.to(device)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path, "reward model")
        options = {k: v for k, v in dict(batch_size=batch_size, name=name).items() if v is not None}
        return cls(model, tokenizer, **options)

    def texts(self, prompts: list, completions: list) -> list[str]:
        """Each prompt + completion as the reward model reads it."""
        texts = []
        for prompt, completion in zip(prompts, completions):
            if is_conversational(prompt):
                messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
                texts.append(self.tokenizer.apply_chat_template(prompt + messages, tokenize=False))
            else:
                texts.append(prompt + completion)
        return texts

    def encode(self, texts: list[str], prompts: list) -> Any:
        """Right-padded ids of `texts`: a plain text gets the tokenizer's default special tokens (its BOS),
        a chat-templated one none (the template wrote them; adding would double the BOS)."""
        ids = [self.tokenizer(text, add_special_tokens=not is_conversational(prompt))["input_ids"]
               for text, prompt in zip(texts, prompts)]
        return self.tokenizer.pad({"input_ids": ids}, return_tensors="pt", padding=True, padding_side="right")

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.encode(texts[start : start + self.batch_size], prompts[start : start + self.batch_size])
            batch = batch.to(device)
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            scores.extend(logits[:, 0].float().tolist())
        return scores


def as_reward_model(spec: str | PreTrainedModel, tokenizer: Any = None, device: str | torch.device | None = None,
                    model_init_kwargs: dict | None = None) -> RewardModel:
    """A RewardModel from a model id/path (loaded with `model_init_kwargs`) or a loaded PreTrainedModel
    (moved to `device`)."""
    if isinstance(spec, str):
        path = Path(spec).expanduser()
        if not path.exists() and (spec.startswith((".", "/", "~")) or len(path.parts) > 2 or spec.endswith("/")):
            raise ConfigError(f"reward model path {spec!r} does not exist; give a local reward model directory "
                              f"(save_pretrained), a Hub id (org/name), or a reward function.")
        kwargs = dict(model_init_kwargs or {})
        kwargs.pop("quantization_config", None)  # QLoRA quantizes the trained policy only
        return RewardModel.from_pretrained(spec, tokenizer=tokenizer, device=device, **kwargs)
    model = spec.to(device) if device is not None else spec
    if tokenizer is None:
        from rloo.model_loading import load_tokenizer

        tokenizer = load_tokenizer(model.config._name_or_path, "reward model")
    return RewardModel(model, tokenizer)
