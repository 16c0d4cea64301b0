"""Models given by name are loaded as users load them: `RLOOConfig.model_init_kwargs` (TRL's name)
goes to `from_pretrained` of the policy and of reward models, and a `quantization_config` turns a
policy with a `peft_config` into QLoRA (k-bit base prepared for training, LoRA adapters on top).
`saved_names` maps the names `save_pretrained` writes back to the model's, for a resume (`run.checkpoint`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.utils.checkpoint

from rloo.config import ConfigError, RLOOConfig
from rloo.passes.prefix_logprobs import ReplayableCache

logger = logging.getLogger(__name__)

# What a model given by name gets unless the user says otherwise: the checkpoint's own dtype (not
# silently fp32), and no code from the Hub runs unless asked.
DEFAULT_INIT_KWARGS = {"dtype": "auto", "trust_remote_code": False}


def model_init_kwargs(args: RLOOConfig) -> dict[str, Any]:
    """`from_pretrained` keyword arguments from the config, over rloo's defaults; dtype names become
    torch dtypes and TRL's spellings are read (`given_init_kwargs`), a quantization_config dict becomes a
    BitsAndBytesConfig."""
    kwargs = {**DEFAULT_INIT_KWARGS, **given_init_kwargs(args, model_is_loaded=False)}
    bits = {key: kwargs.pop(key) for key in ("load_in_4bit", "load_in_8bit") if key in kwargs}
    if any(bits.values()):  # TRL's spelling; transformers 5 takes them only inside a BitsAndBytesConfig
        if kwargs.get("quantization_config") is not None:
            raise ConfigError(f"model_init_kwargs gives both {sorted(bits)} and a quantization_config; give one "
                              f"(e.g. quantization_config={{'load_in_4bit': True, 'bnb_4bit_quant_type': 'nf4'}}).")
        kwargs["quantization_config"] = {key: value for key, value in bits.items() if value}
    if isinstance(kwargs.get("quantization_config"), dict):
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(**kwargs["quantization_config"])
    return kwargs


def given_init_kwargs(args: Any, model_is_loaded: bool) -> dict[str, Any]:
    """from_pretrained keyword arguments from TRL's `model_init_kwargs` and `trust_remote_code`.

    dtype strings ("bfloat16", "float32", "auto") become what from_pretrained takes; `torch_dtype`
    is the older name of `dtype`. Kwargs for a model that is already loaded are an error, not ignored.
    """
    kwargs = dict(getattr(args, "model_init_kwargs", None) or {})
    if "torch_dtype" in kwargs:
        kwargs.setdefault("dtype", kwargs.pop("torch_dtype"))
    dtype = kwargs.get("dtype")
    if isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ConfigError(f"model_init_kwargs dtype={dtype!r} is not a torch dtype; use e.g. 'bfloat16', "
                              f"'float32' or 'auto'.")
        kwargs["dtype"] = getattr(torch, dtype)
    if kwargs.get("dtype") is None:
        kwargs.pop("dtype", None)
    if args.trust_remote_code:
        kwargs["trust_remote_code"] = True
    if kwargs and model_is_loaded:
        raise ConfigError(f"model_init_kwargs / trust_remote_code ({sorted(kwargs)}) apply when the model is given "
                          f"by name, but a loaded model was passed. Load it with these arguments yourself.")
    return kwargs


def is_quantized(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_quantized", False) or getattr(model, "is_loaded_in_4bit", False)
                or getattr(model, "is_loaded_in_8bit", False))


def prepare_quantized(policy: torch.nn.Module, peft_config: Any, args: RLOOConfig) -> torch.nn.Module:
    """A k-bit base can only be trained through adapters: refuse without a peft_config, else let
    peft prepare it (norms in fp32, input grads for checkpointing) before the adapters go on."""
    if peft_config is None:
        raise ValueError("The policy is quantized (model_init_kwargs['quantization_config']); its weights cannot be "
                         "trained directly. Pass a peft_config (QLoRA) or drop the quantization_config.")
    from peft import prepare_model_for_kbit_training

    keep_4bit_layers_trainable_on_cpu(policy)
    # Under shared_prefix_forward the builder checkpoints the layers itself (`checkpoint_layers`).
    return prepare_model_for_kbit_training(
        policy, use_gradient_checkpointing=args.gradient_checkpointing and not args.shared_prefix_forward,
        gradient_checkpointing_kwargs={"use_reentrant": False})


def keep_4bit_layers_trainable_on_cpu(model: torch.nn.Module) -> None:
    """bitsandbytes (0.50) repacks a 4-bit layer's weight for its AVX512-BF16 inference kernel the first time the
    layer runs in eval mode without grad on a CPU that has the instruction (sampling does), for good; the next
    training forward then fails ("a view of a leaf Variable ... in-place operation"). Turned off here: the 4-bit
    layers always run the same (trainable) path, in sampling, the reference and the training passes alike."""
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def checkpoint_layers(model: torch.nn.Module) -> int:
    """Recompute every decoder layer in backward when it runs on a `ReplayableCache` (the shared-prefix forward).

    gradient_checkpointing under shared_prefix_forward. transformers' checkpointing turns the KV cache off,
    since a recomputed layer would append its keys and values to the cache a second time; the completions
    of the shared-prefix forward run on their prompt's cache. Its passes use `ReplayableCache`, whose
    layers give the same keys and values however often they are called, so each decoder layer there is
    checkpointed as a whole (non-reentrant torch checkpoint, the RNG state preserved for dropout): only
    its inputs are kept, as with transformers' checkpointing of the plain pass. Elsewhere (other caches,
    eval mode, no grad) a layer runs as before.

    Returns the number of layers wrapped; raises ConfigError when the model has no transformers decoder layers.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    wrapped = 0
    for layer in model.modules():
        if not isinstance(layer, GradientCheckpointingLayer):
            continue
        if not isinstance(layer, CheckpointedLayer):
            # A subclass, not a wrapped bound method: a deep copy (the reference model) must run its own weights.
            layer.__class__ = _checkpointed_class(type(layer))
        wrapped += 1
    if not wrapped:
        raise ConfigError("gradient_checkpointing with shared_prefix_forward recomputes each of the model's decoder layers "
                          "(transformers' GradientCheckpointingLayer), and this model has none. Turn "
                          "shared_prefix_forward off (transformers' own checkpointing then applies) or "
                          "gradient_checkpointing off.")
    return wrapped


class CheckpointedLayer(torch.nn.Module):
    """Mixed into a decoder layer's class by `checkpoint_layers`: its forward, recomputed in backward when
    training on a `ReplayableCache`."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        replayable = any(isinstance(value, ReplayableCache) for value in (*args, *kwargs.values()))
        if replayable and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(super().forward, *args, use_reentrant=False, **kwargs)
        return super().forward(*args, **kwargs)


@functools.cache
def _checkpointed_class(layer_class: type) -> type:
    return type(f"Checkpointed{layer_class.__name__}", (CheckpointedLayer, layer_class), {})


def from_pretrained(load: Callable[..., Any], name: str, what: str = "model", **kwargs: Any) -> Any:
    """`load(name, **kwargs)` (a `from_pretrained`), with a Hub id that cannot be fetched named as such:
    offline or unreachable, say so and that a local directory works, instead of transformers' OSError."""
    try:
        return load(name, **kwargs)
    except OSError as error:
        if Path(name).expanduser().exists():
            raise
        raise ConfigError(hub_error_message(name, what, error)) from error


def hub_error_message(name: str, what: str, error: BaseException) -> str:
    """The sentence for a `what` given as the Hub id `name` that could not be loaded."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if offline:
        return (f"{what} {name!r} is not a local path and cannot be loaded offline (HF_HUB_OFFLINE is set and it is "
                f"not in the local cache). Give a local directory written by save_pretrained, or download it once "
                f"with the network.")
    return (f"{what} {name!r} is not a local path and could not be loaded from the Hugging Face Hub ({reason}). If the "
            f"Hub is unreachable, give a local directory written by save_pretrained; check the id's spelling; for a "
            f"private or gated model, log in with `hf auth login`.")


# The classes transformers writes into tokenizer_config.json for a tokenizer that is its tokenizer.json and nothing
# else (transformers 5's name, and 4's).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# The parts of tokenizer.json that decide how text becomes ids and back.
TOKENIZER_PARTS = ("model", "normalizer", "pre_tokenizer", "decoder")


def load_tokenizer(name: str, what: str = "model", **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(name, **kwargs)`, but a tokenizer saved as a plain tokenizer.json comes back as
    it was saved.

    transformers 5 picks the tokenizer class from the model's type when the folder also holds a model config (a
    qwen2 model: Qwen2Tokenizer), even where tokenizer_config.json names the generic class; that class rebuilds the
    vocabulary model, normaliser, pre-tokenizer and decoder its own way, and a custom tokenizer then encodes other
    ids without a word (rloo's character-level toy tokenizer, saved beside a Qwen2 model, lost its spaces and
    newlines). When the folder declares the generic class and the loaded tokenizer's parts differ from its
    tokenizer.json, the folder is loaded with the generic class instead, which reads tokenizer.json as written."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = from_pretrained(AutoTokenizer.from_pretrained, name, what, **kwargs)
    folder = Path(name).expanduser()
    if type(tokenizer).__name__ in GENERIC_TOKENIZER_CLASSES or not (folder / "tokenizer.json").is_file():
        return tokenizer
    declared = _read_json(folder / "tokenizer_config.json").get("tokenizer_class")
    if declared not in GENERIC_TOKENIZER_CLASSES:
        return tokenizer
    saved = _read_json(folder / "tokenizer.json")
    loaded = json.loads(tokenizer.backend_tokenizer.to_str())
    changed = [part for part in TOKENIZER_PARTS if saved.get(part) != loaded.get(part)]
    if not changed:
        return tokenizer
    logger.warning("%s %s: AutoTokenizer gave %s, which rebuilt the %s of the saved tokenizer.json (declared %s); "
                   "loading it as %s instead, as it was saved", what, name, type(tokenizer).__name__,
                   ", ".join(changed), declared, PreTrainedTokenizerFast.__name__)
    return PreTrainedTokenizerFast.from_pretrained(str(folder), **kwargs)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def saved_names(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, str]:
    """{name save_pretrained writes: the model's name} for the weights transformers renames on saving (its checkpoint
    conversion mapping, reverted by `save_original_format`: a VLM's `model.language_model.*` is saved as
    `language_model.model.*`). Weights that a conversion splits or fuses (not a plain renaming) are not in it."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without conversion mappings saves the model's own names
        return {}
    reverted = revert_weight_conversion(model, dict(state))
    by_identity = {id(tensor): name for name, tensor in state.items()}  # a renaming keeps the tensor object
    return {saved: by_identity[id(tensor)] for saved, tensor in reverted.items() if id(tensor) in by_identity}
