"""A process's CPU generators (torch, random, numpy) as a value: async_rollouts' sampler process hands its own to
the learner after each rollout, so that a checkpoint holds them and a resumed run's sampler goes on from them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def random_state() -> dict[str, Any]:
    """This process's CPU generators, in types torch.load(weights_only=True) reads back."""
    name, keys, position, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "random": random.getstate(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss]}


def set_random_state(state: dict[str, Any]) -> None:
    """The generators as `random_state` returned them."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["random"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
