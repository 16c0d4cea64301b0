"""Asynchronous rollouts: generate the next rollouts while the learner trains on this one.

With `async_rollouts`, a sampler owns a snapshot of the policy's weights (a copy of the unwrapped
model, no grad) and runs steps 1-4 of the loop (`RolloutCollector.collect`: sample, score, pi_old,
advantages) on it: on CPU a forked process with the snapshot in shared memory, so that it runs on its
own core; on an accelerator, or with the vLLM sampler, a thread of the training process. vLLM's engine
keeps its own copy of the weights: the thread pushes the snapshot's into it whenever it takes newer
ones (the engine is built before the thread starts; evaluation, on the live policy, takes turns with
the thread and leaves the engine to push the snapshot again). With `max_staleness` = N, the learner
keeps the sampler at most N rollouts ahead:

    rollout r   <- the sampler's result
    publish     <- the current weights (after rollout r-1's optimizer steps)
    sampler     <- queue rollouts up to r+N; each starts from the newest published weights
    learner     <- the optimizer steps of rollout r

Rollout r+N is queued after the weights of rollout r-1's steps are published and trained after rollout
r+N-1's steps, so no rollout is trained more than N rollouts' optimizer steps (N * steps_per_rollout)
after the weights it was sampled from. With N = 1 the sampler is idle while the weights are published,
so it reads them from its own copy and every rollout is exactly one rollout stale; with N >= 2 it keeps
sampling while the learner publishes, so the learner writes into a second shared copy the sampler takes
from before each rollout (one more set of weights). The correction staleness needs: pi_old is always
the sampling weights' log-probs (computed by the sampler, on the snapshot), so the loss is the clipped
ratio pi / pi_old from the first step on (`epsilon`, `epsilon_high`), and off_policy_mask_threshold
sees the drift. A thread overlaps with the learner only where torch releases the GIL (inside kernels);
a process needs a free core; a vLLM server generates on its own machine while the thread waits. One
training process only: the sampler must not take part in collective calls. In the child, reward
functions see `trainer_state` as it was when the rollout was queued.

With tools or an environment_factory (`multi_turn`), the sampler runs its own copy of the multi-turn
stage (`MultiTurnRollout.for_sampler`): its environments are made by the factories for it and never
used by the trainer's evaluation, so no instance is shared between threads. In a forked child, tools and
environments run in the child: a tool that changes state of the training process (a global, an object
made before training) changes the child's copy only, and the trainer's `environments` attribute stays
empty. A `rollout_func` is refused (`builders.build_multi_turn`): it generates with whatever it reaches
through the trainer, not the sampler's snapshot, so pi_old and the staleness would not describe it.

Every wait has a timeout (`async_rollout_timeout`) that raises naming what waited for what.

Exact resume: a checkpoint saved between rollouts holds `AsyncRollouts.state()`, what the sampler is sampling the
next rollout with: the optimizer step of the weights published for it, those weights' trainable tensors (with LoRA,
the adapters alone; the frozen base is the policy's own) and the sampler's random state after the last rollout it
delivered. On resume the first rollout is sampled from them, so the run goes on as if never stopped
(tests/rollout/test_async_resume.py). It holds where the sampling order is fixed: max_staleness 1, the sampler a
forked process (CPU; its random state is its own). A thread shares the learner's generators and a vLLM engine
keeps its own, so there a resumed run samples from the same weights but other random draws.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import dataclasses
import multiprocessing
import queue
import threading
import traceback
from typing import Any, Callable

import torch

from rloo.generation.vllm import VLLMSampler
from rloo.generation.vllm_lora import StaleAdapterError
from rloo.rollout import Rollout, RolloutCollector, Samples
from rloo.rollout.random_state import random_state, set_random_state

_FORK = multiprocessing.get_context("fork")


class RolloutTimeout(RuntimeError):
    """The sampler did not deliver a rollout in time."""


def _copy_weights(target: torch.nn.Module, source: torch.nn.Module) -> None:
    with torch.no_grad():
        for mine, theirs in zip(target.parameters(), source.parameters()):
            mine.copy_(theirs.detach())


class WeightBoard:
    """Where the learner publishes weights for the sampler, stamped with the optimizer step they are from.

    `staging` is the sampler's own `snapshot` when the sampler only ever reads it while the learner waits
    (max_staleness 1), else a second copy the sampler takes from before each rollout, under `lock`.
    """

    def __init__(self, snapshot: torch.nn.Module, separate: bool) -> None:
        self.snapshot = snapshot
        self.staging = copy.deepcopy(snapshot) if separate else snapshot
        self.lock = _FORK.Lock()
        self.version = _FORK.Value("q", -1, lock=False)  # the optimizer step of the published weights
        self.taken = -1  # in the sampler: the step of the weights its snapshot holds

    def share_memory(self) -> None:
        """Put the tensors the learner writes into shared memory (before forking the sampler)."""
        for tensor in [*self.staging.parameters(), *self.staging.buffers()]:
            tensor.share_memory_()

    def publish(self, policy: torch.nn.Module, step: int) -> None:
        """In the learner: the policy's current weights, from optimizer step `step`."""
        with self.lock:
            _copy_weights(self.staging, policy)
            self.version.value = step

    def publish_saved(self, policy: torch.nn.Module, step: int, weights: dict[str, torch.Tensor]) -> None:
        """In the learner, on resume: the policy's weights with `weights` (name -> tensor, the trainable ones a
        checkpoint saved) in place of its own, as the weights of optimizer step `step`."""
        with self.lock:
            _copy_weights(self.staging, policy)
            with torch.no_grad():
                for name, tensor in self.staging.named_parameters():
                    if name in weights:
                        tensor.copy_(weights[name])
            self.version.value = step

    def take(self) -> int:
        """In the sampler, before a rollout: the newest published weights into its snapshot; their step."""
        with self.lock:
            if self.staging is not self.snapshot and self.taken != self.version.value:
                _copy_weights(self.snapshot, self.staging)
            self.taken = self.version.value
        return self.taken


def _collect_from_newest(collector: RolloutCollector, board: WeightBoard, rows: list[dict[str, Any]],
                         global_step: int, episode: int, start_state: dict[str, Any] | None = None
                         ) -> tuple[Rollout, Samples, int, dict[str, Any]]:
    """Steps 1-4 on the newest published weights (from `start_state`'s random state, a resumed run's, when given);
    with the optimizer step those weights are from and the random state after it."""
    if start_state is not None:
        set_random_state(start_state)
    before = board.taken
    weights_step = board.take()
    sampler = collector.sampler
    if weights_step != before:  # the snapshot changed: an engine with its own copy (vLLM) loads it again
        if isinstance(sampler, VLLMSampler):
            sampler.on_optimizer_step(collector.model, tag=weights_step)
        else:
            sampler.on_optimizer_step(collector.model)
    rollout, samples = collector.collect(rows, global_step, episode)
    check_sampler_versions(rollout, getattr(sampler, "version_tags", {}), weights_step)
    return rollout, samples, weights_step, random_state()


def check_sampler_versions(rollout: Rollout, version_tags: dict, weights_step: int) -> None:
    """A LoRA engine sampled every row with the adapter version pushed from the weights of `weights_step`, those
    pi_old was computed with; another version (an adapter the live policy pushed in between) would make the
    sampler correction compare two other policies. Raises StaleAdapterError naming both."""
    if rollout.sampler_version is None:
        return
    steps = {int(v): version_tags.get(int(v)) for v in rollout.sampler_version.unique()}
    if any(step != weights_step for step in steps.values()):
        raise StaleAdapterError(f"the rollout was sampled with adapter versions {steps} (version: optimizer step of "
                                f"its weights), but pi_old is from the weights of step {weights_step}")


class ThreadCollector:
    """Collects the queued rollouts, in order, in one thread of this process."""

    def __init__(self, collector: RolloutCollector, board: WeightBoard) -> None:
        self.collector, self.board = collector, board
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rloo-sampler")
        self.futures: collections.deque[concurrent.futures.Future] = collections.deque()

    def submit(self, rows: list[dict[str, Any]], global_step: int, episode: int,
               start_state: dict[str, Any] | None = None) -> None:
        self.futures.append(self.executor.submit(_collect_from_newest, self.collector, self.board, rows,
                                                 global_step, episode, start_state))

    def result(self, timeout: float) -> tuple[Rollout, Samples, int, dict[str, Any]]:
        """The oldest queued rollout; concurrent.futures.TimeoutError after `timeout` seconds."""
        payload = self.futures[0].result(timeout=timeout)
        self.futures.popleft()
        return payload

    def busy(self) -> bool:
        return any(not future.done() for future in self.futures)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _serve(collector: RolloutCollector, board: WeightBoard, requests: Any, results: Any) -> None:
    """The forked sampler: collect a rollout for every (rows, global_step, episode, start_state) received; None ends."""
    torch.set_num_threads(1)
    while (request := requests.recv()) is not None:
        try:
            results.send(("ok", _collect_from_newest(collector, board, *request)))
        except Exception:  # the learner re-raises it with the child's traceback
            results.send(("error", traceback.format_exc()))


class ForkedCollector:
    """Collects the queued rollouts, in order, in a forked child process (its own core). The board's
    staging weights must be in shared memory so that the parent can update them.

    A thread of the parent receives the child's results as they come, so the child never waits for the
    learner to read one before it starts the next.
    """

    def __init__(self, collector: RolloutCollector, board: WeightBoard) -> None:
        requests_out, self.requests = _FORK.Pipe(duplex=False)
        self.results_in, results_out = _FORK.Pipe(duplex=False)
        self.process = _FORK.Process(target=_serve, args=(collector, board, requests_out, results_out), daemon=True,
                                     name="rloo-sampler")
        self.process.start()
        requests_out.close()
        results_out.close()
        self.received: queue.Queue = queue.Queue()
        self.queued = 0  # submitted and not yet handed to the learner
        threading.Thread(target=self._receive, daemon=True, name="rloo-sampler-results").start()

    def _receive(self) -> None:
        try:
            while True:
                self.received.put(self.results_in.recv())
        except (EOFError, OSError):  # the child ended: say so at once, not after async_rollout_timeout (issue #48)
            self.process.join(timeout=5)
            self.received.put(("died", self.process.exitcode))

    def submit(self, rows: list[dict[str, Any]], global_step: int, episode: int,
               start_state: dict[str, Any] | None = None) -> None:
        self.requests.send((rows, global_step, episode, start_state))
        self.queued += 1

    def result(self, timeout: float) -> tuple[Rollout, Samples, int, dict[str, Any]]:
        """The oldest queued rollout; concurrent.futures.TimeoutError after `timeout` seconds."""
        try:
            status, payload = self.received.get(timeout=timeout)
        except queue.Empty:
            raise concurrent.futures.TimeoutError() from None
        if status == "died":
            self.received.put((status, payload))  # every later wait ends the same way
            raise RuntimeError(f"the sampler process (pid {self.process.pid}) died with exit code {payload} before "
                               f"delivering a rollout (a negative code is the signal that killed it: -9 is SIGKILL, "
                               f"often the out-of-memory killer); see its output above.")
        self.queued -= 1
        if status == "error":
            raise RuntimeError(f"the sampler process failed while collecting a rollout:\n{payload}")
        return payload

    def busy(self) -> bool:
        return self.queued > self.received.qsize()

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)


class AsyncRollouts:
    """A sampler at most `max_staleness` rollouts ahead of the learner, on its own copy of the weights: a
    forked process ("process", its own core) or a thread of the training process ("thread")."""

    def __init__(self, collector: RolloutCollector, timeout_s: float, max_staleness: int = 1,
                 worker: str | None = None) -> None:
        policy = collector.accelerator.unwrap_model(collector.model)
        # A forked child cannot use CUDA the parent initialised, nor a vLLM engine (its state and threads do
        # not survive a fork): a process on CPU with the in-process samplers, a thread otherwise.
        with_engine = isinstance(collector.sampler, VLLMSampler)
        worker = worker or ("process" if next(policy.parameters()).device.type == "cpu" and not with_engine else "thread")
        if with_engine and worker == "process":
            raise ValueError("the vLLM sampler's engine cannot be forked: run async_rollouts' sampler as a thread.")
        self.snapshot = copy.deepcopy(policy).eval().requires_grad_(False)  # the sampler's weights
        if with_engine:
            collector.sampler.prepare(self.snapshot)
        self.board = WeightBoard(self.snapshot, separate=max_staleness > 1)
        # With tools, the sampler runs its own copy of the multi-turn stage: its environments are its own.
        sampler_collector = dataclasses.replace(collector, model=self.snapshot, keep_old_logps=True,
                                                prompt_stage=collector.prompt_stage.for_sampler())
        if worker == "process":
            self.board.share_memory()
            self.runner: ThreadCollector | ForkedCollector = ForkedCollector(sampler_collector, self.board)
            if self.board.staging is not self.snapshot:  # the child has its own copy; this one is never read
                for tensor in self.snapshot.parameters():
                    tensor.data = torch.empty(0, dtype=tensor.dtype)
        else:
            self.runner = ThreadCollector(sampler_collector, self.board)
        self.policy, self.timeout_s, self.max_staleness = policy, timeout_s, max_staleness
        self.queued: collections.deque[int] = collections.deque()  # rollout indices, oldest first
        self.sampler_random_state: dict[str, Any] | None = None  # the sampler's, after its last delivered rollout
        self.resumed: dict[str, Any] | None = None  # a checkpoint's state(), for the first rollout after resume

    def state(self) -> dict[str, Any]:
        """Between rollouts (a checkpoint): what the sampler samples the next queued rollout with, for `restore`:
        `weights_step` (None when nothing is queued) and `weights`, the trainable tensors of the weights published
        for it (the policy's frozen ones are the same); `random_state`, the sampler's after the last rollout."""
        state: dict[str, Any] = {"weights_step": None, "weights": {}, "random_state": self.sampler_random_state}
        if self.queued:
            trainable = {name for name, p in self.policy.named_parameters() if p.requires_grad}
            with self.board.lock:
                state["weights_step"] = int(self.board.version.value)
                state["weights"] = {name: p.detach().clone() for name, p in self.board.staging.named_parameters()
                                    if name in trainable}
        return state

    def restore(self, state: dict[str, Any] | None) -> None:
        """On resume, before the first rollout: sample it from a checkpoint's `state()`."""
        self.resumed = state

    def sync_weights(self, step: int = 0) -> None:
        """Publish the policy's current weights (from optimizer step `step`) for the sampler's next rollout."""
        if self.board.staging is self.snapshot and self.runner.busy():
            raise RuntimeError("the sampler's weights were about to change while it was sampling (a bug in the loop).")
        self.board.publish(self.policy, step)

    def submit(self, rollout_index: int, rows: list[dict[str, Any]], global_step: int, episode: int) -> None:
        """Queue steps 1-4 of `rollout_index`."""
        self.runner.submit(rows, global_step, episode)
        self.queued.append(rollout_index)

    def result(self, rollout_index: int) -> tuple[Rollout, Samples, int, dict[str, Any]]:
        """The oldest queued rollout, which must be `rollout_index`, with the optimizer step of the weights
        that sampled it and the sampler's random state after it; raises RolloutTimeout after timeout_s."""
        if not self.queued or self.queued[0] != rollout_index:
            raise RuntimeError(f"the learner asked for rollout {rollout_index} but the sampler's queue holds "
                               f"{list(self.queued)} (a bug in the loop).")
        try:
            payload = self.runner.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise RolloutTimeout(f"the learner waited {self.timeout_s:.0f} s (async_rollout_timeout) for the sampler "
                                 f"to deliver rollout {rollout_index} (sampling, scoring, pi_old); it did not. A "
                                 f"reward function or the sampler may hang; raise async_rollout_timeout for slow ones, or "
                                 f"set async_rollouts=False to run them in the loop.") from None
        self.queued.popleft()
        return payload

    def next(self, rollout_index: int, rows_of: Callable[[int], list[dict[str, Any]]], global_step: int,
             episode: int, num_rollouts: int) -> tuple[Rollout, Samples, dict[str, float]]:
        """Rollout `rollout_index` (sampled now from the current weights when none is queued, as at the start
        of training), after which the rollouts up to `rollout_index + max_staleness` are queued. The metrics
        say how stale it is: `async/staleness`, the optimizer steps taken since its sampling weights."""
        if not self.queued:
            resumed, self.resumed = self.resumed or {}, None
            if resumed.get("weights_step") is not None:  # what the stopped run was sampling this rollout with
                self.board.publish_saved(self.policy, resumed["weights_step"], resumed["weights"])
            else:
                self.sync_weights(global_step)
            self.runner.submit(rows_of(rollout_index), global_step, episode, resumed.get("random_state"))
            self.queued.append(rollout_index)
        rollout, samples, weights_step, self.sampler_random_state = self.result(rollout_index)
        self.sync_weights(global_step)
        last = min(rollout_index + self.max_staleness, num_rollouts - 1)
        for ahead in range((self.queued[-1] if self.queued else rollout_index) + 1, last + 1):
            self.submit(ahead, rows_of(ahead), global_step, episode)
        return rollout, samples, {"async/staleness": float(global_step - weights_step)}

    def discard(self) -> None:
        """Drop the rollouts still queued (training ended before they were needed), after waiting for a
        sampler thread's: it must not be sampling when the loop goes on. A process is killed by close()."""
        if isinstance(self.runner, ThreadCollector):
            concurrent.futures.wait(self.runner.futures, timeout=self.timeout_s)
            self.runner.futures.clear()
        self.queued.clear()

    def close(self) -> None:
        """Stop the sampler (the process is killed; a thread finishes its rollout and ends)."""
        self.runner.close()


class AheadOfTheLearner:
    """The `sources.RolloutSource` of async_rollouts: an `AsyncRollouts` started when train() begins (a fresh copy of
    the weights, a new thread or process) and stopped when it ends, its queued rollouts dropped."""

    def __init__(self, collector: RolloutCollector, rows_of: Callable[[int], list[dict[str, Any]]], num_rollouts: int,
                 timeout_s: float, max_staleness: int = 1) -> None:
        self.collector, self.rows_of, self.num_rollouts = collector, rows_of, num_rollouts
        self.timeout_s, self.max_staleness = timeout_s, max_staleness
        self.running: AsyncRollouts | None = None  # while train() runs

    def start(self) -> None:
        self.running = AsyncRollouts(self.collector, self.timeout_s, self.max_staleness)

    def next(self, rollout_index: int, global_step: int, episode: int) -> tuple[Rollout, Samples, dict[str, float]]:
        return self.running.next(rollout_index, self.rows_of, global_step, episode, self.num_rollouts)

    def state(self) -> dict[str, Any] | None:
        return self.running.state() if self.running is not None else None

    def restore(self, state: dict[str, Any] | None) -> None:
        self.running.restore(state)

    def close(self) -> None:
        if self.running is not None:
            self.running.discard()
            self.running.close()
            self.running = None
