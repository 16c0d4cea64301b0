"""The parts of the transformers Trainer API that TRL scripts use, kept out of the loop in trainer.py.

* `Callbacks`: transformers `TrainerCallback` objects get on_train_begin / on_step_end / on_log /
  on_save / on_evaluate / on_train_end with a transformers `TrainerState` (global_step, epoch,
  log_history, max_steps) and `TrainerControl` (`should_training_stop` is honoured).
* `TrainOutput`: what `train()` returns, transformers' (global_step, training_loss, metrics) tuple
  that also reads like the metrics dict (`out["reward"]`), as rloo's train() returned before.
* `get_train_dataloader()` / `get_eval_dataloader()` (their loaders are built in `data/dataset_rows.py`) and
  `trl_logs`, TRL's `_logs` buffer, for callbacks and scripts that read them.
* `write_model_card` and `push_to_hub`: README.md next to the saved model; pushing needs the network.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import TrainerCallback, TrainerControl
from transformers.trainer_utils import TrainOutput as _TrainOutput

from rloo._version import __version__
from rloo.config import ConfigError
from rloo.data.dataset_rows import ScheduleOrder, is_streamed, named_eval_sets, prompt_loader
from rloo.generation.base import Sampler
from rloo.rewards.reward_model import RewardModel
from rloo.rewards.trl_names import TrainerStateView
from rloo.rollout.rollout_func import RolloutGeneration
from rloo.run import checkpoint
from rloo.run.run_lock import LOCK_NAME

logger = logging.getLogger(__name__)


class TrainOutput(_TrainOutput):
    """transformers' TrainOutput(global_step, training_loss, metrics); `out[name]` also reads a metric."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        return self.metrics[key] if isinstance(key, str) else super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        return key in self.metrics if isinstance(key, str) else super().__contains__(key)

    def keys(self):
        return self.metrics.keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self.metrics.get(key, default)


class Callbacks:
    """Runs TrainerCallback events with a TrainerState and TrainerControl, as transformers' Trainer does.

    It is also a metrics sink (`log(metrics, step)`): every logged dict lands in
    `state.log_history` (with "step" and "epoch") and reaches `on_log`.
    """

    def __init__(self, callbacks: Sequence[TrainerCallback] | None, args: Any, max_steps: int,
                 is_main_process: bool) -> None:
        self.callbacks = []
        for callback in callbacks or []:
            self.callbacks.append(callback() if isinstance(callback, type) else callback)  # a class, as transformers allows
        for callback in self.callbacks:
            if not isinstance(callback, TrainerCallback) and not any(hasattr(callback, e) for e in EVENTS):
                raise TypeError(f"callback {callback!r} is not a transformers.TrainerCallback and has none of {EVENTS}.")
        self.args = args
        self.state = TrainerStateView(max_steps=max_steps, logging_steps=args.logging_steps,
                                  eval_steps=args.eval_steps, save_steps=args.save_steps,
                                  is_world_process_zero=is_main_process, is_local_process_zero=is_main_process)
        self.control = TrainerControl()
        self.models: dict[str, Any] = {}  # model, processing_class, optimizer, lr_scheduler for the events

    def add_callback(self, callback: TrainerCallback) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def event(self, name: str, **kwargs: Any) -> TrainerControl:
        for callback in self.callbacks:
            handler = getattr(callback, name, None)
            if handler is not None:
                result = handler(self.args, self.state, self.control, **self.models, **kwargs)
                if isinstance(result, TrainerControl):
                    self.control = result
        return self.control

    def advance(self, global_step: int, epoch: float, episode: int) -> None:
        self.state.global_step, self.state.epoch, self.state.episode = global_step, epoch, episode

    def log(self, metrics: dict[str, float], step: int) -> None:
        logs = {**metrics, "epoch": self.state.epoch, "step": step}
        self.state.log_history.append(logs)
        self.event("on_log", logs=dict(metrics))


EVENTS = ("on_init_end", "on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_save", "on_evaluate",
          "on_train_end")


def trl_logs(prompts: Sequence[Any], completions: Sequence[str], reward_names: Sequence[str], reward_columns: Any,
             advantages: Sequence[float], extra: dict[str, Sequence[Any]] | None, images: Any = None) -> dict[str, Any]:
    """TRL's `trainer._logs` buffer for the last logged rollout of this process: prompt, completion,
    rewards per function (NaN where a function did not apply), advantages, `log_extra` columns and the prompts'
    images (log_multimodal; empty otherwise)."""
    columns = reward_columns.tolist()
    return {"prompt": list(prompts), "completion": list(completions),
            "rewards": {name: [row[i] for row in columns] for i, name in enumerate(reward_names)},
            "advantages": list(advantages), "extra": {k: list(v) for k, v in (extra or {}).items()},
            "images": list(images or [])}


def write_model_card(output_dir: str | Path, args: Any, model_name: str | None, dataset_name: str | None = None,
                     tags: Sequence[str] = ()) -> Path:
    """README.md in `output_dir`: Hub metadata, how the model was trained, and how to cite RLOO."""
    front = ["---", "library_name: transformers", "tags:", *(f"- {t}" for t in ("rloo", "reinforcement-learning",
                                                                               *tags))]
    if model_name:
        front.append(f"base_model: {model_name}")
    if dataset_name:
        front += ["datasets:", f"- {dataset_name}"]
    front.append("---")
    config = args.to_dict()
    body = [
        f"# {Path(output_dir).name}",
        "",
        f"Trained from `{model_name or 'a local model'}` with RLOO (REINFORCE Leave-One-Out) using "
        f"rloo {__version__}"
        + (f" on `{dataset_name}`." if dataset_name else "."),
        "",
        "## Training",
        "",
        "| setting | value |", "|---|---|",
        *(f"| {k} | `{config[k]}` |" for k in ("learning_rate", "num_generations", "beta", "advantage_estimator",
                                              "per_device_train_batch_size", "gradient_accumulation_steps",
                                              "max_completion_length", "max_steps", "seed") if k in config),
        "",
        "## Citation",
        "",
        "Ahmadian et al., *Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human "
        "Feedback in LLMs*, ACL 2024, https://arxiv.org/abs/2402.14740",
        "",
    ]
    path = Path(output_dir) / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(front + [""] + body))
    return path


def push_to_hub(output_dir: str | Path, repo_id: str, token: str | None = None, private: bool | None = None,
                revision: str | None = None, commit_message: str = "End of training") -> str:
    """Upload `output_dir` to the Hub; a clear error when offline. Returns the commit URL."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    where = f"The model and its card are saved in {output_dir}; push it later with `hf upload {repo_id} {output_dir}`."
    if offline:
        raise RuntimeError(f"push_to_hub: HF_HUB_OFFLINE is set, so nothing can be pushed to {repo_id}. {where}")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=str(output_dir), revision=revision,
                                   commit_message=commit_message, ignore_patterns=[LOCK_NAME])  # the run's lock
    except Exception as error:  # noqa: BLE001 - any network or auth failure gets the same advice
        raise RuntimeError(f"push_to_hub to {repo_id} failed ({type(error).__name__}: {error}). "
                           f"Pushing needs network access to the Hub and a token (`hf auth login`). {where}") from error
    return str(getattr(commit, "commit_url", commit))


class TrainerAPI:
    """The methods of transformers' Trainer (and TRL's attributes) that scripts and callbacks call,
    mixed into RLOOTrainer so that trainer.py keeps the loop. They read the trainer's own state
    (args, accelerator, model, schedule, state, ...); none of them changes how it trains."""

    def _expose_trl_attributes(self) -> None:
        """The attributes TRL's trainer has that scripts and callbacks read: the reference model (None
        when beta is 0 or under LoRA), the reward functions with reward models as their models, each
        one's tokenizer (None for plain functions), their names and weights (a tensor), the tools (the given ones,
        then each environment class's methods, bound to its first instance), whether a MoE router loss is added
        (router_aux_loss_coef), num_generations, and `vllm_generation` (a rollout_func's sampler: RolloutGeneration)."""
        self.ref_model = self.reference
        self.reward_funcs = [fn.func.model if isinstance(fn.func, RewardModel) else fn.func
                             for fn in self.reward_functions]
        self.reward_processing_classes = [fn.func.tokenizer if isinstance(fn.func, RewardModel) else None
                                          for fn in self.reward_functions]
        self.reward_func_names = [fn.name for fn in self.reward_functions]  # an environment's reward: its class name
        self.reward_weights = torch.tensor(self.reward_weights, dtype=torch.float32)  # TRL's type; the loop has its copy
        self.aux_loss_enabled = self.learner.aux_loss_coef > 0
        multi_turn = getattr(self, "multi_turn", None)
        self.tools = [] if multi_turn is None else multi_turn.listed_tools()
        self.rollout_func = None if multi_turn is None else multi_turn.rollout_func
        self.max_tool_calling_iterations = self.args.max_tool_calling_iterations
        self.num_generations, self.vllm_generation = self.args.num_generations, RolloutGeneration(self.collector)
        self._logs = trl_logs([], [], [], torch.zeros(0, 0), [], None)  # TRL's buffer, filled at each log

    @property
    def environments(self) -> list[Any] | None:
        """The environment instance of each trajectory of the last rollout (TRL's attribute); None without environments."""
        multi_turn = getattr(self, "multi_turn", None)
        return None if multi_turn is None else multi_turn.environments

    def _log_closing(self, runtime: float, episodes: int, steps: int) -> dict[str, float]:
        """The entry transformers' Trainer closes log_history with (train_runtime, train_samples_per_second,
        train_steps_per_second, train_loss, epoch); it reaches callbacks' on_log but not rloo's metric files.
        TRL's also carries the training figures of the steps since the last log; rloo always logs the last
        step, so that step's log entry moves into the closing one (each step's figures stay in one entry)."""
        train_loss, history = self._training_loss(), self.state.log_history
        last = next((i for i in range(len(history) - 1, -1, -1)
                     if history[i].get("step") == self.global_step and "loss/policy_avg" in history[i]), None)
        carried = {k: v for k, v in history.pop(last).items() if k not in ("step", "epoch")} if last is not None else {}
        closing = {**carried, "train_runtime": round(runtime, 4),
                   "train_samples_per_second": round(episodes / max(runtime, 1e-9), 3),
                   "train_steps_per_second": round(steps / max(runtime, 1e-9), 3),
                   "total_flos": 0.0, "train_loss": train_loss, "epoch": self.epoch}
        self.callback_handler.log(closing, self.global_step)
        return closing

    def _training_loss(self) -> float:
        losses = [log["loss/policy_avg"] for log in self.state.log_history if "loss/policy_avg" in log]
        return sum(losses) / max(len(losses), 1)

    @property
    def epoch(self) -> float:
        """Passes over the training prompts so far (fractional), as TrainerState.epoch counts them."""
        return self.episode / (self.args.num_generations * max(len(self.train_dataset), 1))

    def get_train_dataloader(self) -> Any:
        """transformers' Trainer API for callbacks and scripts: this process's prompts in the order rloo trains
        on them, one rollout's prompts per batch (the loop itself reads the schedule, not this loader)."""
        order = ScheduleOrder(lambda r: self.schedule.rows(r, self.accelerator.process_index),
                              self.num_rollouts, self.args.prompts_per_rollout)
        return prompt_loader(self.train_dataset, order, self.args.prompts_per_rollout, self.args.dataloader_num_workers)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """transformers' Trainer API: the eval prompts in the batches evaluate() samples them (a streamed set
        is read in the main process); `eval_dataset` may name one set of a dict, as in transformers."""
        eval_dataset = self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) else (
            eval_dataset if eval_dataset is not None else self.eval_dataset)
        if eval_dataset is None or isinstance(eval_dataset, dict):
            raise ConfigError("get_eval_dataloader() needs one eval set: pass it, or the name of one set of the "
                              "eval_dataset dict.")
        workers = 0 if is_streamed(eval_dataset) else self.args.dataloader_num_workers
        rows = named_eval_sets(eval_dataset)[0][1]
        num_generations = self.args.num_generations_eval or self.args.num_generations
        return prompt_loader(rows, None, self._eval_prompts_per_batch(num_generations), workers)

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the policy (or its adapters under LoRA) and the processing class (a VLM's processor) with save_pretrained."""
        checkpoint.save_model(self.accelerator, self.model, self.processing_class, self.args,
                              output_dir or self.args.output_dir)
        if self.accelerator.is_main_process:  # the model card travels with the weights
            self.create_model_card(output_dir=output_dir)

    def end(self) -> None:
        """Finish the trackers, as transformers' Trainer.end() (TRL scripts call it); train() already has."""
        self.accelerator.end_training()

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: Sequence[str] | None = None, output_dir: str | None = None) -> Path:
        """Write README.md (Hub metadata, training settings, citation) next to the saved model."""
        return write_model_card(output_dir or self.args.output_dir, self.args, model_name or self.model_name,
                                dataset_name, tags or ())

    def push_to_hub(self, commit_message: str = "End of training", dataset_name: str | None = None,
                    token: str | None = None, revision: str | None = None, **_: Any) -> str:
        """Save the model and its card, then upload output_dir to `args.hub_model_id` (needs the network;
        offline it raises with where the files are). Returns the commit URL."""
        self.save_model(self.args.output_dir)
        self.create_model_card(dataset_name=dataset_name)
        return push_to_hub(self.args.output_dir, self.hub_model_id, token or self.args.hub_token,
                           self.args.hub_private_repo, revision or self.args.hub_revision, commit_message)


def saves_final_model(args: Any) -> bool:
    """Whether train() writes the final model into output_dir: yes, unless TRL's save_strategy="no" was
    given (TRL's train() writes no weights then, and scripts call save_model); save_steps=0 alone keeps it."""
    return args.save_strategy != "no"


def check_arguments(reward_funcs: Any, reward_model: Any, train_dataset: Any, sampler: Any,
                    environment_factory: Any = None) -> Any:
    """The arguments RLOOTrainer cannot do without; returns the reward functions (given either way).
    With an environment_factory, reward_funcs may be left out: its environment's get_reward can be the reward."""
    if reward_funcs is not None and reward_model is not None:
        raise ConfigError("Both reward_funcs and reward_model were given; they are the same argument. Pass one.")
    reward_funcs = reward_funcs if reward_funcs is not None else reward_model
    no_functions = reward_funcs is None or (isinstance(reward_funcs, (list, tuple)) and len(reward_funcs) == 0)
    if environment_factory is not None and no_functions:
        reward_funcs = []
    elif no_functions:
        raise ConfigError("RLOOTrainer needs reward_funcs: a function (or list) scoring each completion.")
    for func in reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]:
        if not (callable(func) or isinstance(func, (str, torch.nn.Module))):
            raise ConfigError(f"reward_funcs holds {func!r} ({type(func).__name__}); each entry must be a function "
                              f"f(prompts, completions, **columns), a reward model, or a reward model's path.")
    if train_dataset is None and environment_factory is None:  # TRL's wording first: user code may match it
        raise ConfigError("`train_dataset` is required: RLOOTrainer needs a train_dataset with a 'prompt' column.")
    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(f"sampler {sampler!r} does not follow rloo.generation.Sampler: it needs "
                        f"sample(model, prompts, num_generations) and on_optimizer_step(model).")
    return reward_funcs
