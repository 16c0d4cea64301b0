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
