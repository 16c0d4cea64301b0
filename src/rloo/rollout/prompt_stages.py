"""Step 1 of the loop behind one seam: one process's dataset rows -> K sampled completions of each.

A `PromptStage` is chosen once, when the trainer is built (`prompt_stage`):

    TextPrompts                  the prompts tokenized (chat template for conversations)
    ImagePrompts                 the prompts and their images rendered by the processor (`data.images`)
    multi_turn.MultiTurnRollout  turns of sampling and tool calls (tools, environments, a rollout_func)

Each receives a `SamplePolicy`, the function that samples the policy (`RolloutCollector.sample_ids`:
K completions of each token list, cut at stop strings, at most `max_new_tokens` when given), and owns
its token budgets; none sees the collector, the trainer or the sampler, and none changes the sampler.
The multi-turn stage also returns the trajectories' `Episodes`, which step 2 scores; the others return None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rloo.config import ConfigError, RLOOConfig
from rloo.data.images import ImagePromptEncoder, VisionInputs, image_column, image_token_id, is_processor
from rloo.data.prompts import tokenize_prompts
from rloo.generation import FastSampler, GenerateSampler
from rloo.generation.base import SampledBatch
from rloo.generation.fast import refuse_3d_positions
from rloo.passes import mrope

if TYPE_CHECKING:
    from rloo.rollout.multi_turn import Episodes, MultiTurnRollout


class SamplePolicy(Protocol):
    """Samples the policy: K completions of each token list (`RolloutCollector.sample_ids`). The collector's
    (`turns.PolicySampling`) also has `turns()`, how a multi-turn rollout samples its turns (`turns.turn_sampler`)."""

    def __call__(self, prompt_ids: list[list[int]], num_generations: int, vision: VisionInputs | None = None,
                 max_new_tokens: int | None = None) -> SampledBatch:
        ...


class PromptStage(Protocol):
    """Rows -> a `SampledBatch` of len(rows) * K rows (groups contiguous), and the trajectories' `Episodes` or None."""

    image_column: str | None  # the dataset column whose images the prompts carry (logged with log_multimodal)

    def sample(self, rows: list[dict[str, Any]], num_generations: int,
               sample_policy: SamplePolicy) -> tuple[SampledBatch, Episodes | None]:
        ...

    def for_sampler(self) -> PromptStage:
        """The stage async_rollouts' sampler runs: one with its own state where the stage keeps any."""
        ...


@dataclass
class TextPrompts:
    """Each row's "prompt" tokenized (`data.prompts.tokenize_prompts`), cut to max_prompt_length when asked."""

    tokenizer: Any
    max_prompt_length: int | None
    chat_template_kwargs: dict[str, Any] | None
    image_column = None

    def sample(self, rows: list[dict[str, Any]], num_generations: int,
               sample_policy: SamplePolicy) -> tuple[SampledBatch, None]:
        prompt_ids = tokenize_prompts([row["prompt"] for row in rows], self.tokenizer, self.max_prompt_length,
                                      self.chat_template_kwargs)
        return sample_policy(prompt_ids, num_generations), None

    def for_sampler(self) -> TextPrompts:
        return self


@dataclass
class ImagePrompts:
    """Each row's conversation and images rendered through the processor (`data.images.ImagePromptEncoder`)."""

    encoder: ImagePromptEncoder

    @property
    def image_column(self) -> str:
        return self.encoder.column

    def sample(self, rows: list[dict[str, Any]], num_generations: int,
               sample_policy: SamplePolicy) -> tuple[SampledBatch, None]:
        prompt_ids, vision = self.encoder.encode(rows)
        return sample_policy(prompt_ids, num_generations, vision), None

    def for_sampler(self) -> ImagePrompts:
        return self


def prompt_stage(args: RLOOConfig, processing_class: Any, tokenizer: Any, sampler: Any, policy: torch.nn.Module,
                 column_names: list[str], device: Any, multi_turn: MultiTurnRollout | None) -> PromptStage:
    """The multi-turn stage when given, images when the dataset has an image column, else text."""
    column = image_column(list(column_names))
    if column is not None:
        check_image_prompts(args, column, processing_class, sampler, policy, multi_turn)
        return ImagePrompts(ImagePromptEncoder(processing_class, column, args.max_prompt_length,
                                               image_token_id(policy.config, processing_class),
                                               dict(args.chat_template_kwargs or {}), device))
    if multi_turn is not None:
        return multi_turn
    return TextPrompts(tokenizer, args.max_prompt_length, args.chat_template_kwargs)


def check_image_prompts(args: RLOOConfig, column: str, processing_class: Any, sampler: Any, policy: torch.nn.Module,
                        multi_turn: MultiTurnRollout | None) -> None:
    """Refuses, by name, what the image path does not take: a tokenizer instead of a processor, a sampler other
    than `fast`, `generate` and `vllm` (and `fast`, or shared_prefix_forward, for a model with 3-D positions not
    verified here), and multi-turn rollouts (docs/vision.md)."""
    if not is_processor(processing_class):
        raise ConfigError(f"train_dataset has an {column!r} column, so the prompts carry images, and processing_class "
                          f"is {type(processing_class).__name__}, not a multimodal processor. Pass the model's "
                          f"processor: RLOOTrainer(processing_class=AutoProcessor.from_pretrained(model_id)).")
    if not (isinstance(sampler, (FastSampler, GenerateSampler)) or args.sampler == "vllm"):
        raise ConfigError(f"prompts with images are sampled by sampler='fast' (the default), 'generate' or 'vllm' only; "
                          f"the {args.sampler!r} sampler ({type(sampler).__name__}) does not take image inputs. Set "
                          f"sampler='fast' or 'generate' (docs/vision.md lists what each sampler supports).")
    if isinstance(sampler, FastSampler):
        refuse_3d_positions(policy)  # 3-D positions not verified (mrope.VERIFIED_MODEL_TYPES): sampler='generate'
    if multi_turn is not None:
        raise ConfigError("prompts with images do not run with tools, environments or a rollout_func yet; drop the "
                          f"{column!r} column or the multi-turn arguments.")
    if args.shared_prefix_forward and not mrope.positions_verified(policy):  # not in mrope.VERIFIED_MODEL_TYPES
        raise ConfigError(f"shared_prefix_forward=True with images on {type(policy).__name__} (model_type "
                          f"{mrope.model_type(policy)!r}): the shared-prefix pass gives the completion tokens their 3-D "
                          f"rotary positions (mrope) itself, which is verified for {', '.join(mrope.VERIFIED_MODEL_TYPES)} "
                          f"only; set shared_prefix_forward=False for this model (docs/vision.md).")
