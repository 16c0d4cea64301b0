"""Sharded training (FSDP2, DeepSpeed ZeRO-3): full weights for generation, a sharded reference,
and a full checkpoint.

Under FSDP2 (`torch.distributed.fsdp.fully_shard`) and ZeRO-3 each process holds a slice of every
weight, and a forward pass all-gathers each layer's weights and frees them after. That costs three
things the loop needs:

* **generation**: a decode step is one forward per token, and processes that stop at different
  lengths would wait on each other's all-gathers forever. `full_weights_for_generation` gathers
  every weight once for the whole of sampling (TRL's `ds3_gather_for_generation`, default True) and
  shards them again afterwards. With `ds3_gather_for_generation=False` (the full model does not fit
  on one device) the sharded model generates as it is, through Hugging Face `generate`, which keeps
  every process stepping until all are done (`synced_gpus`); config_checks requires sampler="generate" then.
* **the reference**: a separate reference model is sharded the same way as the policy
  (`prepare_reference`); under LoRA the reference is the sharded policy with its adapters disabled.
* **saving**: `full_state_dict` is a collective: every process takes part, the main one receives
  the full weights and writes them with `save_pretrained`, so the checkpoint loads with `from_pretrained`.

Without sharding (one process, DDP, ZeRO-1/2) every function here does what it did before: nothing,
`accelerator.prepare_model`, `accelerator.get_state_dict`.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType


def fsdp2_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules `fully_shard` was applied to, outermost first; empty when the model is not FSDP2-sharded."""
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def is_zero3_partitioned(model: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned the model's weights (its parameters carry a `ds_id`)."""
    return any(hasattr(param, "ds_id") for param in model.parameters())


def sharding_of(model: torch.nn.Module) -> str | None:
    """"fsdp2", "zero3", or None when every process holds full weights."""
    if fsdp2_units(model):
        return "fsdp2"
    if is_zero3_partitioned(model):
        return "zero3"
    return None


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this process holds: a DTensor's local shard, a ZeRO-3 partition, or itself."""
    if hasattr(param, "to_local"):
        return param.to_local()
    if hasattr(param, "ds_tensor"):
        return param.ds_tensor
    return param


def check_supported(accelerator: Accelerator) -> None:
    """Refuse FSDP1 (accelerate's `fsdp_version: 1`): its flattened parameters are handled nowhere here."""
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise ValueError("FSDP version 1 is not supported by rloo; set `fsdp_version: 2` in the accelerate config "
                         "(examples/accelerate_configs/fsdp2.yaml), or use DeepSpeed ZeRO-3.")


# ------------------------------------------------------------------ generation


@contextlib.contextmanager
def full_weights_for_generation(accelerator: Accelerator, model: torch.nn.Module,
                                gather: bool = True) -> Iterator[torch.nn.Module]:
    """Yield the unwrapped policy holding its full weights on every process, for the sampler.

    Sharded (FSDP2 or ZeRO-3) and `gather`: every weight is all-gathered once on entry and sharded
    again on exit, so the sampler's forwards run locally. Otherwise the unwrapped model as it is.
    """
    unwrapped = accelerator.unwrap_model(model)
    kind = sharding_of(model) if gather else None
    if kind == "fsdp2":
        with _fsdp2_unsharded(unwrapped):
            yield unwrapped
    elif kind == "zero3":
        with _zero3_gathered(model):
            yield unwrapped
    else:
        yield unwrapped


@contextlib.contextmanager
def _fsdp2_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """All-gather every FSDP2 unit of `model` and keep it unsharded until exit."""
    units = fsdp2_units(model)
    # The root decides at its first forward not to reshard after forward; do it now so that the
    # setting restored on exit is the one training uses.
    units[0]._get_fsdp_state()._lazy_init()
    # FSDP2 frees a unit's gathered weights after each of its forwards (reshard_after_forward);
    # during sampling they must stay. torch has a setter but no getter, so the per-group setting
    # (`post_forward_mesh_info`, None = keep unsharded) is saved and restored as it was. These are
    # torch 2.13 internals; tests/distributed/test_sharding.py fails if they change meaning.
    groups = [group for unit in units for group in unit._get_fsdp_state()._fsdp_param_groups]
    saved = [group.post_forward_mesh_info for group in groups]
    for unit in units:
        unit.unshard()
    for group in groups:
        group.post_forward_mesh_info = None
    try:
        yield
    finally:
        for group, info in zip(groups, saved):
            group.post_forward_mesh_info = info
        for unit in units:
            unit.reshard()


@contextlib.contextmanager
def _zero3_gathered(engine: Any) -> Iterator[None]:
    """ZeRO-3: gather every partitioned weight (`deepspeed.zero.GatheredParameters`) and lift the
    engine's per-module fetch/release hooks while sampling, so a forward neither re-gathers nor frees."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(engine.parameters())):
        coordinator = _zero3_parameter_coordinator(engine)
        _remove_zero3_hooks(coordinator)
        try:
            yield
        finally:
            coordinator._register_deepspeed_module(coordinator.module)  # the hooks back, as initialize set them


def _zero3_parameter_coordinator(engine: Any) -> Any:
    """The object holding ZeRO-3's forward hooks: the optimizer's `parameter_offload`, or the optimizer."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        raise RuntimeError("ZeRO-3 generation with gathered weights needs a DeepSpeed engine with its ZeRO "
                           "optimizer; this one has none. Set ds3_gather_for_generation=False.")
    return getattr(optimizer, "parameter_offload", optimizer)


def _remove_zero3_hooks(coordinator: Any) -> None:
    for param in coordinator.module.parameters(recurse=True):
        param.ds_active_sub_modules.clear()
    for hook in [*coordinator.forward_hooks, *coordinator.backward_hooks]:
        hook.remove()
    coordinator.forward_hooks, coordinator.backward_hooks = [], []


# ------------------------------------------------------------------ the reference model


def reference_in_compute_dtype(reference: torch.nn.Module | None, accelerator: Any) -> torch.nn.Module | None:
    """The frozen reference with its parameters in bf16 when the run is bf16 autocast on one CUDA device or plain
    data parallel (issue #46): it is only read, under autocast its products are bf16 anyway, and each no-grad pass
    then casts nothing (half the memory, no per-call casts). Buffers (rotary inv_freq) keep their type; FSDP2 and
    DeepSpeed shard the reference as they shard the policy, so it is left as it is there, and on CPU."""
    if (reference is None or accelerator.device.type != "cuda" or accelerator.mixed_precision != "bf16"
            or accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_GPU)):
        return reference
    for parameter in reference.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)
    return reference


def prepare_reference(accelerator: Accelerator, reference: torch.nn.Module) -> torch.nn.Module:
    """The frozen reference, sharded like the policy: FSDP2 units under FSDP2, a DeepSpeed engine
    without optimizer under ZeRO-3; elsewhere `accelerator.prepare_model(..., evaluation_mode=True)`
    (a full copy, as the policy is full there too)."""
    reference = reference.eval().requires_grad_(False)
    if accelerator.is_fsdp2:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        return fsdp2_prepare_model(accelerator, reference).eval()
    if zero_stage(accelerator) == 3:
        import deepspeed

        engine, *_ = deepspeed.initialize(model=reference, config=inference_deepspeed_config(accelerator))
        engine.eval()  # DeepSpeedEngine.eval() returns None, not the engine
        return engine
    return accelerator.prepare_model(reference, evaluation_mode=True)


def zero_stage(accelerator: Accelerator) -> int | None:
    """The DeepSpeed ZeRO stage of the run, or None without DeepSpeed."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return None
    return int(accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"]["stage"])


def inference_deepspeed_config(accelerator: Accelerator) -> dict[str, Any]:
    """The run's DeepSpeed config without what needs an optimizer (no optimizer, scheduler or optimizer
    offload: the reference is never stepped)."""
    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    config["zero_optimization"].pop("offload_optimizer", None)
    return config


# ------------------------------------------------------------------ saving


def full_state_dict(accelerator: Accelerator, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's full weights for `save_pretrained`. Call it on EVERY process: under FSDP2 and
    ZeRO-3 it is a collective. The main process gets every tensor (on CPU under FSDP2); under FSDP2
    the others get an empty dict."""
    if sharding_of(model) == "fsdp2":  # also a model sharded with fully_shard outside accelerate's FSDP2 plugin
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _without_tied_copies(model, state_dict)
    return accelerator.get_state_dict(model)


def any_process(accelerator: Accelerator, flag: bool) -> bool:
    """Whether `flag` holds on any process (every process must call it)."""
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor(float(flag), device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="max").item())


def _without_tied_copies(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the second name of a tied weight (lm_head.weight tied to the input embeddings): gathered,
    the two are separate copies, and save_pretrained would write the matrix twice."""
    seen: set[int] = set()
    tied_copies = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied_copies.append(name)
        seen.add(id(param))
    return {name: tensor for name, tensor in state_dict.items() if name not in tied_copies}
