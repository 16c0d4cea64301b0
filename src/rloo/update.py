"""Step 5 of the loop: spend a rollout in optimizer steps.

A rollout is split into `num_mini_batches` mini-batches of `completions_per_step` rows (in order,
so groups stay whole), and the split is passed over `num_iterations` times; each mini-batch is one
optimizer step, accumulated over `gradient_accumulation_steps` micro-batches.

The loss-denominator contract lives here, in `Learner.accumulate_gradients`: the denominator
(completions, or completion tokens for token-mean) is counted over the whole step on every process
before any backward, and each micro-batch adds its summed numerators divided by it, so the
accumulated gradient is the one of a single large batch, however the step is split.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from accelerate import Accelerator

from rloo.algo.kl import kl_placement, token_kl
from rloo.algo.loss import PolicyLossOutput, clipped_sequence_loss, clipped_token_loss, loss_denominator, reduce_to_sequences
from rloo.algo.off_policy import off_policy_sequence_mask
from rloo.config import RLOOConfig
from rloo.distributed import accelerate_internals
from rloo.passes.logprobs import completion_logprobs
from rloo.passes.prefix_logprobs import check_shared_prompt_model, shared_prompt_logprobs
from rloo.rollout import Rollout
from rloo.run.metrics import clip_extremes, completion_clip_extremes, step_metrics

# Sums over a step's micro-batches from which `metrics.step_metrics` builds the step's metrics.
logger = logging.getLogger(__name__)

STEP_TOTALS = ("loss", "units", "clipped_low", "clipped_high", "ratio", "ratio_sq", "approxkl", "entropy", "tokens",
               "kl_loss", "completions", "off_policy_masked", "aux_loss")


def mini_batches(rollout: Rollout, args: RLOOConfig) -> Iterator[Rollout]:
    """The rollout's optimizer steps in order: num_iterations passes over its num_mini_batches
    mini-batches of completions_per_step rows (taken in order, so groups stay whole)."""
    size = args.completions_per_step
    for _ in range(args.num_iterations):
        for index in range(args.num_mini_batches):
            yield rollout.micro_batch(index * size, size)


@dataclass
class Learner:
    """The policy's optimizer step: forward and backward per micro-batch, clip, step, schedule."""

    args: RLOOConfig
    accelerator: Accelerator
    model: torch.nn.Module  # prepared by accelerate
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any

    def __post_init__(self) -> None:
        # TRL's pad_to_multiple_of: micro-batches keep that much of their padding (speed only, same loss).
        multiple = self.args.pad_to_multiple_of  # "auto" and None: trim all shared padding
        self.pad_to_multiple_of = multiple if isinstance(multiple, int) else None
        # TRL's router_aux_loss_coef: a MoE model's load-balancing loss joins the loss with this weight.
        config = getattr(getattr(self.model, "module", self.model), "config", None)
        is_moe = getattr(getattr(config, "get_text_config", lambda: config)(), "output_router_logits", None) is not None
        self.aux_loss_coef = float(self.args.router_aux_loss_coef or 0.0) if is_moe else 0.0
        self._aux_loss: torch.Tensor | None = None
        self.step_lr = float("nan")  # the learning rate of the last optimizer step (`step`)
        self._waited = 0.0  # seconds spent collecting the rollout the next step trains on (`timed_wait`)
        if self.args.shared_prefix_forward:
            check_shared_prompt_model(self.model)  # refuse at construction, not at the first step

    def step(self, mini_batch: Rollout) -> dict[str, float]:
        """One optimizer step over a mini-batch; returns the step's metrics. `step_lr` keeps the learning
        rate the step used (the schedule moves on after it), which is what a step's log shows, as in TRL."""
        start, self.step_lr = time.perf_counter(), float(self.lr_scheduler.get_last_lr()[0])
        stats = self.accumulate_gradients(mini_batch)
        max_norm = self.args.max_grad_norm
        # With max_norm 0 the norm is still measured (clipping at inf scales by exactly 1) for the guard below.
        grad_norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm or math.inf))
        if max_norm > 0:
            stats["grad_norm"] = grad_norm
        if not self.step_is_finite(stats["loss/policy_avg"], grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            stats["train/nonfinite_skipped"] = 1.0
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.lr_scheduler.step()  # the schedule counts steps taken or skipped, so a resume lines up
        # TRL's step_time: the step's seconds, plus the sampling it waited for when it is a rollout's first.
        stats["step_time"], self._waited = time.perf_counter() - start + self._waited, 0.0
        return stats

    @contextlib.contextmanager
    def timed_wait(self) -> Iterator[None]:
        """Time the collection of a rollout: its seconds are added to the next step's step_time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._waited += time.perf_counter() - start

    def step_is_finite(self, loss: float, grad_norm: float) -> bool:
        """False (after a warning) when the step's loss or gradient norm is NaN or inf; with
        nan_policy="stop" that raises instead. Both are already global (the loss summed over
        processes, the norm of the synced gradients), so every process decides the same."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return True
        message = (f"non-finite optimizer step (loss {loss}, gradient norm {grad_norm}); lower learning_rate or "
                   f"max_grad_norm, or check the rewards.")
        if self.args.nan_policy == "stop":
            raise FloatingPointError(message + ' nan_policy="stop" ends the run; "skip" would drop the step.')
        logger.warning("Skipping a %s", message)
        return False

    def accumulate_gradients(self, mini_batch: Rollout) -> dict[str, float]:
        """Backward over one optimizer step's rows in gradient_accumulation_steps micro-batches.

        DDP averages gradients over processes, so each process divides by global count / processes.
        accelerate is told where the step ends (`sync_gradients` False on all but the last
        micro-batch), so every backend syncs once and DeepSpeed steps its engine once per step.
        """
        args, acc = self.args, self.accelerator
        size = args.per_device_train_batch_size
        denominator = self.loss_denominator(mini_batch)
        totals = dict.fromkeys(STEP_TOTALS, 0.0)
        extremes: list[tuple[float, float]] = []  # per micro-batch: (clip_ratio/low_min, /high_max) on this process
        for index in range(args.gradient_accumulation_steps):
            micro = mini_batch.micro_batch(index * size, size, self.pad_to_multiple_of)
            is_last = index == args.gradient_accumulation_steps - 1
            accelerate_internals.mark_step_end(acc, is_last)
            with contextlib.nullcontext() if is_last else acc.no_sync(self.model):
                numerators, stats = self.micro_batch_loss(micro)
                # accelerate (or DeepSpeed's engine) divides by gradient_accumulation_steps; our
                # denominator already covers the whole step, so that division is undone here. The router
                # loss is a mean over micro-batches, so it keeps that division.
                aux = 0.0 if self._aux_loss is None else self.aux_loss_coef * self._aux_loss
                acc.backward(numerators.sum() / denominator * acc.gradient_accumulation_steps + aux)
            totals["loss"] += numerators.detach().sum().item()
            extremes.append((stats.pop("clip_low_min"), stats.pop("clip_high_max")))
            for name, value in stats.items():
                totals[name] += value
        # Metrics of the global step: sums over every process, over the global denominator.
        names = list(totals)
        summed = acc.reduce(torch.tensor([totals[n] for n in names], dtype=torch.float32, device=acc.device), "sum")
        totals = dict(zip(names, summed.tolist()))
        metrics = step_metrics(totals, float(denominator) * acc.num_processes,
                               with_kl_loss=kl_placement(args.kl_penalty, args.beta).in_loss,
                               with_off_policy_mask=args.off_policy_mask_threshold is not None)
        gathered = acc.gather(torch.tensor(extremes, dtype=torch.float32, device=acc.device))  # (P * M, 2)
        metrics.update(clip_extremes(gathered.view(acc.num_processes, len(extremes), 2).cpu()))
        if self.aux_loss_coef:  # mean router loss over the step's micro-batches, on every process
            metrics["aux_loss"] = totals["aux_loss"] / (args.gradient_accumulation_steps * acc.num_processes)
        return metrics

    def loss_denominator(self, mini_batch: Rollout) -> torch.Tensor:
        """This process's share of the step's denominator: the global count / number of processes."""
        local = loss_denominator(self.args.loss_agg_mode, mini_batch.loss_mask()).to(self.accelerator.device)
        global_count = self.accelerator.gather(local.reshape(1)).sum()
        return (global_count / self.accelerator.num_processes).clamp(min=1e-8)

    def micro_batch_loss(self, micro: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """(b,) per-completion loss numerators with grad, and the sums the step's metrics are built from."""
        args = self.args
        self._aux_loss = None  # set below for a MoE model with router_aux_loss_coef (not on the shared-prefix path)
        # The whole log-prob computation under the precision the no-grad passes use (rollout's collector): accelerate
        # wraps only the model's forward in autocast, and rloo's tiled LM head runs after it, so without this the
        # head's products would be fp32 here and bf16 in the reference and old log-probs they are compared with.
        with self.accelerator.autocast():
            if args.shared_prefix_forward:  # each prompt once, its completions on copies of its KV cache
                logps, entropy = shared_prompt_logprobs(self.model, micro.prompt_ids, micro.prompt_mask,
                                                        micro.completion_ids, micro.completion_mask, args.temperature,
                                                        with_entropy=True, entropy_grad=args.entropy_coef > 0,
                                                        vision=micro.vision)  # each prompt's images once
            else:
                input_ids = torch.cat([micro.prompt_ids, micro.completion_ids], dim=1)
                attention_mask = torch.cat([micro.prompt_mask, micro.completion_mask], dim=1)
                router = {} if self.aux_loss_coef else None
                logps, entropy = completion_logprobs(self.model, input_ids, attention_mask,
                                                     micro.completion_ids.shape[1], args.temperature, with_entropy=True,
                                                     entropy_grad=args.entropy_coef > 0, router_aux=router,
                                                     model_inputs=None if micro.vision is None else
                                                     micro.vision.model_kwargs(input_ids))
                self._aux_loss = None if router is None else router.get("aux_loss")
        mask = micro.loss_mask()  # (b, C)
        # Used once, pi_old is the current policy detached (ratio 1, gradient of log pi).
        old_logps = logps.detach() if micro.old_logps is None else micro.old_logps
        out, numerators, units, masked = self.policy_loss(logps, old_logps, micro, mask)

        extra = torch.zeros_like(logps)  # (b, C) per-token terms aggregated like the policy loss
        kl_sum = 0.0
        if kl_placement(args.kl_penalty, args.beta).in_loss:
            kl = token_kl(logps, micro.ref_logps, args.kl_estimator)  # (b, C), with grad
            extra = extra + args.beta * kl
            kl_sum = (kl.detach() * mask).sum().item()
        if args.entropy_coef > 0:
            extra = extra - args.entropy_coef * entropy
        numerators = numerators + reduce_to_sequences(extra, mask, args.loss_agg_mode, args.max_completion_length)

        log_ratio = torch.log(out.ratio.clamp(min=1e-30))
        low_min, high_max = completion_clip_extremes(out.clipped_low.detach(), out.clipped_high.detach(), units)
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
            "aux_loss": 0.0 if self._aux_loss is None else float(self._aux_loss.detach()),
            "completions": micro.trained.float().sum().item(),
            "off_policy_masked": masked,
            "clip_low_min": low_min,  # not summed: gathered per micro-batch by accumulate_gradients
            "clip_high_max": high_max,
        }
        return numerators, stats

    def policy_loss(self, logps: torch.Tensor, old_logps: torch.Tensor, micro: Rollout,
                    mask: torch.Tensor) -> tuple[PolicyLossOutput, torch.Tensor, torch.Tensor, float]:
        """The clipped policy loss at the level the config asks for, with off-policy sequence masking.

        The default (seq-mean-token-sum with sequence or no KL, importance_sampling_level unset) treats a
        completion as one action with one ratio; every other mode, per-token advantages
        (kl_penalty="token"), truncated importance weights (a sampler with its own log-probs) and an
        explicit importance_sampling_level use per-token ratios (GSPO's sequence ratio on every token for
        "sequence"). With off_policy_mask_threshold, masked completions' numerators are zeroed.

        Returns:
            the loss output, (b,) per-completion numerators, the units its statistics are over ((b,)
            trained completions for the sequence ratio, (b, C) tokens otherwise), and the number of
            trained completions the off-policy mask dropped.
        """
        args = self.args
        masked = 0.0
        if (args.loss_agg_mode == "seq-mean-token-sum" and args.importance_sampling_level is None
                and micro.token_advantages is None and micro.is_weights is None):
            out = clipped_sequence_loss((logps * mask).sum(dim=1), (old_logps * mask).sum(dim=1), micro.advantages,
                                        args.epsilon, args.epsilon_high)
            numerators, units = out.loss * micro.trained.float(), micro.trained.float()
        else:
            advantages = micro.token_advantages if micro.token_advantages is not None else micro.advantages
            out = clipped_token_loss(logps, old_logps, advantages, args.epsilon, args.epsilon_high, mask,
                                     args.importance_sampling_level or "token")
            # Truncated importance sampling: the sampler was not exactly pi_old (algo.importance).
            token_loss = out.loss if micro.is_weights is None else out.loss * micro.is_weights
            numerators, units = reduce_to_sequences(token_loss, mask, args.loss_agg_mode, args.max_completion_length), mask
        if args.off_policy_mask_threshold is not None:
            sampler_logps = micro.sampler_logps if micro.sampler_logps is not None else old_logps
            keep = off_policy_sequence_mask(micro.advantages, logps, sampler_logps, mask,
                                            args.off_policy_mask_threshold)  # (b,)
            numerators = numerators * keep
            masked = ((1.0 - keep) * micro.trained.float()).sum().item()
        return out, numerators, units, masked
