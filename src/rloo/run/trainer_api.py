"""The parts of the transformers Trainer API that TRL scripts use, kept out of the loop in trainer.py.

* `Callbacks`: transformers `TrainerCallback` objects get on_train_begin / on_step_end / on_log /
  on_save / on_evaluate / on_train_end with a transformers `TrainerState` (global_step, epoch,
  log_history, max_steps) and `TrainerControl` (`should_training_stop` is honoured).
* `TrainOutput`: what `train()` returns, transformers' (global_step, training_loss, metrics) tuple
  that also reads like the metrics dict (`out["reward"]`), as rloo's train() returned before.
* `take_rows`: an `IterableDataset` (no length) becomes the finite list of rows a run of `max_steps` reads.
* `settle_streamed_train_options`: TRL's two DataLoader rules for a streamed train set.
* `prompt_loader` and `trl_logs`: `get_train_dataloader()` / `get_eval_dataloader()` and TRL's `_logs`
  buffer, for callbacks and scripts that read them.
* `write_model_card` and `push_to_hub`: README.md next to the saved model; pushing needs the network.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from transformers import TrainerCallback, TrainerControl
from transformers.trainer_utils import TrainOutput as _TrainOutput

from rloo.rewards.trl_names import TrainerStateView

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


def take_rows(dataset: Any, name: str, needed: int | None) -> Any:
    """A `datasets.Dataset` as is; an IterableDataset (no length) read up to `needed` rows into one."""
    if hasattr(dataset, "__len__") and hasattr(dataset, "column_names") and dataset.column_names is not None:
        return dataset
    from datasets import Dataset

    if isinstance(dataset, (list, tuple)) and dataset and all(isinstance(row, dict) for row in dataset):
        logger.warning("%s is a list of %d rows, not a datasets.Dataset; it is converted with "
                       "Dataset.from_list (pass a Dataset to silence this).", name, len(dataset))
        return Dataset.from_list(list(dataset))

    if needed is None:
        raise ValueError(f"{name} is an IterableDataset, which has no length: set max_steps in RLOOConfig so that "
                         f"rloo knows how many prompts to read from it.")
    rows = list(itertools.islice(iter(dataset), needed))
    if len(rows) < needed:
        raise ValueError(f"{name} holds {len(rows)} rows, fewer than the {needed} that max_steps needs.")
    return Dataset.from_list(rows)


def is_streamed(dataset: Any) -> bool:
    """A `datasets.IterableDataset` (or a plain iterable of rows with no length)."""
    return dataset is not None and not isinstance(dataset, dict) and not hasattr(dataset, "__len__")


def settle_streamed_train_options(args: Any, train_dataset: Any) -> None:
    """TRL's rules for a streamed train set, kept so that its scripts read the same settings.

    rloo reads a streamed set once, in every process, up to the rows max_steps needs (`take_rows`), which
    is what `dispatch_batches=False` means: an unset value reads False, True is refused as TRL refuses it.
    `dataloader_num_workers` is set to 0, with a warning, as TRL sets it (workers would split a stream's
    groups); it only sizes the loader `get_train_dataloader()` returns, the loop starts no workers."""
    if not is_streamed(train_dataset):
        return
    accelerator_config = getattr(args, "accelerator_config", None)
    if accelerator_config is not None:
        if accelerator_config.dispatch_batches:
            raise ValueError("Iterable datasets require `dispatch_batches=False`: a streamed train_dataset is read "
                             "by every process. Remove `dispatch_batches` from accelerator_config or set it to False.")
        accelerator_config.dispatch_batches = False
    workers = getattr(args, "dataloader_num_workers", 0)
    if workers:
        logger.warning("dataloader_num_workers=%d is set to 0 for a streamed train_dataset, as TRL does (workers "
                       "would split its groups; rloo's loop starts no workers in any case).", workers)
        args.dataloader_num_workers = 0


class ScheduleOrder:
    """The dataset indices one process trains on, rollout after rollout, computed as they are read."""

    def __init__(self, rows_of: Callable[[int], list[int]], num_rollouts: int, rows_per_rollout: int) -> None:
        self.rows_of, self.num_rollouts, self.rows_per_rollout = rows_of, num_rollouts, rows_per_rollout

    def __iter__(self) -> Iterator[int]:
        for rollout in range(self.num_rollouts):
            yield from self.rows_of(rollout)

    def __len__(self) -> int:
        return self.num_rollouts * self.rows_per_rollout


def prompt_loader(rows: Any, order: Iterable[int] | None, batch_size: int, num_workers: int) -> Any:
    """A torch DataLoader over dataset rows (dicts; a batch is a list of them), in `order` when given."""
    from torch.utils.data import DataLoader

    return DataLoader(rows, batch_size=batch_size, sampler=order, num_workers=num_workers, collate_fn=list)


def trl_logs(prompts: Sequence[Any], completions: Sequence[str], reward_names: Sequence[str], reward_columns: Any,
             advantages: Sequence[float], extra: dict[str, Sequence[Any]] | None) -> dict[str, Any]:
    """TRL's `trainer._logs` buffer for the last logged rollout of this process: prompt, completion,
    rewards per function (NaN where a function did not apply), advantages and `log_extra` columns."""
    columns = reward_columns.tolist()
    return {"prompt": list(prompts), "completion": list(completions),
            "rewards": {name: [row[i] for row in columns] for i, name in enumerate(reward_names)},
            "advantages": list(advantages), "extra": {k: list(v) for k, v in (extra or {}).items()}}


def named_eval_sets(eval_dataset: Any) -> list[tuple[str | None, Any]]:
    """[(name, Dataset)] of an eval set: a Dataset, an IterableDataset (read to its end: eval sets are
    finite), or a dict of them (DatasetDict and IterableDatasetDict included), each named by its key."""
    named = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    out = []
    for name, dataset in named:
        if not (hasattr(dataset, "__len__") and getattr(dataset, "column_names", None) is not None):
            from datasets import Dataset

            dataset = Dataset.from_list(list(dataset))
        out.append((name, dataset))
    return out


def write_model_card(output_dir: str | Path, args: Any, model_name: str | None, dataset_name: str | None = None,
                     tags: Sequence[str] = ()) -> Path:
    """README.md in `output_dir`: Hub metadata, how the model was trained, and how to cite RLOO."""
    import rloo

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
        f"[rloo](https://pypi.org/project/rloo/) {rloo.__version__}"
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
                                   commit_message=commit_message)
    except Exception as error:  # noqa: BLE001 - any network or auth failure gets the same advice
        raise RuntimeError(f"push_to_hub to {repo_id} failed ({type(error).__name__}: {error}). "
                           f"Pushing needs network access to the Hub and a token (`hf auth login`). {where}") from error
    return str(getattr(commit, "commit_url", commit))
