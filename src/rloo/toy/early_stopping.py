"""Early stopping of the warm start on greedy exact-match accuracy, read off the training logits.

Each step's teacher-forced logits already say whether greedy decoding would reproduce each row's
answer (`sequence_exact_match`), so the accuracy of the latest training rows costs nothing to track.
"""

from __future__ import annotations

from collections import deque

import torch

# Training rows (4 batches of 64) over which the early-stopping accuracy is averaged.
TARGET_WINDOW = 256


class AccuracyTarget:
    """Early stopping on the greedy exact-match accuracy of the latest `TARGET_WINDOW` training rows."""

    def __init__(self, target: float) -> None:
        self.target = target
        self.recent: deque[bool] = deque(maxlen=TARGET_WINDOW)

    def reached(self, logits: torch.Tensor, labels: torch.Tensor) -> bool:
        """Add a batch's rows; True once the window is full and its accuracy reaches the target."""
        self.recent.extend(sequence_exact_match(logits, labels).tolist())
        return len(self.recent) == self.recent.maxlen and self.accuracy() >= self.target

    def accuracy(self) -> float:
        return sum(self.recent) / max(len(self.recent), 1)


def sequence_exact_match(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) bool: every labelled token is the argmax of the logits one position before it.

    For teacher-forced rows of prompt + answer + eos this is greedy exact-match accuracy without
    a decode loop: greedy decoding emits answer + eos exactly when each of those tokens is the
    argmax given the ones before it.

    Args:
        logits: (B, T, V) logits of the rows.
        labels: (B, T) target ids, -100 where there is no target.
    """
    predicted, targets = logits[:, :-1].argmax(dim=-1), labels[:, 1:]  # position t predicts t + 1
    return ((predicted == targets) | (targets == -100)).all(dim=1)
