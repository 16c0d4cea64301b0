"""Checkpoints: save atomically, find the newest complete one, load, rotate.

A checkpoint `output_dir/checkpoint-<step>/` holds the policy ONCE, as `save_pretrained` files (so it
loads with `from_pretrained`; under LoRA only the adapters; the frozen reference never), accelerate's
saved state WITHOUT model weights (optimizer, scheduler, RNG) under `accelerate_state/`, and
`trainer_state.json` with the loop's counters, the run's id and a manifest (size and sha256 of every
file). Checkpoints fall between rollouts, so the state is the step, the rollout index and the episode count (and
with async_rollouts `async_sampler.pt`, what the sampler samples the next rollout with: `AsyncRollouts.state`).
Sharded (FSDP2, ZeRO-3), the save_pretrained files hold the full weights gathered from the shards,
and accelerate's state also holds the sharded weights, which resuming restores (docs/launching.md).
With save_only_model (TRL's name) there is no `accelerate_state/`: the checkpoint is the model alone,
marked `"model_only": true`, and resuming from it is refused by name rather than restarting the
optimizer, the schedule and the RNG silently (transformers resumes from one with a fresh optimizer).

Atomicity: everything is written into `output_dir/.checkpoint-<step>.tmp/`, flushed and fsynced,
`trainer_state.json` last, then the directory is renamed to `checkpoint-<step>`. A kill at any
moment leaves either a complete checkpoint or a hidden temporary directory that is never read and
is deleted by the next save. A `checkpoint-<n>` directory is complete when its trainer_state.json
parses and names step n; resuming also checks the manifest, so a damaged file fails loudly.

Exact resume means exact: a file that is missing, damaged or unreadable, the random states
included (accelerate would skip those with a log line), is a CheckpointError naming the file, with
the fix: resume from the previous complete checkpoint, named when there is one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from rloo.config import ConfigError, RLOOConfig
from rloo.distributed.sharding import any_process, full_state_dict, local_tensor, sharding_of
from rloo.model_loading import saved_names
from rloo.run.random_states import random_state_problem
from rloo.run.storage import CheckpointError, write_errors_named

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
ACCELERATE_STATE = "accelerate_state"
ROLLOUT_STATE = "async_sampler.pt"  # async_rollouts: the weights and random state of the queued rollout's sampler
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
TEMPORARY_NAME = re.compile(r"^\.checkpoint-(\d+)\.tmp$")
# Held in the optimizer's and scheduler's saved state: a different value on resume would be
# silently replaced by the saved one, so resuming with a change is refused instead.
OPTIMIZER_FIELDS = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                    "lr_scheduler_type", "warmup_ratio", "warmup_steps", "optim")
# What the run computes: a different value on resume would change the algorithm mid-run.
ALGORITHM_FIELDS = ("num_generations", "advantage_estimator")
# The run's length: a different value on resume rebuilds the learning-rate schedule (warned).
LENGTH_FIELDS = ("max_steps", "total_episodes", "num_train_epochs")


# ------------------------------------------------------------------ saving


def save_model(accelerator: Accelerator, model: torch.nn.Module, tokenizer: Any, args: RLOOConfig,
               output_dir: str) -> None:
    """Save the policy (or its adapters under LoRA), the tokenizer (a VLM's processor) and the config;
    from a sharded run (FSDP2, ZeRO-3) the full weights, gathered on the main process. A write failure
    is a CheckpointError naming the folder."""
    accelerator.wait_for_everyone()
    state_dict = full_state_dict(accelerator, model)  # every process: a collective under sharding
    if accelerator.is_main_process:
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            accelerator.unwrap_model(model).save_pretrained(output_dir, state_dict=state_dict)
            tokenizer.save_pretrained(output_dir)
            (Path(output_dir) / "rloo_config.json").write_text(json.dumps(args.to_dict(), indent=2, default=str))
        except OSError as error:
            raise CheckpointError(f"could not write the model into {str(output_dir)!r}: {error}. Free disk space or "
                                  f"fix the folder's permissions (or choose another output_dir).") from error
    accelerator.wait_for_everyone()


def _skip_model_weights(models: list, weights: list, output_dir: str) -> None:
    """accelerate save-state hook: the weights are already in the save_pretrained files."""
    weights.clear()


def _skip_model_loading(models: list, input_dir: str) -> None:
    """accelerate load-state hook: `models` is a local list; the weights come from save_pretrained files."""
    models.clear()


def check_finite_weights(model: torch.nn.Module, step: int, accelerator: Accelerator | None = None) -> None:
    """Refuse to save non-finite weights: a checkpoint must be a state worth resuming from. Sharded,
    each process checks its own shards and all of them refuse together (given the accelerator)."""
    bad = next((name for name, param in model.named_parameters() if not torch.isfinite(local_tensor(param)).all()),
               None)
    if accelerator is not None and sharding_of(model) is not None and any_process(accelerator, bad is not None):
        bad = bad or "(a shard held by another process)"
    if bad is not None:
        raise CheckpointError(f"parameter {bad} holds NaN or inf at step {step}; no checkpoint was written. "
                              f"Lower learning_rate or max_grad_norm, or check the rewards.")


def save_checkpoint(accelerator: Accelerator, model: torch.nn.Module, tokenizer: Any, args: RLOOConfig,
                    global_step: int, rollout_index: int, episode: int, run_id: str = "",
                    rollout_state: dict[str, Any] | None = None) -> Path:
    """Write `checkpoint-<global_step>` atomically and rotate this run's old checkpoints; returns its path.
    `rollout_state` (async_rollouts' sampler) goes to ROLLOUT_STATE. A write failure (a full disk, a folder made
    read-only) is a CheckpointError naming output_dir."""
    check_finite_weights(accelerator.unwrap_model(model), global_step, accelerator)
    with write_errors_named(args.output_dir, global_step):
        return _save_checkpoint(accelerator, model, tokenizer, args, global_step, rollout_index, episode, run_id, rollout_state)


def _save_checkpoint(accelerator: Accelerator, model: torch.nn.Module, tokenizer: Any, args: RLOOConfig,
                     global_step: int, rollout_index: int, episode: int, run_id: str, rollout_state: dict | None) -> Path:
    output_dir = Path(args.output_dir)
    final = output_dir / f"checkpoint-{global_step}"
    temporary = output_dir / f".checkpoint-{global_step}.tmp"
    if accelerator.is_main_process and temporary.exists():
        shutil.rmtree(temporary)  # left by a run killed while saving
    save_model(accelerator, model, tokenizer, args, str(temporary))
    if not args.save_only_model:
        handle = accelerator.register_save_state_pre_hook(_skip_model_weights)
        try:
            accelerator.save_state(str(temporary / ACCELERATE_STATE))
        finally:
            handle.remove()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if rollout_state is not None and not args.save_only_model:  # a model-only checkpoint is never resumed
            torch.save(rollout_state, temporary / ROLLOUT_STATE)
        state = {
            "global_step": global_step,
            "rollout_index": rollout_index,
            "episode": episode,
            "run_id": run_id,
            "completions_per_step": args.completions_per_step,
            "num_mini_batches": args.num_mini_batches,
            "num_processes": accelerator.num_processes,
            "model_only": bool(args.save_only_model),
            "manifest": _manifest(temporary),
        }
        _write_synced(temporary / TRAINER_STATE, json.dumps(state, indent=2))
        _fsync_tree(temporary)
        if final.exists():  # an earlier attempt at the same step (resumed from an older checkpoint)
            shutil.rmtree(final)
        os.replace(temporary, final)
        _fsync_directory(output_dir)
        rotate_checkpoints(output_dir, args.save_total_limit, run_id)
    accelerator.wait_for_everyone()
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest(directory: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under directory."""
    return {str(p.relative_to(directory)): [p.stat().st_size, _sha256(p)]
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    for path in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
        _fsync_directory(path)


# ------------------------------------------------------------------ finding and rotating


def read_state(path: Path) -> dict[str, Any] | None:
    """The trainer state of a complete checkpoint directory, or None when it is not one."""
    match = CHECKPOINT_NAME.match(path.name)
    try:
        state = json.loads((path / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return None
    if not match or not isinstance(state, dict) or state.get("global_step") != int(match.group(1)):
        return None
    return state


def complete_checkpoints(output_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """Complete `checkpoint-<n>` directories under output_dir, oldest first (numerically); with
    run_id, only that run's. Other folders (checkpoint-best, temporary ones) are never listed."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        state = read_state(path) if path.is_dir() else None
        if state is not None and (run_id is None or state.get("run_id") == run_id):
            found.append((state["global_step"], path))
    return [path for _, path in sorted(found)]


def incomplete_checkpoints(output_dir: str | Path) -> list[Path]:
    """`checkpoint-<n>` directories that are not complete, and temporary directories of interrupted saves."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and (
        TEMPORARY_NAME.match(p.name) or (CHECKPOINT_NAME.match(p.name) and read_state(p) is None)))


def rotate_checkpoints(output_dir: str | Path, limit: int | None, run_id: str | None = None) -> None:
    """Keep this run's newest `limit` complete checkpoints (all when None); nothing else is touched."""
    if limit is None:
        return
    for old in complete_checkpoints(output_dir, run_id)[:-limit]:
        shutil.rmtree(old)


def resolve_checkpoint(checkpoint: str | bool, output_dir: str) -> Path | None:
    """The checkpoint to resume from: a path, or for True / "latest" the newest complete one in
    output_dir (None, with a log line, when there is none: the run starts fresh)."""
    if checkpoint is True or checkpoint == "latest":
        for skipped in incomplete_checkpoints(output_dir):
            logger.warning("Skipping %s: an incomplete checkpoint (a save was interrupted).", skipped)
        found = complete_checkpoints(output_dir)
        if not found:
            logger.warning("resume_from_checkpoint=latest: %s has no complete checkpoint; starting a fresh run.",
                           output_dir)
            return None
        return found[-1]
    return Path(checkpoint)


# ------------------------------------------------------------------ loading


def load_checkpoint(accelerator: Accelerator, model: torch.nn.Module, path: Path, args: RLOOConfig) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG from a checkpoint directory after checking it is
    complete, undamaged and compatible; returns its trainer state (global_step, rollout_index, episode, rollout_state)."""
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint: {path} is not a directory. Give a checkpoint-<step> "
                              f"directory, or 'latest' for the newest complete one in output_dir.")
    state = read_state(path)
    if state is None:
        raise CheckpointError(f"{path} is not an rloo checkpoint: {TRAINER_STATE} is missing, unreadable or names "
                              f"another step (an interrupted save?). Resume from another checkpoint or 'latest'.")
    if state.get("model_only"):
        raise CheckpointError(
            f"{path} was saved with save_only_model=True: it holds the model's weights only, without the optimizer, "
            f"scheduler and RNG state a run resumes from. Start a new run from it as a model (model_name_or_path="
            f"{str(path)!r}, or from_pretrained), or resume from a checkpoint saved with save_only_model=False.")
    _verify_manifest(path, state)
    written = (state["completions_per_step"], state.get("num_mini_batches", 1), state["num_processes"])
    if written != (args.completions_per_step, args.num_mini_batches, accelerator.num_processes):
        raise CheckpointError(
            f"the checkpoint was written with {written[0]} completions per step, {written[1]} mini-batches "
            f"per rollout on {written[2]} processes, this run has {args.completions_per_step}, "
            f"{args.num_mini_batches} on {accelerator.num_processes}; resume with the same batch "
            f"sizes and process count."
        )
    _check_saved_config(path, args)
    if sharding_of(model) is None:  # sharded, accelerate restores the weights from its own sharded state below
        _load_weights(accelerator.unwrap_model(model), path)
    handle = accelerator.register_load_state_pre_hook(_skip_model_loading)
    try:
        accelerator.load_state(str(path / ACCELERATE_STATE))
    except Exception as error:  # a file the manifest does not list (a tampered or foreign checkpoint)
        named = getattr(error, "filename", None) or f"{path / ACCELERATE_STATE}"
        raise CheckpointError(f"checkpoint {path} could not be loaded: {named}: {type(error).__name__}: {error}. "
                              f"{resume_fix(path)}") from error
    finally:
        handle.remove()
    problem = random_state_problem(path, ACCELERATE_STATE, accelerator.process_index)
    if any_process(accelerator, problem is not None):  # every process raises together, none waits forever
        raise CheckpointError(f"checkpoint {path}: {problem or 'the random state of another process was not restored'}; "
                              f"resuming would not be exact. {resume_fix(path)}")
    logger.info("Resumed from %s at step %d.", path, state["global_step"])
    rollout_file = path / ROLLOUT_STATE  # checked by the manifest above
    return {**state, "rollout_state": torch.load(rollout_file, weights_only=True) if rollout_file.is_file() else None}


def previous_checkpoint(path: Path) -> Path | None:
    """The newest complete checkpoint of the same folder before `path`'s step (None when there is none)."""
    match = CHECKPOINT_NAME.match(path.name)
    step = int(match.group(1)) if match else None
    earlier = [p for p in complete_checkpoints(path.parent)
               if step is None or int(CHECKPOINT_NAME.match(p.name).group(1)) < step]
    return earlier[-1] if earlier else None


def resume_fix(path: Path) -> str:
    """What to do about a checkpoint that cannot be resumed exactly: the previous complete one, by name."""
    previous = previous_checkpoint(path)
    if previous is None:
        return (f"{path.parent} holds no earlier complete checkpoint: start a new run (another output_dir, or "
                f"overwrite_output_dir=True).")
    return (f"Resume from the previous complete checkpoint: --resume_from_checkpoint {previous} "
            f"(trainer.train(resume_from_checkpoint={str(previous)!r})).")


def _verify_manifest(path: Path, state: dict[str, Any]) -> None:
    manifest = state.get("manifest")
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}/{TRAINER_STATE} has no file manifest; it was not written by this version.")
    for name, (size, digest) in manifest.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is damaged: {name} is missing. {resume_fix(path)}")
        if file.stat().st_size != size or _sha256(file) != digest:
            raise CheckpointError(f"checkpoint {path} is damaged: {name} differs from what was saved. "
                                  f"{resume_fix(path)}")


def _check_saved_config(path: Path, args: RLOOConfig) -> None:
    """Refuse a resume that changes the optimizer's settings or the algorithm; warn when the run's length
    changes (the learning-rate schedule is then rebuilt for the new length)."""
    saved = json.loads((path / "rloo_config.json").read_text())

    def changed(names: tuple[str, ...]) -> list[str]:
        return [f"{name}: {saved[name]!r} -> {getattr(args, name)!r}" for name in names
                if name in saved and saved[name] != getattr(args, name)]

    if changed(OPTIMIZER_FIELDS):
        raise ConfigError(f"resuming from {path} with a changed optimizer setting ({'; '.join(changed(OPTIMIZER_FIELDS))}): "
                          f"the saved optimizer and scheduler state would override it. Resume with the saved values, "
                          f"or start a new run from {path} as a model (model_name_or_path) with the new ones.")
    if changed(ALGORITHM_FIELDS):
        raise ConfigError(f"resuming from {path} with a changed algorithm ({'; '.join(changed(ALGORITHM_FIELDS))}): "
                          f"the run would switch what it computes mid-way. Resume with the saved values, or start a "
                          f"new run from {path} as a model (model_name_or_path) with the new ones.")
    if changed(LENGTH_FIELDS):
        logger.warning("resuming from %s with a changed run length (%s): the learning-rate schedule is rebuilt for "
                       "the new length.", path, "; ".join(changed(LENGTH_FIELDS)))


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load the save_pretrained files of a checkpoint into the (unwrapped) policy, exactly."""
    from safetensors.torch import load_file

    if (path / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict

        try:
            adapters = load_file(str(path / "adapter_model.safetensors"))
        except Exception as error:  # safetensors' own error type
            raise CheckpointError(f"checkpoint {path}: adapter_model.safetensors is unreadable ({type(error).__name__}: "
                                  f"{error}). {resume_fix(path)}") from error
        result = set_peft_model_state_dict(model, adapters)
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(f"{path}: adapter weights do not match this model: {result.unexpected_keys[:3]}.")
        return
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no model weights (model*.safetensors or adapter_model.safetensors).")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(str(file)))
        except Exception as error:  # safetensors' own error type: a damaged file the manifest did not catch
            raise CheckpointError(f"checkpoint {path}: {file.name} is unreadable ({type(error).__name__}: {error}). "
                                  f"{resume_fix(path)}") from error
    own = model.state_dict()
    if not set(weights) <= set(own):  # save_pretrained wrote the family's original names (LLaVA, Qwen2-VL, Gemma 3 ...)
        names = saved_names(model, own)
        weights = {names.get(name, name): tensor for name, tensor in weights.items()}
    different = [f"{name}: saved {tuple(tensor.shape)}, model {tuple(own[name].shape)}"
                 for name, tensor in weights.items() if name in own and own[name].shape != tensor.shape]
    if different:
        raise CheckpointError(f"{path}: the saved weights have other shapes than this model ({len(different)} tensors, "
                              f"e.g. {different[0]}); it was written by a model of another size. Resume with the model "
                              f"the run started from, or another checkpoint.")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    loaded = {p.data_ptr() for n, p in model.state_dict().items() if n in weights}
    untied = [n for n in missing if model.state_dict()[n].data_ptr() not in loaded]
    if unexpected or untied:
        raise CheckpointError(f"{path}: the saved weights do not match this model (missing {untied[:3]}, "
                              f"unexpected {unexpected[:3]}). Resume with the model the run started from.")
