"""A train or eval set as the rows the trainer reads, and the DataLoaders the Trainer API hands out.

* `train_rows`: a `datasets.Dataset` as is; an `IterableDataset` (no length) or a list of rows read into the
  finite Dataset a run of `max_steps` reads (`take_rows`), after TRL's two DataLoader rules for a streamed
  train set (`settle_streamed_train_options`); an environment that owns the data gets placeholder prompts.
* `named_eval_sets`: an eval set, or a dict of them, as [(name, Dataset)]; `check_prompts` checks each set's prompts.
* `ScheduleOrder` and `prompt_loader`: what `get_train_dataloader()` / `get_eval_dataloader()` return.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterable, Iterator

from rloo.data.prompts import check_prompt_dataset, check_prompt_lengths

logger = logging.getLogger(__name__)

# The prompt of a row whose environment owns the data: `reset` returns the real prompt and never receives this one.
PLACEHOLDER_PROMPT = [{"role": "user", "content": ""}]


def train_rows(args: Any, train_dataset: Any, num_processes: int, environment_factory: Any = None) -> Any:
    """The train set as rows the schedule indexes: a streamed set is read once, up to the rows max_steps
    needs (after TRL's rules for its DataLoader options); a Dataset as is. With an environment_factory the
    environment may own the data (its reset returns the prompt): rows without a prompt get an empty one."""
    if environment_factory is not None and (train_dataset is None or "prompt" not in (getattr(train_dataset, "column_names",
                                                                                              None) or ["prompt"])):
        return environment_owned_rows(args, train_dataset, num_processes, environment_factory)
    settle_streamed_train_options(args, train_dataset)
    needed = None if args.max_steps < 0 else (-(-args.max_steps // args.steps_per_rollout) * args.prompts_per_rollout
                                              * num_processes)
    return take_rows(train_dataset, "train_dataset", needed)


def check_prompts(args: Any, tokenizer: Any, train_dataset: Any, eval_dataset: Any) -> None:
    """Every dataset has usable prompts of an acceptable length (eval_dataset may be a dict of them)."""
    eval_sets = named_eval_sets(eval_dataset) if eval_dataset is not None else []
    for dataset, name in ((train_dataset, "train_dataset"),
                          *((d, f"eval_dataset[{k!r}]" if k else "eval_dataset") for k, d in eval_sets)):
        if dataset is not None:
            check_prompt_dataset(dataset, name)
            check_prompt_lengths(dataset, name, tokenizer, args.max_prompt_length, args.truncate_prompts,
                                 args.chat_template_kwargs)


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
    options = args.accelerator_config  # None, a mapping, or transformers' AcceleratorConfig (TRL's form)
    dispatch = options.get("dispatch_batches") if isinstance(options, dict) else getattr(options, "dispatch_batches", None)
    if dispatch:
        raise ValueError("Iterable datasets require `dispatch_batches=False`: a streamed train_dataset is read "
                         "by every process. Remove `dispatch_batches` from accelerator_config or set it to False.")
    if isinstance(options, dict):
        options["dispatch_batches"] = False
    elif options is not None:  # TRL sets it on the object
        options.dispatch_batches = False
    workers = args.dataloader_num_workers
    if workers:
        logger.warning("dataloader_num_workers=%d is set to 0 for a streamed train_dataset, as TRL does (workers "
                       "would split its groups; rloo's loop starts no workers in any case).", workers)
        args.dataloader_num_workers = 0


def environment_owned_rows(args: Any, train_dataset: Any, num_processes: int, environment_factory: Any) -> Any:
    """TRL's environment-owned data: without a train_dataset, one rollout's worth of placeholder rows (the run's
    length is max_steps); a dataset without a 'prompt' column (e.g. only `environment`) gets the placeholder
    prompt, which `reset` does not receive (PLACEHOLDER_PROMPT)."""
    from datasets import Dataset

    if train_dataset is None:
        if isinstance(environment_factory, dict):
            raise ValueError("A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
                             "`environment` column to route each example to its environment. Provide a dataset, or "
                             "pass a single environment factory.")
        if args.max_steps <= 0:
            raise ValueError("When training without a `train_dataset` (the environment owns the data and returns the "
                             "prompt from `reset()`), `max_steps` must be set to a positive value to define the training "
                             "length. Set it via `RLOOConfig(max_steps=...)`.")
        return Dataset.from_list([{"prompt": PLACEHOLDER_PROMPT}] * (args.prompts_per_rollout * num_processes))
    rows = take_rows(train_dataset, "train_dataset", None)
    return rows.add_column("prompt", [PLACEHOLDER_PROMPT] * len(rows))


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
