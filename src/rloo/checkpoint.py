"""Checkpoints: save, find, load and rotate.

A checkpoint `output_dir/checkpoint-<step>/` holds the policy as `save_pretrained` files (so it
loads with `from_pretrained`), accelerate's saved state (optimizer, scheduler, RNG) under
`accelerate_state/`, and `trainer_state.json` with the loop's counters. Checkpoints fall between
rollouts, so the state is the step, the rollout index and the episode count.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from .config import RLOOConfig

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
ACCELERATE_STATE = "accelerate_state"


def save_model(accelerator: Accelerator, model: torch.nn.Module, tokenizer: Any, args: RLOOConfig,
               output_dir: str) -> None:
    """Save the policy (or its adapters under LoRA), the tokenizer and the config with save_pretrained."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        accelerator.unwrap_model(model).save_pretrained(output_dir, state_dict=accelerator.get_state_dict(model))
        tokenizer.save_pretrained(output_dir)
        (Path(output_dir) / "rloo_config.json").write_text(json.dumps(args.to_dict(), indent=2))
    accelerator.wait_for_everyone()


def save_checkpoint(accelerator: Accelerator, model: torch.nn.Module, tokenizer: Any, args: RLOOConfig,
                    global_step: int, rollout_index: int, episode: int) -> Path:
    """Write `checkpoint-<global_step>` and rotate old checkpoints; returns its path."""
    checkpoint = Path(args.output_dir) / f"checkpoint-{global_step}"
    save_model(accelerator, model, tokenizer, args, str(checkpoint))
    accelerator.save_state(str(checkpoint / ACCELERATE_STATE))
    if accelerator.is_main_process:
        state = {
            "global_step": global_step,
            "rollout_index": rollout_index,
            "episode": episode,
            "completions_per_step": args.completions_per_step,
            "num_mini_batches": args.num_mini_batches,
            "num_processes": accelerator.num_processes,
        }
        (checkpoint / TRAINER_STATE).write_text(json.dumps(state, indent=2))
        rotate_checkpoints(args.output_dir, args.save_total_limit)
    accelerator.wait_for_everyone()
    return checkpoint


def _checkpoints(output_dir: str | Path) -> list[Path]:
    """`checkpoint-<n>` directories under output_dir, oldest first."""
    return sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))


def rotate_checkpoints(output_dir: str | Path, limit: int | None) -> None:
    """Keep the newest `limit` checkpoints (all when None)."""
    if limit is None:
        return
    for old in _checkpoints(output_dir)[:-limit]:
        shutil.rmtree(old)


def load_checkpoint(accelerator: Accelerator, checkpoint: str | bool, args: RLOOConfig) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG from a checkpoint (True: the newest in output_dir);
    returns its trainer state (global_step, rollout_index, episode)."""
    if checkpoint is True:
        found = _checkpoints(args.output_dir)
        if not found:
            raise FileNotFoundError(f"resume_from_checkpoint=True, but {args.output_dir} has no checkpoint-* directory.")
        checkpoint = found[-1]
    path = Path(checkpoint)
    state_file = path / TRAINER_STATE
    if not state_file.exists():
        raise FileNotFoundError(f"{path} is not an rloo checkpoint: {TRAINER_STATE} is missing.")
    state = json.loads(state_file.read_text())
    written = (state["completions_per_step"], state.get("num_mini_batches", 1), state["num_processes"])
    if written != (args.completions_per_step, args.num_mini_batches, accelerator.num_processes):
        raise ValueError(
            f"the checkpoint was written with {written[0]} completions per step, {written[1]} mini-batches "
            f"per rollout on {written[2]} processes, this run has {args.completions_per_step}, "
            f"{args.num_mini_batches} on {accelerator.num_processes}; resume with the same batch "
            f"sizes and process count."
        )
    accelerator.load_state(str(path / ACCELERATE_STATE))
    logger.info("Resumed from %s at step %d.", path, state["global_step"])
    return state
