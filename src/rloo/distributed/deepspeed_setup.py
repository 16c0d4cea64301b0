"""What accelerate needs to run DeepSpeed under rloo's loop: a process-group backend where there is no
GPU, and the DeepSpeed config values accelerate would otherwise take from a dataloader rloo does not have.

accelerate reads the micro-batch size from a prepared dataloader; rloo prepares none, so with a config
that leaves `train_micro_batch_size_per_gpu` at "auto" (the shipped ones do) `prepare` would fail, and an
"auto" `gradient_clipping` would become accelerate's 1.0 whatever `max_grad_norm` says. Both "auto"
values are filled from RLOOConfig; a value the user wrote stays, and one that disagrees is refused.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rloo.config import ConfigError, RLOOConfig


def uses_deepspeed(env: Any = None) -> bool:
    """The launcher asked accelerate for DeepSpeed (`accelerate launch` with a DEEPSPEED config)."""
    env = os.environ if env is None else env
    return env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def process_group_kwargs(args: RLOOConfig) -> list:
    """accelerate's `kwargs_handlers` for DeepSpeed on CPU processes: none elsewhere.

    Without a GPU accelerate picks no backend, lets DeepSpeed connect the processes (gloo), and then
    counts every process as process 0 of 1: N copies of the run that all think they are the main one
    (rloo's launch check refuses that). Naming DeepSpeed's own CPU backend makes accelerate count the
    world DeepSpeed built. `use_cpu` would turn DeepSpeed off in accelerate without a word: refused."""
    if not uses_deepspeed():
        return []
    if args.use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        raise ConfigError("The launch asks for DeepSpeed, but use_cpu (or ACCELERATE_USE_CPU) makes accelerate drop "
                          "DeepSpeed and run plain DDP. Leave use_cpu off: on a machine without a GPU, DeepSpeed "
                          "runs on CPU processes by itself with DS_ACCELERATOR=cpu (docs/launching.md).")
    if torch.cuda.is_available():
        return []
    from accelerate.utils import InitProcessGroupKwargs
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":  # another accelerator (XPU, NPU): accelerate knows it
        return []
    return [InitProcessGroupKwargs(backend=get_accelerator().communication_backend_name())]


def fill_deepspeed_config(config: dict[str, Any], args: RLOOConfig) -> None:
    """Fill the DeepSpeed config's "auto" micro-batch size and clipping from `args`, in place."""
    wanted = {"train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
              "gradient_clipping": args.max_grad_norm}
    for key, value in wanted.items():
        if config.get(key, "auto") == "auto":
            config[key] = value
        elif float(config[key]) != float(value):
            field = "per_device_train_batch_size" if key.startswith("train_micro") else "max_grad_norm"
            raise ConfigError(f"The DeepSpeed config sets {key}={config[key]} but RLOOConfig has {field}={value}; "
                              f"set them equal, or leave {key} at \"auto\" in the DeepSpeed config.")
