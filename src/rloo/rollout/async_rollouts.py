"""Asynchronous rollouts: generate rollout n+1 while the learner trains on rollout n.

With `async_rollouts`, a sampler owns a snapshot of the policy's weights (a copy of the unwrapped
model, no grad) and runs steps 1-4 of the loop (`RolloutCollector.collect`: sample, score, pi_old,
advantages) on it: on CPU a forked process with the snapshot in shared memory, so that it runs on its
own core; on an accelerator a thread of the training process. The trainer's loop, one rollout ahead:

    rollout r   <- wait for the sampler (sampled from the snapshot of the weights after rollout r-2)
    snapshot    <- the current weights (after rollout r-1's optimizer steps)
    sampler     <- start rollout r+1 on the snapshot
    learner     <- the optimizer steps of rollout r

So every rollout is trained exactly one rollout's optimizer steps (`steps_per_rollout`) after the weights
it was sampled from: a staleness bounded by one rollout. The correction it needs: pi_old is always the
sampling weights' log-probs (computed by the sampler, on the snapshot), so the loss is the clipped
ratio pi / pi_old from the first step on (`epsilon`, `epsilon_high`), and off_policy_mask_threshold
sees the drift. A thread overlaps with the learner only where torch releases the GIL (inside kernels);
a process needs a free core. One training process only, and only with the in-process samplers ("fast",
"generate"): the sampler must not take part in collective calls. In the child, reward functions see
`trainer_state` as it was when the sampler started (the global step and episode arrive per rollout).

Every wait has a timeout (`async_rollout_timeout`) that raises naming what waited for what.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import multiprocessing
import traceback
from typing import Any, Callable

import torch

from rloo.rollout import Rollout, RolloutCollector, Samples


class RolloutTimeout(RuntimeError):
    """The sampler thread did not deliver a rollout in time."""


class ThreadCollector:
    """Runs `collector.collect` in one thread of this process."""

    def __init__(self, collector: RolloutCollector) -> None:
        self.collector = collector
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rloo-sampler")

    def submit(self, *arguments: Any) -> concurrent.futures.Future:
        return self.executor.submit(self.collector.collect, *arguments)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class _PipeResult:
    """The one answer a forked sampler owes, read from its pipe (a Future's `done` and `result`)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def done(self) -> bool:
        return self.connection.poll(0)

    def result(self, timeout: float) -> tuple[Rollout, Samples]:
        if not self.connection.poll(timeout):
            raise concurrent.futures.TimeoutError()
        status, payload = self.connection.recv()
        if status == "error":
            raise RuntimeError(f"the sampler process failed while collecting a rollout:\n{payload}")
        return payload


def _serve(collector: RolloutCollector, connection: Any) -> None:
    """The forked sampler: collect a rollout for every (rows, global_step, episode) received; None ends."""
    torch.set_num_threads(1)
    while (request := connection.recv()) is not None:
        try:
            connection.send(("ok", collector.collect(*request)))
        except Exception:  # the learner re-raises it with the child's traceback
            connection.send(("error", traceback.format_exc()))


class ForkedCollector:
    """Runs `collector.collect` in a forked child process (its own core); the collector's model must
    keep its weights in shared memory (`share_memory_()`) so that the parent can update them."""

    def __init__(self, collector: RolloutCollector) -> None:
        context = multiprocessing.get_context("fork")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(collector, child), daemon=True, name="rloo-sampler")
        self.process.start()
        child.close()

    def submit(self, *arguments: Any) -> _PipeResult:
        self.connection.send(arguments)
        return _PipeResult(self.connection)

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)


class AsyncRollouts:
    """A sampler one rollout ahead of the learner, on its own copy of the weights: a forked process
    ("process", its own core) or a thread of the training process ("thread")."""

    def __init__(self, collector: RolloutCollector, timeout_s: float, worker: str | None = None) -> None:
        policy = collector.accelerator.unwrap_model(collector.model)
        # A forked child cannot use CUDA the parent initialised: a process on CPU, a thread elsewhere.
        worker = worker or ("process" if next(policy.parameters()).device.type == "cpu" else "thread")
        self.snapshot = copy.deepcopy(policy).eval().requires_grad_(False)  # the sampler's weights
        sampler_collector = dataclasses.replace(collector, model=self.snapshot, keep_old_logps=True)
        if worker == "process":
            for tensor in [*self.snapshot.parameters(), *self.snapshot.buffers()]:
                tensor.share_memory_()  # written here, read by the child
            self.runner: ThreadCollector | ForkedCollector = ForkedCollector(sampler_collector)
        else:
            self.runner = ThreadCollector(sampler_collector)
        self.policy = policy
        self.timeout_s = timeout_s
        self.pending: Any = None
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
        self.pending = self.runner.submit(rows, global_step, episode)
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
            try:
                self.pending.result(timeout=self.timeout_s)
            except Exception:  # noqa: BLE001 - a rollout nobody will train on; its error does not matter
                pass
            self.pending = None

    def close(self) -> None:
        """Stop the sampler (the process is killed; a thread finishes its rollout and ends)."""
        self.runner.close()
