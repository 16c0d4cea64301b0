"""The rollout's typed containers: `Rollout` (the tensors steps 5-6 train on, with shape comments) and
`Samples` (its text side, for the completions table), and the micro-batch padding arithmetic."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rloo.data.images import VisionInputs
from rloo.generation.base import model_token_mask


def padded_span(first: int, last: int, prompt_width: int, completion_width: int, multiple: int) -> tuple[int, int]:
    """(first, last) widened so that the kept width, prompt columns [first:prompt_width] plus
    completion columns [:last], is a multiple of `multiple`: prompt padding (columns before `first`)
    is kept first, then completion padding up to `completion_width`; a rollout narrower than that
    keeps its whole width."""
    missing = -(prompt_width - first + last) % multiple
    from_prompt = min(missing, first)
    return first - from_prompt, min(last + missing - from_prompt, completion_width)


@dataclass
class Rollout:
    """One process's generated batch: whole groups, scored and baselined.

    Rows are group-contiguous: row p*K + k is completion k of prompt p. B = prompts_per_rollout * K.
    """

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, C) right-padded
    completion_mask: torch.Tensor  # (B, C) 1 up to and including EOS (or the stop token / string)
    old_logps: torch.Tensor | None  # (B, C) log-probs at sampling time; None when the batch is used once
    ref_logps: torch.Tensor | None  # (B, C) reference log-probs, kept for kl_penalty="loss"; else None
    raw_scores: torch.Tensor  # (B,) weighted reward-function scores, as returned (logged as "reward")
    reward_columns: torch.Tensor  # (B, F) each reward function's value, NaN where it returned None
    scores: torch.Tensor  # (B,) the scores after shaping (missing_eos_penalty, normalize_rewards, clipping)
    seq_kl: torch.Tensor  # (B,) sequence KL to the reference at sampling time (zeros when beta == 0)
    rewards: torch.Tensor  # (B,) scores - beta * seq_kl (scores alone for kl_penalty="loss")
    advantages: torch.Tensor  # (B,) advantages of the rewards
    token_advantages: torch.Tensor | None  # (B, C) per-token advantages for kl_penalty="token"; else None
    has_eos: torch.Tensor  # (B,) bool, the completion ended (EOS, stop token or stop string)
    trained: torch.Tensor  # (B,) bool, the completion carries loss weight (scored, and see mask_truncated_completions)
    # Sampler/trainer mismatch (set only when the sampler returns its own log-probs, e.g. vLLM):
    is_weights: torch.Tensor | None = None  # (B, C) truncated importance weights; None when off
    mismatch: torch.Tensor | None = None  # (4,) `algo.importance.mismatch_sums` of this process
    sampler_logps: torch.Tensor | None = None  # (B, C) the engine's own log-probs, kept for off_policy_mask_threshold
    # (B, C) 1 at the model's tokens, 0 at tool / environment tokens (multi-turn); None: all the model's.
    # completion_mask says what is attended to, model_mask() what is trained on.
    tool_mask: torch.Tensor | None = None
    # The rows' image inputs (`data.images.VisionInputs`), one copy of its prompt's tensors per row; None: text only.
    vision: VisionInputs | None = None
    # (B,) long: the LoRA adapter version the engine sampled each row with (vLLM, vllm_lora_sync="adapters"), so
    # the sampler correction knows which weights pi_sampler is; None: the engine's weights are the policy's own.
    sampler_version: torch.Tensor | None = None

    def micro_batch(self, start: int, size: int, pad_to_multiple_of: int | None = None) -> "Rollout":
        """Rows [start, start + size), with padding columns that every row shares trimmed off; with
        `pad_to_multiple_of`, as few padding columns kept as make prompt + completion width a multiple
        of it (prompt padding first), as far as the rollout's own width allows."""
        rows = slice(start, start + size)
        prompt_mask = self.prompt_mask[rows]
        completion_mask = self.completion_mask[rows]
        first = int((prompt_mask.sum(0) > 0).nonzero()[0])  # first prompt column any row uses
        last = int((completion_mask.sum(0) > 0).nonzero()[-1]) + 1  # past the last completion column used
        if pad_to_multiple_of:
            first, last = padded_span(first, last, self.prompt_mask.shape[1], self.completion_mask.shape[1],
                                      pad_to_multiple_of)

        def columns(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[rows, :last]

        return Rollout(
            prompt_ids=self.prompt_ids[rows, first:],
            prompt_mask=prompt_mask[:, first:],
            completion_ids=self.completion_ids[rows, :last],
            completion_mask=completion_mask[:, :last],
            old_logps=columns(self.old_logps),
            ref_logps=columns(self.ref_logps),
            raw_scores=self.raw_scores[rows],
            scores=self.scores[rows],
            reward_columns=self.reward_columns[rows],
            seq_kl=self.seq_kl[rows],
            rewards=self.rewards[rows],
            advantages=self.advantages[rows],
            token_advantages=columns(self.token_advantages),
            has_eos=self.has_eos[rows],
            trained=self.trained[rows],
            is_weights=columns(self.is_weights),
            mismatch=self.mismatch,
            sampler_logps=columns(self.sampler_logps),
            tool_mask=columns(self.tool_mask),
            vision=None if self.vision is None else self.vision.slice(start, size),
            sampler_version=None if self.sampler_version is None else self.sampler_version[rows],
        )

    def model_mask(self) -> torch.Tensor:
        """(B, C) long: 1 at the completion tokens the model sampled (tool tokens excluded)."""
        return model_token_mask(self.completion_mask, self.tool_mask)

    def loss_mask(self) -> torch.Tensor:
        """(B, C) float: 1 for the model's completion tokens of completions that carry loss weight."""
        return self.model_mask().float() * self.trained.float().unsqueeze(-1)


@dataclass
class Samples:
    """The text side of a rollout, for the completions table: one entry per completion."""

    prompts: list  # (B,) each prompt repeated K times, as the dataset holds it
    completions: list[str]  # (B,) decoded completion text
    extra: dict[str, list] = field(default_factory=dict)  # columns reward functions added with log_extra
    metrics: dict[str, float] = field(default_factory=dict)  # means of what they logged with log_metric
    messages: list | None = None  # (B,) multi-turn: each trajectory's messages (None for a rollout_func row); else None
    turns: list | None = None  # (B,) multi-turn: each trajectory's `turn_records.TurnRecord`s (None: rollout_func row)
    images: list | None = None  # (B,) log_multimodal: each completion's prompt images, a list (TRL's _logs["images"])

    def shown(self) -> list:
        """The completions as the tables and completions.jsonl show them: a trajectory as its messages
        (read turn by turn, tool results marked, by `safe_text.display`), a single completion as its text."""
        if self.messages is None:
            return list(self.completions)
        return [text if messages is None else messages for text, messages in zip(self.completions, self.messages)]

    def turn_records(self) -> list | None:
        """(B,) each trajectory's turns as JSON (`TurnRecord.as_json`), None for a row without them; None for single
        completions (whose rows keep their look)."""
        if self.turns is None:
            return None
        return [None if records is None else [r.as_json() for r in records] for records in self.turns]
