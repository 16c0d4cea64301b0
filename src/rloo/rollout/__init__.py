"""Steps 1-4 of the loop: sample -> score -> shape -> KL -> advantages, into a typed `Rollout`.

`RolloutCollector.collect(rows)` takes one process's dataset rows (whole prompts) and returns
their K completions each, scored and baselined. Nothing here changes weights: the policy and the
reference are only run without grad.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from accelerate import Accelerator

from rloo.algo.advantages import compute_advantages, whiten
from rloo.algo.importance import mismatch_sums
from rloo.algo.kl import kl_penalized_reward, kl_placement, token_kl, token_kl_advantages
from rloo.algo.off_policy import kept_log_mass, sampler_correction_weights
from rloo.algo.shaping import shape_scores
from rloo.config import RLOOConfig
from rloo.data.images import VisionInputs, logged_image_files
from rloo.data.prompts import as_completions, tokenize_prompts
from rloo.distributed.sharding import full_weights_for_generation
from rloo.event_loop import EventLoop
from rloo.generation.base import SampledBatch, Sampler, length_limit, model_token_mask
from rloo.generation.stop import cut_at_stop_strings
from rloo.passes.logprobs import completion_logprobs, position_ids_from_mask
from rloo.passes.prefix_logprobs import (
    can_share_prompts,
    grouped_completion_logprobs,
    grouped_pays,
    groups_share_prompts,
    shares_image_prompts,
)
from rloo.rewards.scoring import RewardFunction, ScoredBatch, reward_arguments, score_completions
from rloo.rewards.trl_names import RewardLog
from rloo.rollout.batch import Rollout, Samples, padded_span  # noqa: F401 (the package's names)
from rloo.rollout.prompt_stages import PromptStage, TextPrompts
from rloo.rollout.turns import PolicySampling


@dataclass
class RolloutCollector:
    """Everything steps 1-4 need, fixed at construction; `collect` runs them on a batch of rows."""

    args: RLOOConfig
    accelerator: Accelerator
    model: torch.nn.Module  # the policy as accelerate prepared it
    reference: torch.nn.Module | None  # the frozen reference; None at beta 0 or under LoRA (adapters disabled)
    tokenizer: Any
    sampler: Sampler
    reward_functions: list[RewardFunction]
    reward_weights: list[float]
    # Step 1's rows -> sampled batch: text, images or multi-turn (`prompt_stages.prompt_stage`); None: text prompts
    prompt_stage: PromptStage | None = None
    trainer_state: Any = None  # what reward functions get as `trainer_state`; the trainer sets its TrainerState
    keep_old_logps: bool = False  # keep pi_old even for one step per rollout (async rollouts train off-policy)
    warned_unscored: bool = False  # the "no reward scored anything" warning was given (it is given once)
    # The run's one loop for async tools and reward functions (rloo.event_loop): the trainer makes it and hands the same
    # one to the multi-turn stage, so it lives as long as the trainer and closes with it (a collector built alone makes
    # its own); the async sampler's copy (dataclasses.replace) shares it.
    event_loop: EventLoop | None = None

    def __post_init__(self) -> None:
        if self.event_loop is None:
            self.event_loop = EventLoop(owner=self)
        if self.prompt_stage is None:
            self.prompt_stage = TextPrompts(self.tokenizer, self.args.max_prompt_length, self.args.chat_template_kwargs)

    @torch.no_grad()
    def collect(self, rows: list[dict[str, Any]], global_step: int = 0, episode: int = 0,
                global_stats: bool = True) -> tuple[Rollout, Samples]:
        """Steps 1-4 on one process's rows; `global_step` and `episode` reach reward functions as `trainer_state`.

        With `global_stats`, whitening (normalize_rewards, normalize_advantages, reinforce_pp) uses the
        statistics of every process's rows: all processes must then call `collect` together with the
        same number of rows (training does; evaluation, whose processes may hold different counts, does not).
        """
        # Steps 1-4 stay in one function (~65 lines) so that the pipeline reads top to bottom.
        args, k = self.args, self.args.num_generations
        gather = self.accelerator.gather if global_stats else None
        # 1. Sample K completions of each prompt (groups contiguous: row p*K + k), cut at stop strings.
        sampled, episodes = self.sample_rows(rows)  # with tools, each completion is a trajectory of turns

        # 2. Score every completion (messages for conversations), then shape the scores.
        scored, samples = self.score(rows, sampled, k, global_step, episode, episodes)
        raw_scores = scored.scores.to(sampled.completion_ids.device)  # (B,)
        valid = scored.valid.to(raw_scores.device)  # (B,) False where no reward function applied
        scores = shape_scores(raw_scores, sampled.has_eos, args.missing_eos_penalty, args.normalize_rewards,
                              args.reward_clip_range, valid, gather=gather)  # (B,) global stats

        # 3. Fold the KL into the reward before the baseline (kl_penalty "sequence" and "token").
        from_engine = sampled.logprobs is not None and not sampled.logprobs_from_policy
        old_logps, ref_logps, token_kls = self.kl_terms(sampled, from_engine)
        seq_kl = token_kls.sum(dim=1)  # (B,) measured in every mode, penalised in two
        kl_at = kl_placement(args.kl_penalty, args.beta)
        rewards = kl_penalized_reward(scores, seq_kl, args.beta) if kl_at.in_reward else scores  # (B,)

        # 4. Advantages within each group of K (unscored completions sit out), optionally whitened.
        # Whitening (reinforce_pp, normalize_advantages) uses the global batch's mean and std.
        advantages = compute_advantages(rewards.view(-1, k), args.advantage_estimator, valid.view(-1, k),
                                        gather=gather).view(-1)  # (B,)
        if args.normalize_advantages:
            advantages = whiten(advantages, valid, gather=gather)
        token_advantages = None
        if kl_at.token_advantages:  # each token's return counts only the KL after it
            token_advantages = token_kl_advantages(advantages, token_kls, model_token_mask(sampled.completion_mask,
                                                                                          sampled.tool_mask), args.beta)

        rollout = Rollout(
            prompt_ids=sampled.prompt_ids,
            prompt_mask=sampled.prompt_mask,
            completion_ids=sampled.completion_ids,
            completion_mask=sampled.completion_mask,
            old_logps=old_logps if args.steps_per_rollout > 1 or self.keep_old_logps else None,
            ref_logps=ref_logps if kl_at.keeps_ref_logps else None,
            raw_scores=raw_scores,
            scores=scores,
            reward_columns=scored.per_function.to(scores.device),
            seq_kl=seq_kl,
            rewards=rewards,
            advantages=advantages,
            token_advantages=token_advantages,
            has_eos=sampled.has_eos,
            trained=valid & (sampled.has_eos | (not args.mask_truncated_completions)),
            tool_mask=sampled.tool_mask, vision=sampled.vision,
        )
        if from_engine:  # the sampler is another engine: measure (and correct) the mismatch
            self.correct_engine_mismatch(rollout, old_logps, sampled)
        return rollout, samples

    def score(self, rows: list[dict[str, Any]], sampled: SampledBatch, num_generations: int, global_step: int = 0,
              episode: int = 0, episodes: Any = None) -> tuple[ScoredBatch, Samples]:
        """Decode the B = rows * num_generations completions and call every reward function on them
        (with TRL's `log_extra` / `log_metric`); returns the unshaped scores and the text side.

        Multi-turn `episodes` give each trajectory's prompt as the policy saw it, its completion as messages
        (assistant turns with their tool_calls, tool results), its `environments` and rollout_func's extra fields."""
        completion_ids = [ids[mask.bool()].tolist() for ids, mask in zip(sampled.completion_ids, sampled.completion_mask)]
        completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        prompts = [row["prompt"] for row in rows for _ in range(num_generations)]
        state = self.trainer_state if self.trainer_state is not None else {"global_step": global_step, "episode": episode}
        as_given, more_arguments, messages, turns, episode_metrics = as_completions(prompts, completions), {}, None, None, {}
        if episodes is not None:  # trajectories: the prompts the policy saw, the completions as messages
            prompts, as_given, more_arguments = episodes.reward_inputs(as_given)
            messages, turns, episode_metrics = list(episodes.messages), episodes.turns, episodes.metrics()
        arguments = {**reward_arguments(rows, prompts, as_given, completion_ids, num_generations, state),
                     **more_arguments}
        reward_log = RewardLog()
        arguments.update(log_extra=reward_log.log_extra, log_metric=reward_log.log_metric)
        scored = score_completions(self.reward_functions, self.reward_weights, arguments, len(completions),
                                   step=global_step, error_policy=self.args.reward_error_policy,
                                   warn_unscored=not self.warned_unscored, event_loop=self.event_loop,
                                   timeout=self.args.reward_timeout)
        self.warned_unscored = self.warned_unscored or not bool(scored.valid.any())  # said once per run, not per step
        if self.args.reward_error_policy == "none":
            for fn in self.reward_functions:
                reward_log.log_metric(f"rewards/{fn.name}/errors", scored.errors.get(fn.name, 0))
        metrics = {**reward_log.metrics(), **episode_metrics}
        self.log_image_files(rows, num_generations, reward_log)
        return scored, Samples(prompts=prompts, completions=completions, extra=dict(reward_log.columns), metrics=metrics,
                               messages=messages, turns=turns, images=self.logged_images(rows, num_generations))

    def logged_images(self, rows: list[dict[str, Any]], num_generations: int) -> list | None:
        """log_multimodal: each completion's prompt images as the dataset holds them, a list per completion (an
        `image` value wrapped in one), as TRL keeps them in `_logs["images"]`; None without images or logging."""
        column = self.prompt_stage.image_column
        if column is None or not self.args.log_multimodal:
            return None
        per_row = [row.get(column) if column == "images" else [row.get(column)] for row in rows]
        return [images for images in per_row for _ in range(num_generations)]

    def log_image_files(self, rows: list[dict[str, Any]], num_generations: int, reward_log: RewardLog) -> None:
        """log_multimodal: the logged completions' prompt images as files, in their "image" column (`data.images`)."""
        args = self.args
        column = self.prompt_stage.image_column
        if column is None or not (args.log_completions and args.log_multimodal and self.accelerator.is_main_process):
            return
        reward_log.columns["image"] = logged_image_files(rows, column, num_generations,
                                                         args.num_completions_to_print, args.output_dir)

    def kl_terms(self, sampled: SampledBatch, from_engine: bool
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """(B, C) log pi_old (None when nothing needs it), (B, C) log pi_ref (None at beta 0) and the
        (B, C) per-token KL, zero at padding (all zeros at beta 0).

        pi_old comes from the sampler when it ran this very policy in fp32 (`trusted_sampler_logprobs`),
        else from one no-grad pass; an engine's log-probs (vLLM) never stand in for it."""
        args, mask = self.args, model_token_mask(sampled.completion_mask, sampled.tool_mask)  # no KL at tool tokens
        old_logps = ref_logps = None
        token_kls = torch.zeros_like(mask, dtype=torch.float32)  # (B, C)
        if args.beta > 0 or args.steps_per_rollout > 1 or from_engine or self.keep_old_logps:
            old_logps = self.trusted_sampler_logprobs(sampled)
            if old_logps is None:  # the extra no-grad policy pass
                old_logps = self.logprobs(self.accelerator.unwrap_model(self.model), sampled)
        if args.beta > 0:
            with self.reference_model() as reference:
                ref_logps = self.logprobs(reference, sampled)
            token_kls = token_kl(old_logps, ref_logps, args.kl_estimator) * mask  # (B, C)
        return old_logps, ref_logps, token_kls

    def correct_engine_mismatch(self, rollout: Rollout, old_logps: torch.Tensor, sampled: SampledBatch) -> None:
        """Another engine sampled: log the gap between its log-probs and the trainer's (`mismatch`),
        and with vllm_importance_sampling_correction weight each token by the ratio kept in its band
        (`algo.off_policy.sampler_correction_weights`; the default is the capped token ratio, TIS)."""
        sampler_logps = sampled.logprobs.to(old_logps.device)
        version = getattr(sampled, "adapter_version", None)  # which adapter version pi_sampler is (LoRA on vLLM)
        if version is not None:
            rollout.sampler_version = torch.full_like(sampled.has_eos, version, dtype=torch.long)
        if self.args.top_k > 0 or self.args.top_p < 1:
            # The engine's log-probs are over its kept set (vLLM's processed_logprobs); put pi_old on the same
            # support, or every ratio carries the kept mass pi_old(S) (TRL issue 6789).
            old_logps = old_logps - self.kept_log_mass(sampled).to(old_logps.device)
        # The engine drew only the model's tokens: tool positions carry no ratio.
        cap, mask = self.args.vllm_importance_sampling_cap, model_token_mask(sampled.completion_mask,
                                                                             getattr(sampled, "tool_mask", None))
        rollout.mismatch = mismatch_sums(old_logps, sampler_logps, mask, cap)
        if self.args.off_policy_mask_threshold is not None:
            rollout.sampler_logps = sampler_logps
        if self.args.vllm_importance_sampling_correction:
            rollout.is_weights = sampler_correction_weights(old_logps, sampler_logps, mask,
                                                            self.args.vllm_importance_sampling_mode,
                                                            self.args.vllm_importance_sampling_clip_min, cap)

    def kept_log_mass(self, sampled: SampledBatch) -> torch.Tensor:
        """(B, C) log pi_old(S) at every completion position: the log of the mass the policy puts on the set a
        top_k / top_p sampler keeps there (`algo.off_policy.kept_log_mass`). One no-grad pass with full logits,
        in micro-batches of per_device_train_batch_size rows; run only when a filter is set and an engine sampled."""
        args, model = self.args, self.accelerator.unwrap_model(self.model)
        completion_length, size = sampled.completion_ids.shape[1], args.per_device_train_batch_size
        input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)  # (B, P + C)
        attention_mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
        chunks = []
        with self.accelerator.autocast():
            for start in range(0, input_ids.shape[0], size):
                rows = slice(start, start + size)
                logits = model(input_ids=input_ids[rows], attention_mask=attention_mask[rows],
                               position_ids=position_ids_from_mask(attention_mask[rows]),
                               logits_to_keep=completion_length + 1).logits[:, :-1]  # (b, C, V)
                chunks.append(kept_log_mass(logits.float() / args.temperature, args.top_k, args.top_p))
        return torch.cat(chunks) * sampled.completion_mask

    def sample_rows(self, rows: list[dict[str, Any]], num_generations: int | None = None) -> tuple[SampledBatch, Any]:
        """Step 1: K completions of each row's prompt (`prompt_stage`) and, with tools, environments or a
        rollout_func, the trajectories' `multi_turn.Episodes` (else None)."""
        return self.prompt_stage.sample(rows, num_generations or self.args.num_generations, PolicySampling(self))

    def sample(self, prompts: list, num_generations: int | None = None) -> SampledBatch:
        """K completions of each prompt (num_generations for eval), cut after the first stop string
        (which then counts as an end)."""
        args = self.args
        prompt_ids = tokenize_prompts(prompts, self.tokenizer, args.max_prompt_length, args.chat_template_kwargs)
        return self.sample_ids(prompt_ids, num_generations or args.num_generations)

    def sample_ids(self, prompt_ids: list[list[int]], num_generations: int, vision: VisionInputs | None = None,
                   max_new_tokens: int | None = None) -> SampledBatch:
        """K completions of each token list, cut after the first stop string (which then counts as an end).
        `vision`: the prompts' image inputs (one row per prompt), for samplers that take them; `max_new_tokens`:
        at most this many tokens, for samplers that take it (`generation.base.length_limit`; else all they draw)."""
        images = {} if vision is None else {"vision": vision.repeat(num_generations)}
        sampled = self.on_policy(lambda policy: self.sampler.sample(policy, prompt_ids, num_generations, **images,
                                                                    **length_limit(self.sampler, max_new_tokens)))
        sampled.vision = images.get("vision")
        return sampled

    def on_policy(self, draw: Callable[[torch.nn.Module], SampledBatch]) -> SampledBatch:
        """`draw(policy)` under autocast, with the full weights when sharded, its completions cut after the first
        stop string (which then counts as an end)."""
        args, acc = self.args, self.accelerator
        # Sharded (FSDP2 / ZeRO-3): the full weights, gathered once for the whole generation.
        with full_weights_for_generation(acc, self.model, args.ds3_gather_for_generation) as policy, acc.autocast():
            sampled = draw(policy)
        if args.stop_strings:
            sampled.completion_ids, sampled.completion_mask, sampled.has_eos = cut_at_stop_strings(
                sampled.completion_ids, sampled.completion_mask, sampled.has_eos,
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                args.stop_strings, self.tokenizer.pad_token_id)
        return sampled

    def trusted_sampler_logprobs(self, sampled: SampledBatch) -> torch.Tensor | None:
        """The sampler's (B, C) log-probs when they can stand in for the no-grad policy pass: the
        sampler returned them, num_iterations == 1, and everything runs in fp32 (no autocast), where
        they match the training pass's to ~1e-6. Under bf16/fp16 sampling they can differ by more
        than the clipping range, so the pass is kept there (docs/algorithm.md)."""
        if (not sampled.logprobs_from_policy or sampled.logprobs is None or self.args.num_iterations != 1
                or self.accelerator.mixed_precision != "no"):
            return None
        if any(p.dtype != torch.float32 for p in self.accelerator.unwrap_model(self.model).parameters()):
            return None
        return sampled.logprobs[:, : sampled.completion_ids.shape[1]].float()

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[torch.nn.Module]:
        """The frozen reference: the separate copy (sharded like the policy, `sharding.prepare_reference`),
        or under LoRA the policy with its adapters disabled (no second copy of the weights)."""
        if self.reference is not None:
            yield self.reference
        else:
            policy = self.accelerator.unwrap_model(self.model)
            with policy.disable_adapter():
                yield policy

    def logprobs(self, model: torch.nn.Module, sampled: SampledBatch) -> torch.Tensor:
        """No-grad (B, C) completion log-probs, in micro-batches of per_device_train_batch_size rows.

        Each group's prompt runs once, with its images once, and its K completions on a copy of its KV cache
        (`passes.prefix_logprobs`), the same log-probs as running every row whole. Models whose cache cannot be
        shared that way (sliding windows, linear attention), rows whose groups do not share one prompt, and rows
        with images on a model with 3-D positions not verified here (`shares_image_prompts`) run every row whole
        (with images, each with a copy of its prompt's vision tensors, `data.images`). On CUDA every row runs whole
        (`passes.prefix_logprobs.grouped_pays`: the unmasked whole rows keep SDPA's flash kernel)."""
        completion_length, size = sampled.completion_ids.shape[1], self.args.per_device_train_batch_size
        group_size, vision = self.args.num_generations, sampled.vision
        with self.accelerator.autocast():
            shared = can_share_prompts(model) if vision is None else shares_image_prompts(model)
            shared = shared and grouped_pays(sampled.completion_ids.device)
            if shared and groups_share_prompts(sampled.prompt_ids, sampled.prompt_mask, group_size, vision):
                return grouped_completion_logprobs(model, sampled.prompt_ids, sampled.prompt_mask,
                                                   sampled.completion_ids, sampled.completion_mask, group_size,
                                                   self.args.temperature, rows_per_pass=size, vision=vision)
            input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)  # (B, P + C)
            attention_mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
            chunks = []
            for start in range(0, input_ids.shape[0], size):
                ids = input_ids[start : start + size]
                logps, _ = completion_logprobs(model, ids, attention_mask[start : start + size], completion_length,
                                               self.args.temperature,
                                               model_inputs=None if vision is None else
                                               vision.slice(start, size).model_kwargs(ids))
                chunks.append(logps)
        return torch.cat(chunks)
