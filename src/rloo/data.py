"""Prompt batches in a deterministic, resumable order.

The order of rollout r is a pure function of (seed, r): epoch e = r // batches_per_epoch is a
seeded permutation of the dataset, so resuming from a checkpoint needs only the rollout index,
and every process derives the same global batch and takes its own contiguous slice of whole
prompts (a prompt's group never straddles two processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PromptSchedule:
    """Which dataset rows each rollout uses, for each process."""

    num_rows: int
    prompts_per_process: int
    num_processes: int
    seed: int
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the training dataset has {self.num_rows} prompts, but one rollout needs "
                f"{self.prompts_per_global_step} ({self.prompts_per_process} prompts per process x "
                f"{self.num_processes} processes). Use a larger dataset, or a smaller per_device_train_batch_size "
                f"* gradient_accumulation_steps * num_mini_batches / num_generations."
            )

    @property
    def prompts_per_global_step(self) -> int:
        return self.prompts_per_process * self.num_processes

    @property
    def batches_per_epoch(self) -> int:
        # An incomplete last batch is dropped, so every group is complete and every step equal.
        return self.num_rows // self.prompts_per_global_step

    def rows(self, rollout: int, process_index: int) -> list[int]:
        """Dataset row indices that `process_index` uses in rollout number `rollout`."""
        epoch, position = divmod(rollout, self.batches_per_epoch)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_rows, generator=generator)
        else:
            order = torch.arange(self.num_rows)
        start = position * self.prompts_per_global_step + process_index * self.prompts_per_process
        return order[start : start + self.prompts_per_process].tolist()


def select_rows(dataset: Any, indices: list[int]) -> list[dict[str, Any]]:
    """Rows of a `datasets.Dataset` (or any indexable of dicts) as a list of dicts."""
    return [dataset[int(i)] for i in indices]


_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_prompt_dataset(name: str, split: str = "train", config: str | None = None) -> Any:
    """Load a dataset from a local file (json, jsonl, csv, parquet), a local directory (written by
    `save_to_disk` or holding data files), or, for users with the network, a Hub name."""
    import datasets
    from pathlib import Path

    path = Path(name).expanduser()
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(_FILE_BUILDERS)}.")
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ValueError(f"{path} has splits {list(loaded)}, not {split!r}; pass --dataset_split.")
                loaded = loaded[split]
            return loaded
        return datasets.load_dataset(str(path), config, split=split)
    if name.startswith((".", "/", "~")) or name.endswith(tuple(_FILE_BUILDERS)):
        raise FileNotFoundError(f"dataset {name!r} does not exist locally.")
    return datasets.load_dataset(name, config, split=split)
