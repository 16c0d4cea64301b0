"""LoRA adapters alone to vLLM (`vllm_lora_sync="adapters"`, the default): the engine keeps the base weights it
loaded at start-up and, after each optimizer step, receives only the adapter tensors, as a new adapter version.

The engine runs with `enable_lora=True` and `max_lora_rank` (the adapter's rank rounded up to one vLLM serves);
each push is one version: the adapter's tensors and `adapter_config.json` written to a folder of their own, made
whole in a temporary folder and renamed into place (atomic: the engine never reads a half-written adapter), then
registered as `LoRARequest("rloo-v<N>", N, folder)`. Generation names the version it samples with; an engine
that does not hold that version refuses (`StaleAdapterError`) instead of sampling from another policy.

vLLM serves plain LoRA (rsLoRA too: the engine reads `use_rslora` and scales by alpha / sqrt(r)). Adapters it does
not serve as they are fall back to the merged push (adapters merged into the base weights, every base weight
sent), with one logged line saying why (`adapter_fallback_reason`): DoRA, `modules_to_save`,
`lora_target_parameters`, LoRA bias, more than one adapter, initialisations that change the base (PiSSA, ...).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any

import torch

from rloo.config import ConfigError
from rloo.model_loading import is_quantized

logger = logging.getLogger(__name__)
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


class StaleAdapterError(RuntimeError):
    """The engine was asked to sample with an adapter version it does not hold."""


def is_lora_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_adapter")


def lora_config(model: torch.nn.Module) -> Any:
    """The policy's active peft config."""
    return model.peft_config[getattr(model, "active_adapter", "default")]


def adapter_rank(config: Any) -> int:
    """The largest rank of the adapter (r, or a larger one in rank_pattern)."""
    return max([config.r, *(getattr(config, "rank_pattern", None) or {}).values()])


def engine_max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds `rank`."""
    for allowed in MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"a LoRA rank of {rank} is over the largest vLLM serves ({MAX_LORA_RANKS[-1]}); "
                     f"use vllm_lora_sync='merged'.")


def adapter_fallback_reason(model: torch.nn.Module) -> str | None:
    """Why this LoRA policy cannot go to vLLM as adapters alone (then it is pushed merged), or None if it can."""
    if len(model.peft_config) != 1:
        return f"the policy has {len(model.peft_config)} adapters ({', '.join(model.peft_config)}); vLLM serves one"
    config = lora_config(model)
    if type(config).__name__ != "LoraConfig":
        return f"the adapter is a {type(config).__name__}, not a LoraConfig"
    if getattr(config, "use_dora", False):
        return "DoRA (use_dora=True): vLLM does not serve DoRA"
    if getattr(config, "modules_to_save", None):
        return (f"modules_to_save={sorted(config.modules_to_save)}: these modules are trained whole, and vLLM takes "
                f"no full modules with an adapter")
    if getattr(config, "target_parameters", None):
        return (f"lora_target_parameters={list(config.target_parameters)}: vLLM serves adapters on modules, not on "
                f"parameters")
    if getattr(config, "lora_bias", False):
        return "lora_bias=True: vLLM does not serve LoRA biases"
    init = getattr(config, "init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal"):
        return f"init_lora_weights={init!r} changes the base weights, which the engine does not see"
    if adapter_rank(config) > MAX_LORA_RANKS[-1]:
        return f"rank {adapter_rank(config)} is over the largest vLLM serves ({MAX_LORA_RANKS[-1]})"
    targets = config.target_modules
    names = [targets] if isinstance(targets, str) else list(targets or [])
    unserved = [t for t in names if any(part in t for part in ("embed", "lm_head"))]
    if unserved:
        return f"adapters on {unserved}: vLLM 0.32 serves LoRA on linear layers of the decoder only"
    return None


def choose_lora_sync(model: torch.nn.Module, args: Any) -> str | None:
    """How this policy's weights reach the engine: None without adapters, else the config's vllm_lora_sync, or
    "merged" with one logged line when vLLM cannot serve the adapter as it is."""
    if not is_lora_model(model):
        return None
    wanted = getattr(args, "vllm_lora_sync", "merged")
    reason = adapter_fallback_reason(model) if wanted == "adapters" else None
    if (wanted == "merged" or reason) and is_quantized(model.get_base_model()):
        raise ConfigError(f"the policy's base is quantised (4-bit / 8-bit), and its packed weights cannot be pushed "
                          f"to vLLM merged; use vllm_lora_sync='adapters' with an adapter vLLM serves"
                          f"{f' (this one: {reason})' if reason else ''}.")
    if reason is not None:
        logger.warning("vllm_lora_sync='adapters' falls back to the merged push: %s", reason)
        return "merged"
    return wanted


def adapter_versions_held(args: Any) -> int:
    """Adapter versions one engine holds at once (vLLM's max_loras): the newest, and under async_rollouts one per
    rollout the sampler may run ahead (max_staleness) besides the live policy's that evaluation samples with."""
    return 2 + (args.max_staleness if getattr(args, "async_rollouts", False) else 0)


def engine_lora_options(model: torch.nn.Module, args: Any) -> dict[str, int]:
    """The engine's LoRA options for this policy: max_lora_rank, max_loras."""
    return {"max_lora_rank": engine_max_lora_rank(adapter_rank(lora_config(model))),
            "max_loras": adapter_versions_held(args)}


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (`base_model.model.<module>.lora_A.weight`), on CPU."""
    from peft import get_peft_model_state_dict

    return {name: tensor.detach().to("cpu", copy=True).contiguous()
            for name, tensor in get_peft_model_state_dict(model).items()}


def adapter_config_json(model: torch.nn.Module) -> str:
    """`adapter_config.json`'s text, as PEFT's save_pretrained writes it."""
    config = lora_config(model)
    values = config.to_dict()
    return json.dumps({k: sorted(v) if isinstance(v, set) else v for k, v in values.items()}, default=str)


def push_adapter(engine: Any, version: int, model: torch.nn.Module) -> int:
    """Send `model`'s adapter to `engine` as `version`; the bytes of its tensors."""
    tensors = adapter_tensors(model)
    engine.load_adapter(version, tensors, adapter_config_json(model))
    return tensor_bytes(tensors)


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def write_adapter(root: str, version: int, tensors: dict[str, torch.Tensor], config_json: str) -> str:
    """Write adapter `version` under `root` atomically: into a temporary folder, then renamed to `root/v<version>`
    (an existing one is replaced). Returns the folder."""
    from safetensors.torch import save_file

    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"v{version}")
    staging = tempfile.mkdtemp(prefix=f".v{version}-", dir=root)
    save_file(tensors, os.path.join(staging, "adapter_model.safetensors"))
    with open(os.path.join(staging, "adapter_config.json"), "w") as file:
        file.write(config_json)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def lora_request(version: int, path: str, inplace: bool = False) -> Any:
    """vLLM's LoRARequest for adapter `version` in folder `path`; `inplace` reloads an id the engine already has."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(f"rloo-v{version}", version, path, load_inplace=inplace)


class AdapterSlots:
    """The adapter versions an engine holds (folders under `root`), at most `keep` of them: registering one more
    drops the oldest (from the engine, through `remove`, and from disk)."""

    def __init__(self, root: str, keep: int) -> None:
        self.root, self.keep = root, keep
        self.versions: list[int] = []

    def add(self, version: int, tensors: dict[str, torch.Tensor], config_json: str, register: Any, remove: Any) -> None:
        """Write version `version`, `register(version, folder)` it, and `remove(id)` the oldest beyond `keep`."""
        register(version, write_adapter(self.root, version, tensors, config_json))
        if version in self.versions:
            self.versions.remove(version)
        self.versions.append(version)
        while len(self.versions) > self.keep:
            old = self.versions.pop(0)
            remove(old)
            shutil.rmtree(os.path.join(self.root, f"v{old}"), ignore_errors=True)

    def request(self, version: int) -> Any:
        """The LoRARequest of a held version (StaleAdapterError for another)."""
        self.check(version)
        return lora_request(version, os.path.join(self.root, f"v{version}"))

    def check(self, version: int) -> None:
        if version not in self.versions:
            raise StaleAdapterError(f"asked to sample with adapter version {version}, but the engine holds versions "
                                    f"{self.versions}: the adapter push for that optimizer step did not reach it (a "
                                    f"restarted server, or another trainer pushing to the same one)")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
