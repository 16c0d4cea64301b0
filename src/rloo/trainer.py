"""RLOOTrainer: REINFORCE Leave-One-Out, one loop that reads top to bottom.

Each rollout on each process:
  1. takes `prompts_per_rollout` prompts and samples K = num_generations completions of each
     (cut at stop strings);
  2. scores every completion with the reward functions and shapes the scores (`shaping`);
  3. when beta > 0, folds the sequence KL to the frozen reference into the reward (kl_penalty
     "sequence" or "token"): r = score - beta * sum_t kl_t;
  4. computes advantages within each group of K (default: leave-one-out,
     A_i = r_i - (sum_j r_j - r_i) / (K - 1); see `advantages`);
  5. spends the rollout in num_iterations * num_mini_batches optimizer steps, each minimising
     -A * log pi(y|x) (PPO-style clipped ratio once the batch is off-policy), accumulating
     micro-batches with a denominator computed for the whole step;
  6. logs, checkpoints, and goes on.

Accelerate owns devices, processes, mixed precision, trackers and saved state; this file owns the
loop. The math lives in `advantages`, `kl`, `loss` and `logprobs`, each a pure tensor function.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, get_scheduler

from .advantages import compute_advantages, whiten
from .config import RLOOConfig
from .decoding import FastSampler
from .data import PromptSchedule, select_rows
from .kl import kl_penalized_reward, token_kl, token_kl_advantages
from .logprobs import completion_logprobs
from .loss import PolicyLossOutput, clipped_sequence_loss, clipped_token_loss, loss_denominator, reduce_to_sequences
from .prompts import as_completions, check_prompt_dataset, check_prompt_lengths, tokenize_prompts
from .reporting import JsonlSink, MetricsWindow, completions_table, format_metrics, print_table, write_completions
from .sampling import GenerateSampler, SampledBatch, Sampler
from .scoring import TRAINER_ARGUMENTS, build_reward_functions, reward_function_metrics, score_completions
from .shaping import shape_scores
from .stopping import cut_at_stop_strings

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
ACCELERATE_STATE = "accelerate_state"


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

    def micro_batch(self, start: int, size: int) -> "Rollout":
        """Rows [start, start + size), with padding columns that every row shares trimmed off."""
        rows = slice(start, start + size)
        prompt_mask = self.prompt_mask[rows]
        completion_mask = self.completion_mask[rows]
        first = int((prompt_mask.sum(0) > 0).nonzero()[0])  # first prompt column any row uses
        last = int((completion_mask.sum(0) > 0).nonzero()[-1]) + 1  # past the last completion column used

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
        )

    def loss_mask(self) -> torch.Tensor:
        """(B, C) float: 1 for completion tokens of completions that carry loss weight."""
        return self.completion_mask.float() * self.trained.float().unsqueeze(-1)


class RLOOTrainer:
    """Train a causal LM with RLOO.

    Args:
        model: a model id or local path (loaded with AutoModelForCausalLM) or a PreTrainedModel.
        reward_funcs: a callable or list of callables `f(prompts, completions, completion_ids, **columns)`
            returning one float (or None: does not apply) per completion. Each receives only the
            arguments its signature names. A string (model id or path) or a PreTrainedModel is a
            reward model (AutoModelForSequenceClassification, num_labels=1); see `reward_models`.
        args: the RLOOConfig.
        train_dataset: a `datasets.Dataset` with a "prompt" column (strings, or lists of chat messages);
            other columns reach reward functions.
        eval_dataset: optional prompts scored during and after training (eval/reward).
        processing_class: the tokenizer; loaded from `model` when None.
        peft_config: a peft config; the policy trains adapters and the reference is the model with
            adapters disabled, so no second copy of the weights is kept.
        reward_model: the name seed scripts use for `reward_funcs`; give one or the other.
        reward_processing_classes: the reward models' tokenizers: one, or a list aligned with
            `reward_funcs` (None for plain functions); loaded from each reward model when None.
    """

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: RLOOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        reward_model: Callable | Sequence[Callable] | None = None,
        reward_processing_classes: Any = None,
    ) -> None:
        if reward_funcs is not None and reward_model is not None:
            raise ValueError("Both reward_funcs and reward_model were given; they are the same argument. Pass one.")
        reward_funcs = reward_funcs if reward_funcs is not None else reward_model
        if reward_funcs is None:
            raise ValueError("RLOOTrainer needs reward_funcs: a function (or list) scoring each completion.")
        if train_dataset is None:
            raise ValueError("RLOOTrainer needs a train_dataset with a 'prompt' column.")
        self.args = args = args if args is not None else RLOOConfig()

        self.accelerator = Accelerator(
            mixed_precision="bf16" if args.bf16 else "fp16" if args.fp16 else "no",
            log_with=None if args.report_to == "none" else args.report_to,
            project_dir=args.output_dir,
            # Our schedule counts global optimizer steps; by default accelerate would step it once
            # per process per step and decay the learning rate num_processes times too fast.
            step_scheduler_with_optimizer=False,
        )
        set_seed(args.seed)

        # --- tokenizer and policy ---
        self.tokenizer = processing_class if processing_class is not None else AutoTokenizer.from_pretrained(
            model if isinstance(model, str) else model.config._name_or_path
        )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.tokenizer.eos_token_id is None:
            raise ValueError("The tokenizer has no eos_token; RLOO needs one to know where completions end.")

        # --- prompts: checked before any weights are loaded or sizes derived ---
        for dataset, name in ((train_dataset, "train_dataset"), (eval_dataset, "eval_dataset")):
            if dataset is not None:
                check_prompt_dataset(dataset, name)
                check_prompt_lengths(dataset, name, self.tokenizer, args.max_prompt_length, args.truncate_prompts,
                                     args.chat_template_kwargs)

        # --- policy ---
        policy = AutoModelForCausalLM.from_pretrained(model) if isinstance(model, str) else model
        if peft_config is not None:
            from peft import get_peft_model

            policy = get_peft_model(policy, peft_config)
        self._is_peft = hasattr(policy, "disable_adapter")
        if args.disable_dropout:
            for module in policy.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0.0
        if args.gradient_checkpointing:
            policy.gradient_checkpointing_enable()
            policy.config.use_cache = False

        # --- frozen reference: not loaded at all when beta == 0; adapters disabled under LoRA ---
        reference = None  # kl_penalty="loss" with beta == 0 loads none either
        if args.beta > 0 and not self._is_peft:
            reference = copy.deepcopy(policy).eval().requires_grad_(False)

        # --- optimizer and schedule ---
        self.schedule = PromptSchedule(
            num_rows=len(train_dataset),
            prompts_per_process=args.prompts_per_rollout,
            num_processes=self.accelerator.num_processes,
            seed=args.seed,
            shuffle=args.shuffle_dataset,
        )
        self.num_rollouts, self.total_steps = self._run_length()
        optimizer = self._build_optimizer(policy)
        # A model fresh from another training loop may still hold gradients; the first backward
        # would add to them.
        optimizer.zero_grad(set_to_none=True)
        warmup = args.warmup_steps or math.ceil(args.warmup_ratio * self.total_steps)
        scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=warmup,
                                  num_training_steps=self.total_steps)
        self.model, self.optimizer, self.lr_scheduler = self.accelerator.prepare(policy, optimizer, scheduler)
        self.reference = None if reference is None else self.accelerator.prepare_model(reference, evaluation_mode=True)

        # --- data and rewards ---
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.reward_functions = build_reward_functions(reward_funcs, reward_processing_classes, self.accelerator.device)
        available = set(TRAINER_ARGUMENTS) | (set(train_dataset.column_names) - {"prompt"})
        for fn in self.reward_functions:
            fn.check_available(available)
        num_funcs = len(self.reward_functions)
        self.reward_weights = list(args.reward_weights) if args.reward_weights is not None else [1.0] * num_funcs
        if len(self.reward_weights) != num_funcs:
            raise ValueError(f"reward_weights has {len(self.reward_weights)} weights for {num_funcs} reward functions.")

        sampler_class = FastSampler if args.sampler == "fast" else GenerateSampler
        self.sampler: Sampler = sampler_class(
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_ids=[self.tokenizer.eos_token_id, *(args.stop_token_ids or [])],
            max_new_tokens=args.max_completion_length,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
        )
        self.global_step = 0
        self.episode = 0
        self._sinks = [JsonlSink(Path(args.output_dir) / "metrics.jsonl")] if self.accelerator.is_main_process else []

    # ------------------------------------------------------------------ the loop

    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, float]:
        """Run the training loop; returns the last logged metrics."""
        args, acc = self.args, self.accelerator
        start_rollout = 0
        if resume_from_checkpoint:
            start_rollout = self._load_checkpoint(resume_from_checkpoint)
        if args.report_to != "none":
            acc.init_trackers(args.run_name or Path(args.output_dir).name, config=args.to_dict())
        self.model.train()
        window = MetricsWindow()
        last_metrics: dict[str, float] = {}
        progress = tqdm(total=self.total_steps, initial=self.global_step, desc="RLOO",
                        disable=not acc.is_main_process, dynamic_ncols=True)
        window_start, window_episodes = time.perf_counter(), 0

        for rollout_index in range(start_rollout, self.num_rollouts):
            rows = select_rows(self.train_dataset, self.schedule.rows(rollout_index, acc.process_index))
            rollout, samples = self._generate_and_score(rows)  # steps 1-4
            rollout_stats = self._rollout_metrics(rollout)
            episodes = rollout.scores.numel() * acc.num_processes
            self.episode += episodes
            window_episodes += episodes

            for mini_batch in self._mini_batches(rollout):  # step 5: num_iterations * num_mini_batches steps
                step_stats = self._optimizer_step(mini_batch)
                self.global_step += 1
                window.add({**rollout_stats, **step_stats})
                progress.update(1)
                progress.set_postfix(reward=f"{rollout_stats['reward']:.3f}")

                is_last = self.global_step >= self.total_steps
                if self.global_step % args.logging_steps == 0 or is_last:  # step 6
                    elapsed = time.perf_counter() - window_start
                    last_metrics = self._log(window.mean_and_reset(), window_episodes / max(elapsed, 1e-9), samples, rollout)
                    window_start, window_episodes = time.perf_counter(), 0
                if self.eval_dataset is not None and args.eval_steps > 0 and self.global_step % args.eval_steps == 0:
                    self._log_metrics(self.evaluate())
                if args.save_steps > 0 and self.global_step % args.save_steps == 0:
                    self._save_checkpoint(rollout_index)
                if is_last:
                    break
            if self.global_step >= self.total_steps:
                break

        progress.close()
        if self.eval_dataset is not None:
            last_metrics.update(self._log_metrics(self.evaluate()))
        self.save_model(args.output_dir)
        acc.end_training()
        return last_metrics

    # ------------------------------------------------------------------ steps 1-4: sample, score, baseline

    @torch.no_grad()
    def _generate_and_score(self, rows: list[dict[str, Any]]) -> tuple[Rollout, dict[str, list]]:
        args, acc = self.args, self.accelerator
        k = args.num_generations
        prompts = [row["prompt"] for row in rows]

        # 1. Sample K completions of each prompt (groups contiguous: row p*K + k), cut at stop strings.
        sampled = self._sample(prompts)
        completion_ids = [ids[mask.bool()].tolist() for ids, mask in zip(sampled.completion_ids, sampled.completion_mask)]
        completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        repeated_prompts = [p for p in prompts for _ in range(k)]

        # 2. Score every completion; dataset columns are repeated so that each completion sees its row.
        arguments: dict[str, Any] = {
            "prompts": repeated_prompts,
            "completions": as_completions(repeated_prompts, completions),  # messages for conversations
            "completion_ids": completion_ids,
            "trainer_state": {"global_step": self.global_step, "episode": self.episode},
        }
        for column in rows[0]:
            if column != "prompt":
                arguments[column] = [row[column] for row in rows for _ in range(k)]
        scored = score_completions(self.reward_functions, self.reward_weights, arguments, len(completions),
                                   step=self.global_step)
        raw_scores = scored.scores.to(sampled.completion_ids.device)  # (B,)
        valid = scored.valid.to(raw_scores.device)  # (B,) False where no reward function applied
        scores = shape_scores(raw_scores, sampled.has_eos, args.missing_eos_penalty, args.normalize_rewards,
                              args.reward_clip_range, valid)  # (B,)

        # 3. Fold the KL into the reward before the baseline (kl_penalty "sequence" and "token").
        input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)  # (B, P + C)
        attention_mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
        completion_length, mask = sampled.completion_ids.shape[1], sampled.completion_mask
        old_logps = ref_logps = None
        token_kls = torch.zeros_like(mask, dtype=torch.float32)  # (B, C)
        if args.beta > 0 or args.steps_per_rollout > 1:
            old_logps = self._batched_logprobs(acc.unwrap_model(self.model), input_ids, attention_mask, completion_length)
        if args.beta > 0:
            with self._reference_model() as reference:
                ref_logps = self._batched_logprobs(reference, input_ids, attention_mask, completion_length)
            token_kls = token_kl(old_logps, ref_logps, args.kl_estimator) * mask  # (B, C)
        seq_kl = token_kls.sum(dim=1)  # (B,) measured in every mode, penalised in two
        rewards = scores if args.kl_penalty == "loss" else kl_penalized_reward(scores, seq_kl, args.beta)  # (B,)

        # 4. Advantages within each group of K (unscored completions sit out), optionally whitened.
        advantages = compute_advantages(rewards.view(-1, k), args.advantage_estimator, valid.view(-1, k)).view(-1)  # (B,)
        if args.normalize_advantages:
            advantages = whiten(advantages, valid)
        token_advantages = None
        if args.kl_penalty == "token" and args.beta > 0:  # each token's return counts only the KL after it
            token_advantages = token_kl_advantages(advantages, token_kls, mask, args.beta)  # (B, C)

        rollout = Rollout(
            prompt_ids=sampled.prompt_ids,
            prompt_mask=sampled.prompt_mask,
            completion_ids=sampled.completion_ids,
            completion_mask=mask,
            old_logps=old_logps if args.steps_per_rollout > 1 else None,
            ref_logps=ref_logps if args.kl_penalty == "loss" else None,
            raw_scores=raw_scores,
            scores=scores,
            reward_columns=scored.per_function.to(scores.device),
            seq_kl=seq_kl,
            rewards=rewards,
            advantages=advantages,
            token_advantages=token_advantages,
            has_eos=sampled.has_eos,
            trained=valid & (sampled.has_eos | (not args.mask_truncated_completions)),
        )
        return rollout, {"prompts": arguments["prompts"], "completions": completions}

    def _sample(self, prompts: list[str]) -> SampledBatch:
        """K completions of each prompt, cut after the first stop string (which then counts as an end)."""
        acc = self.accelerator
        with acc.autocast():
            prompt_ids = tokenize_prompts(prompts, self.tokenizer, self.args.max_prompt_length,
                                          self.args.chat_template_kwargs)
            sampled = self.sampler.sample(acc.unwrap_model(self.model), prompt_ids, self.args.num_generations)
        if self.args.stop_strings:
            sampled.completion_ids, sampled.completion_mask, sampled.has_eos = cut_at_stop_strings(
                sampled.completion_ids, sampled.completion_mask, sampled.has_eos,
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                self.args.stop_strings, self.tokenizer.pad_token_id)
        return sampled

    # ------------------------------------------------------------------ step 5: the update

    def _mini_batches(self, rollout: Rollout):
        """The rollout's optimizer steps in order: num_iterations passes over its num_mini_batches
        mini-batches of completions_per_step rows (taken in order, so groups stay whole)."""
        size = self.args.completions_per_step
        for _ in range(self.args.num_iterations):
            for index in range(self.args.num_mini_batches):
                yield rollout.micro_batch(index * size, size)

    def _optimizer_step(self, mini_batch: Rollout) -> dict[str, float]:
        """One optimizer step over a mini-batch: accumulate gradients, clip, step, schedule."""
        stats = self._accumulate_gradients(mini_batch)
        max_norm = self.args.max_grad_norm
        if max_norm > 0:
            stats["grad_norm"] = float(self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm))
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    def _accumulate_gradients(self, mini_batch: Rollout) -> dict[str, float]:
        """Backward over one optimizer step's rows in gradient_accumulation_steps micro-batches.

        The denominator (completions, or completion tokens for token-mean) is counted over the whole
        step on every process BEFORE the loop, and each micro-batch contributes its summed numerators
        divided by it: the accumulated gradient is the one of a single large batch whatever the split.
        DDP averages gradients over processes, so each process divides by global count / processes.
        """
        args, acc = self.args, self.accelerator
        size = args.per_device_train_batch_size
        denominator = self._loss_denominator(mini_batch)
        totals = dict.fromkeys(("loss", "units", "clipped_low", "clipped_high", "ratio", "ratio_sq", "approxkl",
                                "entropy", "tokens", "kl_loss"), 0.0)
        for index in range(args.gradient_accumulation_steps):
            micro = mini_batch.micro_batch(index * size, size)
            is_last = index == args.gradient_accumulation_steps - 1
            with contextlib.nullcontext() if is_last else acc.no_sync(self.model):
                numerators, stats = self._micro_batch_loss(micro)
                acc.backward(numerators.sum() / denominator)
            totals["loss"] += numerators.detach().sum().item()
            for name, value in stats.items():
                totals[name] += value

        units = max(totals["units"], 1.0)  # completions (sequence ratio) or tokens (per-token ratio)
        ratio_mean = totals["ratio"] / units
        low, high = totals["clipped_low"] / units, totals["clipped_high"] / units
        metrics = {
            "loss/policy_avg": totals["loss"] / float(denominator),
            "policy/clipfrac_avg": low + high,
            "clip_ratio/low_mean": low,
            "clip_ratio/high_mean": high,
            "clip_ratio/region_mean": low + high,
            "policy/approxkl_avg": totals["approxkl"] / units,
            "policy/entropy_avg": totals["entropy"] / max(totals["tokens"], 1.0),
            "val/ratio": ratio_mean,
            "val/ratio_var": max(totals["ratio_sq"] / units - ratio_mean ** 2, 0.0),
        }
        if args.kl_penalty == "loss" and args.beta > 0:
            metrics["loss/kl_avg"] = totals["kl_loss"] / max(totals["tokens"], 1.0)
        return metrics

    def _loss_denominator(self, mini_batch: Rollout) -> torch.Tensor:
        """This process's share of the step's denominator: the global count / number of processes."""
        local = loss_denominator(self.args.loss_agg_mode, mini_batch.loss_mask()).to(self.accelerator.device)
        global_count = self.accelerator.gather(local.reshape(1)).sum()
        return (global_count / self.accelerator.num_processes).clamp(min=1e-8)

    def _micro_batch_loss(self, micro: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """(b,) per-completion loss numerators with grad, and the sums the step's metrics are built from."""
        args = self.args
        input_ids = torch.cat([micro.prompt_ids, micro.completion_ids], dim=1)
        attention_mask = torch.cat([micro.prompt_mask, micro.completion_mask], dim=1)
        logps, entropy = completion_logprobs(self.model, input_ids, attention_mask, micro.completion_ids.shape[1],
                                             args.temperature, with_entropy=True, entropy_grad=args.entropy_coef > 0)
        mask = micro.loss_mask()  # (b, C)
        # Used once, pi_old is the current policy detached (ratio 1, gradient of log pi).
        old_logps = logps.detach() if micro.old_logps is None else micro.old_logps
        out, numerators, units = self._policy_loss(logps, old_logps, micro, mask)

        extra = torch.zeros_like(logps)  # (b, C) per-token terms aggregated like the policy loss
        kl_sum = 0.0
        if args.kl_penalty == "loss" and args.beta > 0:
            kl = token_kl(logps, micro.ref_logps, args.kl_estimator)  # (b, C), with grad
            extra = extra + args.beta * kl
            kl_sum = (kl.detach() * mask).sum().item()
        if args.entropy_coef > 0:
            extra = extra - args.entropy_coef * entropy
        numerators = numerators + reduce_to_sequences(extra, mask, args.loss_agg_mode, args.max_completion_length)

        log_ratio = torch.log(out.ratio.clamp(min=1e-30))
        stats = {
            "units": units.sum().item(),
            "clipped_low": (out.clipped_low * units).sum().item(),
            "clipped_high": (out.clipped_high * units).sum().item(),
            "ratio": (out.ratio * units).sum().item(),
            "ratio_sq": (out.ratio ** 2 * units).sum().item(),
            "approxkl": (0.5 * log_ratio ** 2 * units).sum().item(),
            "entropy": (entropy.detach() * mask).sum().item(),
            "tokens": mask.sum().item(),
            "kl_loss": kl_sum,
        }
        return numerators, stats

    def _policy_loss(self, logps: torch.Tensor, old_logps: torch.Tensor, micro: Rollout,
                     mask: torch.Tensor) -> tuple[PolicyLossOutput, torch.Tensor, torch.Tensor]:
        """The clipped policy loss at the level the config asks for.

        The default (seq-mean-token-sum with sequence or no KL) treats a completion as one action with
        one ratio; every other mode, and per-token advantages (kl_penalty="token"), use per-token ratios.

        Returns:
            the loss output, (b,) per-completion numerators, and the units its statistics are over:
            (b,) trained completions for the sequence ratio, (b, C) tokens otherwise.
        """
        args = self.args
        if args.loss_agg_mode == "seq-mean-token-sum" and micro.token_advantages is None:
            out = clipped_sequence_loss((logps * mask).sum(dim=1), (old_logps * mask).sum(dim=1), micro.advantages,
                                        args.epsilon, args.epsilon_high)
            return out, out.loss * micro.trained.float(), micro.trained.float()
        advantages = micro.token_advantages if micro.token_advantages is not None else micro.advantages
        out = clipped_token_loss(logps, old_logps, advantages, args.epsilon, args.epsilon_high)
        return out, reduce_to_sequences(out.loss, mask, args.loss_agg_mode, args.max_completion_length), mask

    # ------------------------------------------------------------------ step 6: logs and checkpoints

    def _rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        """Metrics of the generated batch, gathered over processes. Names follow TRL v0 and v1."""
        acc, k = self.accelerator, self.args.num_generations
        lengths = rollout.completion_mask.sum(dim=1).float()
        gathered = acc.gather(torch.stack([
            rollout.raw_scores, rollout.scores, rollout.rewards, rollout.seq_kl, lengths,
            rollout.has_eos.float(), (~rollout.has_eos).float(),
        ], dim=1))  # (B_global, 7)
        raw_scores, scores, rewards, seq_kl, lengths, eos, truncated = gathered.unbind(dim=1)
        # K = 1 (reinforce) has no spread within a group.
        group_std = raw_scores.view(-1, k).std(dim=1) if k > 1 else torch.zeros_like(raw_scores)  # (P_global,)
        return {
            "reward": raw_scores.mean().item(),
            "reward_std": group_std.mean().item(),
            "frac_reward_zero_std": (group_std < 1e-8).float().mean().item(),
            "objective/scores": scores.mean().item(),  # after shaping
            "objective/kl": seq_kl.mean().item(),
            "objective/non_score_reward": (rewards - scores).mean().item(),  # the KL in the reward; 0 for kl_penalty="loss"
            "objective/rlhf_reward": rewards.mean().item(),
            "completions/mean_length": lengths.mean().item(),
            "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": truncated.mean().item(),
            "val/num_eos_tokens": eos.sum().item(),
            "num_tokens": lengths.sum().item(),
            **reward_function_metrics([fn.name for fn in self.reward_functions], acc.gather(rollout.reward_columns)),
        }

    def _log(self, window: dict[str, float], eps: float, samples: dict[str, list], rollout: Rollout) -> dict[str, float]:
        metrics = {
            **window,
            "objective/entropy": window.get("policy/entropy_avg", float("nan")),
            "eps": eps,
            "lr": self.lr_scheduler.get_last_lr()[0],
            "episode": float(self.episode),
        }
        self._log_metrics(metrics)
        if self.args.log_completions and self.accelerator.is_main_process:
            n = self.args.num_completions_to_print
            scores, advantages = rollout.scores.tolist(), rollout.advantages.tolist()
            print_table(completions_table(samples["prompts"], samples["completions"], scores, advantages,
                                          self.global_step, n))
            write_completions(Path(self.args.output_dir) / "completions.jsonl", [
                {"step": self.global_step, "prompt": p, "completion": c, "score": s, "advantage": a}
                for p, c, s, a in list(zip(samples["prompts"], samples["completions"], scores, advantages))[:n]
            ])
        return metrics

    def _log_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.accelerator.is_main_process:
            tqdm.write(format_metrics(metrics, self.global_step))
            for sink in self._sinks:
                sink.log(metrics, self.global_step)
        if self.args.report_to != "none":
            self.accelerator.log(metrics, step=self.global_step)
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean score of K sampled completions of every eval prompt (whole groups, like training)."""
        if self.eval_dataset is None:
            raise ValueError("evaluate() needs an eval_dataset.")
        acc, per_step = self.accelerator, self.args.prompts_per_step
        totals = torch.zeros(2, device=acc.device)  # sum of scores, count
        indices = list(range(acc.process_index, len(self.eval_dataset), acc.num_processes))
        was_training = self.model.training
        for start in range(0, len(indices), per_step):
            rows = select_rows(self.eval_dataset, indices[start : start + per_step])
            rollout, _ = self._generate_and_score(rows)
            totals += torch.stack([rollout.raw_scores.sum(), torch.tensor(float(rollout.raw_scores.numel()), device=acc.device)])
        self.model.train(was_training)
        totals = acc.reduce(totals, reduction="sum")
        return {"eval/reward": (totals[0] / totals[1].clamp(min=1)).item()}

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the policy (or its adapters under LoRA) and the tokenizer with save_pretrained."""
        output_dir = output_dir or self.args.output_dir
        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            acc.unwrap_model(self.model).save_pretrained(output_dir, state_dict=acc.get_state_dict(self.model))
            self.tokenizer.save_pretrained(output_dir)
            (Path(output_dir) / "rloo_config.json").write_text(json.dumps(self.args.to_dict(), indent=2))
        acc.wait_for_everyone()

    def _save_checkpoint(self, rollout_index: int) -> None:
        checkpoint = Path(self.args.output_dir) / f"checkpoint-{self.global_step}"
        self.save_model(str(checkpoint))
        self.accelerator.save_state(str(checkpoint / ACCELERATE_STATE))
        if self.accelerator.is_main_process:
            state = {
                "global_step": self.global_step,
                "rollout_index": rollout_index,
                "episode": self.episode,
                "completions_per_step": self.args.completions_per_step,
                "num_mini_batches": self.args.num_mini_batches,
                "num_processes": self.accelerator.num_processes,
            }
            (checkpoint / TRAINER_STATE).write_text(json.dumps(state, indent=2))
            self._rotate_checkpoints()
        self.accelerator.wait_for_everyone()

    def _rotate_checkpoints(self) -> None:
        limit = self.args.save_total_limit
        if limit is None:
            return
        checkpoints = sorted(Path(self.args.output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        for old in checkpoints[:-limit]:
            shutil.rmtree(old)

    def _load_checkpoint(self, checkpoint: str | bool) -> int:
        """Restore model, optimizer, scheduler, RNG and counters; return the next rollout index."""
        if checkpoint is True:
            found = sorted(Path(self.args.output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
            if not found:
                raise FileNotFoundError(f"resume_from_checkpoint=True, but {self.args.output_dir} has no checkpoint-* directory.")
            checkpoint = found[-1]
        path = Path(checkpoint)
        state_file = path / TRAINER_STATE
        if not state_file.exists():
            raise FileNotFoundError(f"{path} is not an rloo checkpoint: {TRAINER_STATE} is missing.")
        state = json.loads(state_file.read_text())
        written = (state["completions_per_step"], state.get("num_mini_batches", 1), state["num_processes"])
        if written != (self.args.completions_per_step, self.args.num_mini_batches, self.accelerator.num_processes):
            raise ValueError(
                f"the checkpoint was written with {written[0]} completions per step, {written[1]} mini-batches "
                f"per rollout on {written[2]} processes, this run has {self.args.completions_per_step}, "
                f"{self.args.num_mini_batches} on {self.accelerator.num_processes}; resume with the same batch "
                f"sizes and process count."
            )
        self.accelerator.load_state(str(path / ACCELERATE_STATE))
        self.global_step, self.episode = state["global_step"], state["episode"]
        logger.info("Resumed from %s at step %d.", path, self.global_step)
        return state["rollout_index"] + 1

    # ------------------------------------------------------------------ helpers

    def _run_length(self) -> tuple[int, int]:
        """(rollouts, optimizer steps) from max_steps, total_episodes or num_train_epochs."""
        args, per_rollout = self.args, self.args.steps_per_rollout
        if args.max_steps > 0:
            return math.ceil(args.max_steps / per_rollout), args.max_steps
        if args.total_episodes is not None:
            rollouts = math.ceil(args.total_episodes / (args.completions_per_rollout * self.accelerator.num_processes))
        else:
            rollouts = max(1, int(args.num_train_epochs * self.schedule.batches_per_epoch))
        return rollouts, rollouts * per_rollout

    def _build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        args = self.args
        params = [p for p in model.parameters() if p.requires_grad]
        # Decay matrices only; biases and norm weights are not decayed.
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        kwargs = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
        if args.optim == "adamw_8bit":
            if not torch.cuda.is_available():
                raise RuntimeError("optim='adamw_8bit' needs a CUDA GPU (bitsandbytes); use optim='adamw_torch' here.")
            import bitsandbytes as bnb

            return bnb.optim.AdamW8bit(groups, **kwargs)
        # The fused kernel updates every tensor in one pass: over twice as fast as the per-tensor loop
        # on CPU, and transformers' default on GPU too. Older torch or other devices fall back.
        fused = params[0].device.type in ("cpu", "cuda") and "fused" in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(groups, **kwargs, fused=fused or None)

    @contextlib.contextmanager
    def _reference_model(self):
        if self.reference is not None:
            yield self.reference
        else:  # LoRA: the reference is the base model, adapters disabled
            model = self.accelerator.unwrap_model(self.model)
            with model.disable_adapter():
                yield model

    def _batched_logprobs(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          completion_length: int) -> torch.Tensor:
        """No-grad (B, C) completion log-probs, in micro-batches of per_device_train_batch_size."""
        size = self.args.per_device_train_batch_size
        chunks = []
        with self.accelerator.autocast():
            for start in range(0, input_ids.shape[0], size):
                logps, _ = completion_logprobs(model, input_ids[start : start + size], attention_mask[start : start + size],
                                               completion_length, self.args.temperature)
                chunks.append(logps)
        return torch.cat(chunks)
