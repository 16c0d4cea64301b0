"""Asynchronous rollouts: generate rollout n+1 while the learner trains on rollout n.

With `async_rollouts`, a sampler thread owns a snapshot of the policy's weights (a copy of the
unwrapped model, no grad) and runs steps 1-4 of the loop (`RolloutCollector.collect`: sample, score,
pi_old, advantages) on it. The trainer's loop, one rollout ahead:

    rollout r   <- wait for the thread (sampled from the snapshot of the weights after rollout r-2)
    snapshot    <- the current weights (after rollout r-1's optimizer steps)
    thread      <- start rollout r+1 on the snapshot
    learner     <- the optimizer steps of rollout r

So every rollout is trained exactly one rollout's optimizer steps (`steps_per_rollout`) after the weights
it was sampled from: a staleness bounded by one rollout. The correction it needs: pi_old is always the
sampling weights' log-probs (computed in the thread, on the snapshot), so the loss is the clipped
ratio pi / pi_old from the first step on (`epsilon`, `epsilon_high`), and off_policy_mask_threshold
sees the drift. Python threads overlap here because torch releases the GIL inside its kernels; on
CPU the sampler and the learner then share the cores. One process only, and only with the in-process
samplers ("fast", "generate"): the thread must not take part in collective calls.

Every wait has a timeout (`async_rollout_timeout`) that raises naming what waited for what.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
from typing import Any, Callable

import torch

from .rollout import Rollout, RolloutCollector, Samples


class RolloutTimeout(RuntimeError):
    """The sampler thread did not deliver a rollout in time."""


class AsyncRollouts:
    """A sampler thread one rollout ahead of the learner, on its own copy of the weights."""

    def __init__(self, collector: RolloutCollector, timeout_s: float) -> None:
        policy = collector.accelerator.unwrap_model(collector.model)
        self.snapshot = copy.deepcopy(policy).eval().requires_grad_(False)  # the sampler's weights
        self.collector = dataclasses.replace(collector, model=self.snapshot, keep_old_logps=True)
        self.policy = policy
        self.timeout_s = timeout_s
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rloo-sampler")
        self.pending: concurrent.futures.Future | None = None
        self.pending_rollout = -1

    def sync_weights(self) -> None:
        """Copy the policy's current weights into the snapshot (never while the thread samples)."""
        if self.pending is not None and not self.pending.done():
            raise RuntimeError("the sampler's weights were about to change while it was sampling (a bug in the loop).")
        with torch.no_grad():
            for mine, theirs in zip(self.snapshot.parameters(), self.policy.parameters()):
                mine.copy_(theirs.detach())

    def submit(self, rollout_index: int, rows: list[dict[str, Any]], global_step: int, episode: int) -> None:
        """Start steps 1-4 of `rollout_index` in the thread."""
        self.pending = self.executor.submit(self.collector.collect, rows, global_step, episode)
        self.pending_rollout = rollout_index

    def result(self, rollout_index: int) -> tuple[Rollout, Samples]:
        """The rollout the thread was started on; raises RolloutTimeout after timeout_s."""
        if self.pending is None or self.pending_rollout != rollout_index:
            raise RuntimeError(f"the learner asked for rollout {rollout_index} but the sampler thread was started on "
                               f"{self.pending_rollout} (a bug in the loop).")
        try:
            return self.pending.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise RolloutTimeout(f"the learner waited {self.timeout_s:.0f} s (async_rollout_timeout) for the sampler "
                                 f"thread to deliver rollout {rollout_index} (sampling, scoring, pi_old); it did not. A "
                                 f"reward function or the sampler may hang; raise async_rollout_timeout for slow ones, or "
                                 f"set async_rollouts=False to run them in the loop.") from None
        finally:
            self.pending = None

    def next(self, rollout_index: int, rows_of: Callable[[int], list[dict[str, Any]]], global_step: int,
             episode: int, num_rollouts: int) -> tuple[Rollout, Samples]:
        """Rollout `rollout_index` (sampled now from the current weights when none is under way, as at the
        start of training), after which the thread starts on the next one from the current weights."""
        if self.pending is None:
            self.sync_weights()
            self.submit(rollout_index, rows_of(rollout_index), global_step, episode)
        rollout, samples = self.result(rollout_index)
        self.sync_weights()
        if rollout_index + 1 < num_rollouts:
            self.submit(rollout_index + 1, rows_of(rollout_index + 1), global_step, episode)
        return rollout, samples

    def discard(self) -> None:
        """Wait for and drop a rollout under way (training ended before it was needed)."""
        if self.pending is not None:
            concurrent.futures.wait([self.pending], timeout=self.timeout_s)
            self.pending = None
