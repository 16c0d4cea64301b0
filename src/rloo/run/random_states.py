"""Whether a checkpoint's random states were restored: accelerate's `load_state` skips a missing or
unreadable `random_states_<i>.pkl` with a log line, which would make a resume silently inexact; so
the file is read again and compared with the generators' states after the load (`checkpoint`)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import RNG_STATE_NAME
from accelerate.utils import load as accelerate_load


def random_state_problem(path: Path, state_folder: str, process_index: int) -> str | None:
    """Why this process's random state in the checkpoint was not restored, or None when it was:
    accelerate skips a missing or unreadable random_states file with a log line, so the file is read
    again here and compared with the generators' states after the load."""
    file = path / state_folder / f"{RNG_STATE_NAME}_{process_index}.pkl"
    if not file.is_file():
        return f"{file.relative_to(path)} is missing (the random state of process {process_index})"
    try:
        states = accelerate_load(file)
        restored = (random.getstate() == states["random_state"]
                    and torch.equal(torch.get_rng_state(), states["torch_manual_seed"])
                    and _same_numpy_state(np.random.get_state(), states["numpy_random_seed"]))
        if "torch_cuda_manual_seed" in states and torch.cuda.is_available():
            restored = restored and all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(),
                                                                          states["torch_cuda_manual_seed"]))
    except Exception as error:  # any unpickling, type or key error: the file is not a random state
        return f"{file.relative_to(path)} is unreadable ({type(error).__name__}: {error})"
    return None if restored else f"the random state in {file.relative_to(path)} was not restored"


def _same_numpy_state(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))
