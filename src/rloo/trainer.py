"""RLOOTrainer: REINFORCE Leave-One-Out, one loop that reads top to bottom.

Each rollout on each process:
  1. takes `prompts_per_rollout` prompts and samples K = num_generations completions of each
     (cut at stop strings);
  2. scores every completion with the reward functions and shapes the scores;
  3. when beta > 0, folds the sequence KL to the frozen reference into the reward (kl_penalty
     "sequence" or "token"): r = score - beta * sum_t kl_t;
  4. computes advantages within each group of K (default: leave-one-out,
     A_i = r_i - (sum_j r_j - r_i) / (K - 1));
  5. spends the rollout in num_iterations * num_mini_batches optimizer steps, each minimising
     -A * log pi(y|x) (PPO-style clipped ratio once the batch is off-policy);
  6. logs, checkpoints, and goes on.

Steps 1-4 are `rollout.RolloutCollector`, step 5 is `update.Learner`, step 6 is `metrics` and
`checkpoint`; `builders` builds what they share, and `run.trainer_api.TrainerAPI` holds the methods of
transformers' Trainer that scripts and callbacks call. Accelerate owns devices, processes, mixed
precision, trackers and saved state. docs/architecture.md maps the rest.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from rloo import builders, evaluation, safe_text
from rloo.config import ConfigError, RLOOConfig
from rloo.data.dataset_rows import check_prompts, named_eval_sets, train_rows
from rloo.data.prompts import check_vocabulary
from rloo.data.schedule import select_rows
from rloo.distributed import heartbeat, sharding
from rloo.event_loop import EventLoop
from rloo.generation.base import Sampler
from rloo.passes import reference_sync
from rloo.rollout import Rollout, RolloutCollector, Samples
from rloo.rollout.prompt_stages import prompt_stage
from rloo.rollout.sources import rollout_source, zero_spread_message
from rloo.run import checkpoint, report, trainer_api
from rloo.run.allocator import empty_device_cache_every, return_large_buffers_to_os
from rloo.run.metrics import MetricsLogger, MetricsWindow, completion_rows, log_due, rollout_metrics, with_trl_names
from rloo.run.run_dir import StopSignals, check_output_dir, prepare_output_dir, resume_hint, truncate_history
from rloo.run.run_lock import lock_output_dir
from rloo.run.verbosity import set_library_verbosity
from rloo.update import Learner, mini_batches


class RLOOTrainer(trainer_api.TrainerAPI):
    """Train a causal LM with RLOO.

    Args:
        model: a model id or local path (loaded with AutoModelForCausalLM) or a PreTrainedModel.
        reward_funcs: a callable or list of callables `f(prompts, completions, completion_ids, **columns)`
            returning one float (or None: does not apply) per completion. Each receives only the
            arguments its signature names. A string (model id or path) or a PreTrainedModel is a
            reward model (AutoModelForSequenceClassification, num_labels=1); see `rewards.reward_model`.
        args: the RLOOConfig.
        train_dataset: a `datasets.Dataset` with a "prompt" column (strings, or lists of chat messages);
            other columns reach reward functions.
        eval_dataset: optional prompts scored during and after training (eval/reward).
        processing_class: the tokenizer, or a VLM's processor (image/images columns, docs/vision.md); from `model` if None.
        peft_config: a peft config; the policy trains adapters and the reference is the model with
            adapters disabled, so no second copy of the weights is kept.
        reward_model: the name seed scripts use for `reward_funcs`; give one or the other.
        reward_processing_classes: the reward models' tokenizers: one, or a list aligned with
            `reward_funcs` (None for plain functions); loaded from each reward model when None.
        sampler: how completions are generated (`generation.base.Sampler`); by default the one
            `args.sampler` names, stopping at the tokenizer's EOS, the model's
            `generation_config.eos_token_id` and `args.stop_token_ids`.
        callbacks, optimizers, quantization_config: as in TRL (see `trainer_api`): transformers
            TrainerCallbacks, an (optimizer, scheduler) pair replacing the built ones (either may be None),
            and a quantization config passed to from_pretrained when the model is given by name.
        tools, environment_factory, rollout_func: multi-turn rollouts, as TRL's GRPOTrainer (docs/multi_turn.md).
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
        sampler: Sampler | None = None,
        callbacks: Sequence[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        tools: Sequence[Callable] | None = None, rollout_func: Callable | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
    ) -> None:
        reward_funcs = trainer_api.check_arguments(reward_funcs, reward_model, train_dataset, sampler, environment_factory)
        self.args = args = args if args is not None else RLOOConfig()
        check_output_dir(args.output_dir)  # before anything loads
        lock_output_dir(args.output_dir, owner=self)  # one run per folder, held while this trainer lives
        set_library_verbosity(args.log_level)  # the libraries' progress bars and log levels
        self.accelerator = acc = builders.build_accelerator(args)
        return_large_buffers_to_os()  # else glibc keeps the decode loop's freed (rows, V) buffers (allocator.py)
        set_seed(args.seed)
        self.processing_class, self.tokenizer = builders.load_processing_class(processing_class, model, train_dataset, args)
        train_dataset = train_rows(args, train_dataset, acc.num_processes, environment_factory)  # streams read once
        check_prompts(args, self.tokenizer, train_dataset, eval_dataset)  # before weights load or sizes derive
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset

        policy = builders.load_policy(model, peft_config, args, quantization_config, self.processing_class)
        check_vocabulary(self.tokenizer, policy)
        self.model_name = model if isinstance(model, str) else getattr(policy.config, "_name_or_path", None)
        reference = sharding.reference_in_compute_dtype(builders.build_reference(policy, args), acc)
        self.schedule, self.num_rollouts, self.total_steps = builders.build_schedule(args, len(train_dataset),
                                                                                     acc.num_processes)
        self.model, self.optimizer, self.lr_scheduler = builders.prepare_for_training(acc, policy, optimizers, args,
                                                                                      self.total_steps)
        self.reference = None if reference is None else sharding.prepare_reference(acc, reference)
        self.collector = self._build_collector(policy, sampler, reward_funcs, reward_processing_classes, tools,
                                               environment_factory, rollout_func)  # steps 1-4
        self.learner = Learner(args, acc, self.model, self.optimizer, self.lr_scheduler)  # step 5
        # plain, dynamic_sampling or async_rollouts (`rollout.sources`): chosen here, once
        self.rollouts = rollout_source(args, acc, self.collector, train_dataset, self._rows, self.num_rollouts)

        self.logger = MetricsLogger(acc, args.output_dir, args.report_to)  # step 6
        self.global_step = 0
        self.episode = 0
        self.run_id = uuid.uuid4().hex  # marks this run's checkpoints; a resumed run takes the checkpoint's
        self.stopped_by: str | None = None  # the signal that stopped train() early, if any
        self._evaluated_at = -1  # the step last evaluated at: `_log_eval` evaluates once per step
        self._last_eval: dict[str, float] = {}
        self._reported_zero_spread = False  # the zero-spread console line is said once per run
        self._claimed_output_dir = False  # prepare_output_dir ran: a second train() continues its own files
        self._attach_callbacks(callbacks)
        self._expose_trl_attributes()
        builders.check_run_options(args, acc, self.reference, eval_dataset)

    def _build_collector(self, policy: torch.nn.Module, sampler: Sampler | None, reward_funcs: Any,
                         reward_processing_classes: Any, tools: Any, environment_factory: Any,
                         rollout_func: Any) -> RolloutCollector:
        """Steps 1-4, each part chosen once: the sampler, the multi-turn stage (None: single completions), the
        reward functions, and step 1's stage for text, images or multi-turn prompts (`rollout.prompt_stages`)."""
        args, acc, columns = self.args, self.accelerator, self.train_dataset.column_names
        self.sampler = sampler if sampler is not None else builders.default_sampler(args, self.tokenizer,
                                                                                    acc.unwrap_model(self.model))
        event_loop = EventLoop(owner=self)  # the run's one loop for async tools and reward functions
        self.multi_turn = builders.build_multi_turn(args, self.tokenizer, self.sampler, tools, environment_factory,
                                                    rollout_func, trainer=self,  # the trainer: rollout_func's argument
                                                    event_loop=event_loop)
        self.reward_functions, self.reward_weights = builders.build_rewards(
            args, reward_funcs, reward_processing_classes, acc.device, columns, self.multi_turn)
        step1 = prompt_stage(args, self.processing_class, self.tokenizer, self.sampler, policy, columns, acc.device,
                             self.multi_turn)
        return RolloutCollector(args, acc, self.model, self.reference, self.tokenizer, self.sampler,
                                self.reward_functions, self.reward_weights, step1, event_loop=event_loop)

    def _sync_reference(self) -> None:
        """Every ref_model_sync_steps optimizer steps: reference <- (1 - alpha) * reference + alpha * policy."""
        if self.args.sync_ref_model and self.global_step % self.args.ref_model_sync_steps == 0:
            reference_sync.sync_reference(self.accelerator.unwrap_model(self.reference),
                                          self.accelerator.unwrap_model(self.model), self.args.ref_model_mixup_alpha)

    def _attach_callbacks(self, callbacks: Sequence[Any] | None) -> None:
        """transformers TrainerCallbacks and a TrainerState (log_history), which is also a metrics sink
        and what reward functions receive as `trainer_state`."""
        acc = self.accelerator
        self.callback_handler = trainer_api.Callbacks(callbacks, self.args, self.total_steps, acc.is_main_process)
        self.callback_handler.models = {"model": self.model, "processing_class": self.processing_class,
                                        "optimizer": self.optimizer, "lr_scheduler": self.lr_scheduler}
        self.logger.sinks.append(self.callback_handler)
        self.state = self.collector.trainer_state = self.callback_handler.state
        self.hub_model_id = self.args.hub_model_id or Path(self.args.output_dir).name
        self.callback_handler.event("on_init_end")

    # ------------------------------------------------------------------ the loop

    def train(self, resume_from_checkpoint: str | bool | None = None) -> trainer_api.TrainOutput:
        """Run the training loop; returns TrainOutput(global_step, training_loss, metrics), which also
        reads like the dict of the last logged metrics.

        resume_from_checkpoint: a checkpoint directory, or True / "latest" for the newest complete
        one in output_dir (a fresh start when there is none). SIGTERM or SIGINT stops the loop after
        the current rollout's optimizer steps with a checkpoint (`self.stopped_by` names the signal).
        """
        with StopSignals() as self._signals, heartbeat.Heartbeat.for_process_group(self.args.ddp_timeout) as self.heartbeat:
            self.rollouts.start()  # async_rollouts' sampler starts here, on a copy of the current weights
            try:
                return self._train(resume_from_checkpoint)
            finally:
                self.rollouts.close()

    def _train(self, resume_from_checkpoint: str | bool | None) -> trainer_api.TrainOutput:
        # The whole loop in one function (~60 lines), on purpose: it is the part a reader came for.
        args, acc = self.args, self.accelerator
        start_rollout = self._resume(resume_from_checkpoint)
        train_start, start_episode, start_step = time.perf_counter(), self.episode, self.global_step
        control = self._begin()
        window = MetricsWindow()
        last_metrics: dict[str, float] = {}
        progress = tqdm(total=self.total_steps, initial=self.global_step, desc="RLOO", position=0,  # 0: no cursor escapes
                        disable=not acc.is_main_process or bool(args.disable_tqdm), dynamic_ncols=True)
        window_start, window_episodes = time.perf_counter(), 0

        for rollout_index in range(start_rollout, self.num_rollouts):
            rollout, samples, source_stats = self._collect_rollout(rollout_index)  # steps 1-4
            rollout_stats = rollout_metrics(rollout, acc, args.num_generations,
                                            [fn.name for fn in self.reward_functions])
            self._report_zero_spread(rollout_stats)
            episodes = rollout.scores.numel() * acc.num_processes
            self.episode += episodes
            window_episodes += episodes

            for mini_batch in mini_batches(rollout, args):  # step 5: num_iterations * num_mini_batches steps
                step_stats = self.learner.step(mini_batch)
                self.sampler.on_optimizer_step(acc.unwrap_model(self.model))
                self.global_step += 1
                self.heartbeat.beat(f"after optimizer step {self.global_step}")
                empty_device_cache_every(self.global_step, args.torch_empty_cache_steps)
                self._sync_reference()
                self.callback_handler.advance(self.global_step, self.epoch, self.episode)
                control = self.callback_handler.event("on_step_end")
                window.add({**rollout_stats, **source_stats, **samples.metrics, **step_stats})
                progress.update(1)
                progress.set_postfix(reward=f"{rollout_stats['reward']:.3f}")

                is_last = self.global_step >= self.total_steps or control.should_training_stop
                if log_due(self.global_step, args, is_last):  # step 6
                    elapsed = time.perf_counter() - window_start
                    last_metrics = self._log(window.mean_and_reset(), window_episodes / max(elapsed, 1e-9),
                                             samples, rollout)
                    window_start, window_episodes = time.perf_counter(), 0
                if self.eval_dataset is not None and args.eval_steps > 0 and self.global_step % args.eval_steps == 0:
                    self._log_eval()
                if args.save_steps > 0 and self.global_step % args.save_steps == 0:
                    checkpoint.save_checkpoint(acc, self.model, self.processing_class, args, self.global_step,
                                               rollout_index, self.episode, self.run_id, self.rollouts.state())
                    self.callback_handler.event("on_save")
                if is_last:
                    break
            if self.global_step >= self.total_steps or control.should_training_stop:
                break
            if self._stop_requested():  # SIGTERM / SIGINT: stop between rollouts, with a checkpoint
                self._save_on_signal(rollout_index)
                break

        progress.close()
        return self._finish(last_metrics, time.perf_counter() - train_start, self.episode - start_episode,
                            self.global_step - start_step)

    def _begin(self) -> Any:
        """Before the first step: trackers, the run card, on_train_begin, and eval_on_start's baseline (a resumed
        run's at the step it resumes from); returns the callbacks' TrainerControl."""
        self.logger.start(self.args.to_dict(), self.args.run_name)
        self._write_run_card()
        self.model.train()
        self.callback_handler.advance(self.global_step, self.epoch, self.episode)
        control = self.callback_handler.event("on_train_begin")
        if self.args.eval_on_start:
            self._log_eval()
        return control

    def _finish(self, last_metrics: dict[str, float], runtime: float, episodes: int, steps: int
                ) -> trainer_api.TrainOutput:
        """After the loop: unless a signal stopped it, the final eval, the model (`saves_final_model`), TRL's closing entry."""
        if self.stopped_by is None:
            if self.eval_dataset is not None:
                last_metrics.update(self._log_eval())
            if trainer_api.saves_final_model(self.args):
                self.save_model(self.args.output_dir)
            last_metrics.update(self._log_closing(runtime, episodes, steps))
            self.callback_handler.event("on_train_end")
        getattr(self.sampler, "close", lambda: None)()  # an engine's process groups go before accelerate's (base.Sampler)
        self.accelerator.end_training()
        return trainer_api.TrainOutput(self.global_step, self._training_loss(), last_metrics)

    def _report_zero_spread(self, rollout_stats: dict[str, float]) -> None:
        """Once per run, on the console: a rollout in which every group has zero spread trains nothing."""
        if rollout_stats.get("frac_reward_zero_std", 0.0) < 1.0 or self._reported_zero_spread:
            return
        self._reported_zero_spread = True
        if self.accelerator.is_main_process:
            tqdm.write(zero_spread_message(self.global_step, self.args.num_generations, rollout_stats["reward"]))

    def _write_run_card(self) -> None:
        """output_dir/run.json: the model, dataset and reward functions (`rloo report` names them)."""
        if self.accelerator.is_main_process:
            card = report.run_card(self.accelerator.unwrap_model(self.model), self.train_dataset,
                                   [fn.name for fn in self.reward_functions],
                                   [float(w) for w in self.reward_weights], self.args.to_dict())
            report.write_run_card(self.args.output_dir, card)

    def _resume(self, resume_from_checkpoint: str | bool | None) -> int:
        """Check output_dir, load the checkpoint to resume from (if any), cut the history back to
        it; returns the rollout to start from."""
        args, acc = self.args, self.accelerator
        path = checkpoint.resolve_checkpoint(resume_from_checkpoint, args.output_dir) if resume_from_checkpoint else None
        if path is None:
            if acc.is_main_process:
                if resume_from_checkpoint:  # "latest" with none yet: a fresh start in the same directory
                    truncate_history(args.output_dir, 0)
                elif not self._claimed_output_dir:  # a second train() of this trainer continues its own files
                    prepare_output_dir(args.output_dir, args.overwrite_output_dir)
            self._claimed_output_dir = True
            acc.wait_for_everyone()
            return 0
        state = checkpoint.load_checkpoint(acc, self.model, path, args)
        self.global_step, self.episode = state["global_step"], state["episode"]
        self.rollouts.restore(state["rollout_state"])  # async_rollouts: what its sampler sampled the next rollout with
        if acc.is_main_process:
            tqdm.write(safe_text.visible(f"rloo: resuming from {path.name} (step {self.global_step} of {self.total_steps})."))
        self.run_id = state.get("run_id") or self.run_id
        if acc.is_main_process:
            truncate_history(args.output_dir, self.global_step)
        acc.wait_for_everyone()
        self._claimed_output_dir = True
        return state["rollout_index"] + 1

    def _stop_requested(self) -> bool:
        """Whether any process received a stop signal (all processes agree)."""
        requested = torch.tensor(float(self._signals.received is not None), device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            requested = self.accelerator.reduce(requested, reduction="max")
        return bool(requested.item())

    def _save_on_signal(self, rollout_index: int) -> None:
        args, signal_name = self.args, self._signals.received
        path = Path(args.output_dir) / f"checkpoint-{self.global_step}"
        if checkpoint.read_state(path) is None or checkpoint.read_state(path).get("run_id") != self.run_id:
            path = checkpoint.save_checkpoint(self.accelerator, self.model, self.processing_class, args, self.global_step,
                                              rollout_index, self.episode, self.run_id, self.rollouts.state())
        self.stopped_by = signal_name or "a signal on another process"
        if self.accelerator.is_main_process:
            tqdm.write(safe_text.visible(f"rloo: stopped by {self.stopped_by} at step {self.global_step}/{self.total_steps}; "
                               f"checkpoint saved to {path}. {resume_hint(args)}"))

    def _rows(self, rollout_index: int) -> list[dict[str, Any]]:
        """This process's dataset rows of rollout `rollout_index`."""
        return select_rows(self.train_dataset, self.schedule.rows(rollout_index, self.accelerator.process_index))

    def _collect_rollout(self, rollout_index: int) -> tuple[Rollout, Samples, dict[str, float]]:
        """Steps 1-4 from the rollout source, with its metrics (dynamic_sampling/*, async/*). Its seconds join
        the next optimizer step's step_time, as TRL counts generation in the step that triggers it."""
        with self.learner.timed_wait(), self.heartbeat.after(f"rollout {rollout_index}"):  # (heartbeat: once collected)
            return self.rollouts.next(rollout_index, self.global_step, self.episode)

    def _log(self, window: dict[str, float], eps: float, samples: Samples, rollout: Rollout) -> dict[str, float]:
        metrics = with_trl_names({
            **window,
            "objective/entropy": window.get("policy/entropy_avg", float("nan")),
            "eps": eps,
            "lr": self.learner.step_lr,  # the rate the logging step used, not the next one
            "episode": float(self.episode),
        })
        self.logger.log(metrics, self.global_step)
        self._logs = trainer_api.trl_logs(samples.prompts, samples.completions, [fn.name for fn in self.reward_functions],
                                          rollout.reward_columns, rollout.advantages.tolist(), samples.extra,
                                          samples.images)
        if self.args.log_completions:
            rows = completion_rows(samples.prompts, samples.shown(), [fn.name for fn in self.reward_functions],
                                   rollout.reward_columns, rollout.scores.tolist(), rollout.advantages.tolist(),
                                   self.global_step, self.args.num_completions_to_print, samples.extra,
                                   samples.turn_records())
            self.logger.log_completions(rows, self.global_step)
        return metrics

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Eval metrics of num_generations_eval sampled completions of every eval prompt (`evaluation`).
        A dict of datasets is evaluated one by one, prefixed "<prefix>_<name>/" as in transformers."""
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if eval_dataset is None:
            raise ConfigError("evaluate() needs an eval_dataset.")
        num_generations = self.args.num_generations_eval or self.args.num_generations
        metrics, self.eval_samples = {}, []  # eval_samples: every scored sample, a row each (evaluation.sample_rows)
        for name, dataset in named_eval_sets(eval_dataset):
            prefix = metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"
            figures = evaluation.evaluate(self.collector, dataset, [fn.name for fn in self.reward_functions],
                                          num_generations, self._eval_prompts_per_batch(num_generations),
                                          self.global_step, f"{prefix}/", self.eval_samples, name)
            # transformers' and TRL's spelling too ("eval_reward"; TRL's trackers chart it as "eval/reward")
            metrics.update({**figures, **{f"{prefix}_{k[len(prefix) + 1:]}": v for k, v in figures.items()}})
        self.logger.log_eval_completions(self.eval_samples if self.args.log_completions else [])  # eval_completions.jsonl
        self.callback_handler.event("on_evaluate", metrics=metrics)
        return metrics

    def _eval_prompts_per_batch(self, num_generations: int) -> int:
        """Prompts sampled together in evaluation: per_device_eval_batch_size completions when it is set
        (whole groups, at least one), else the training step's prompts."""
        size = self.args.per_device_eval_batch_size
        return self.args.prompts_per_step if size is None else max(1, size // num_generations)

    def _log_eval(self) -> dict[str, float]:
        """Evaluate and log once per step: the last step's eval is not repeated after the loop."""
        if self._evaluated_at != self.global_step:
            self._evaluated_at = self.global_step
            self._last_eval = self.logger.log(self.evaluate(), self.global_step)
        return self._last_eval
