"""Refusing launches that would silently run N unconnected copies of one training run.

A launcher (torchrun, `accelerate launch` with a MULTI_GPU config) starts N processes and tells
each, through WORLD_SIZE / LOCAL_RANK, that it is one of N. On CPU, accelerate joins them into one
world only when told to use the CPU (`cpu=True`, ACCELERATE_USE_CPU=1); otherwise every process
sets up a world of one and trains alone, and all N write metrics and checkpoints into the same
output_dir. `check_launch` compares what the environment says with what accelerate set up.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

logger = logging.getLogger(__name__)

CPU_FIX = (
    "On CPU, set use_cpu=True (CLI: --use_cpu) or ACCELERATE_USE_CPU=1, e.g.\n"
    "  ACCELERATE_USE_CPU=1 torchrun --nproc_per_node {n} -m rloo.cli ...\n"
    "  accelerate launch --config_file examples/accelerate_configs/multi_cpu.yaml -m rloo.cli ... --use_cpu\n"
    "On GPUs, check that each process sees a GPU (CUDA_VISIBLE_DEVICES). See docs/launching.md."
)


class LaunchError(RuntimeError):
    """The launch would run duplicate, unconnected copies of the run."""


def launched_world_size(env: Mapping[str, str]) -> int:
    """Processes the launcher says it started: WORLD_SIZE (torchrun, accelerate), else 1."""
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return 1


def check_launch(num_processes: int, env: Mapping[str, str] | None = None) -> None:
    """Raise `LaunchError` when the launcher started more processes than accelerate connected.

    Args:
        num_processes: the world size accelerate set up (`Accelerator.num_processes`).
        env: the process environment (os.environ by default).
    """
    env = os.environ if env is None else env
    launched = launched_world_size(env)
    if launched > num_processes:
        raise LaunchError(
            f"The launcher started {launched} processes (WORLD_SIZE={launched}, LOCAL_RANK="
            f"{env.get('LOCAL_RANK', '?')}) but accelerate connected {num_processes}: {launched} unconnected "
            f"copies of this run would train side by side and write into the same output_dir.\n"
            + CPU_FIX.format(n=launched)
        )
    if num_processes == 1 and launched == 1 and env.get("MASTER_ADDR") and "ACCELERATE_MIXED_PRECISION" in env \
            and "LOCAL_RANK" not in env:
        # accelerate's simple launcher (used for --cpu) sets MASTER_ADDR only when asked for more
        # than one process, yet starts one. One process is not a duplicate, so warn, not refuse.
        logger.warning("accelerate launch was asked for several processes but started one (it does so with "
                       "--cpu). To run N CPU processes:\n%s", CPU_FIX.format(n="N"))
