"""Real tokenizers offline: llama.cpp's vocabulary-only GGUF files, from the llama-cpp-python sdist.

llama.cpp keeps tokenizer-only GGUF files (`vendor/llama.cpp/models/ggml-vocab-*.gguf`) for its own
tests, and the llama-cpp-python source distribution carries them. transformers loads them with
`gguf_file=` (the `gguf` package is needed). Nothing is built: the files are read from the archive
with `tarfile` and cached next to it.

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d ~/.cache/rloo/tokenizers
    pip install gguf
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from rloo.assets.smollm2 import cache_root

SDIST = "llama_cpp_python-0.3.36.tar.gz"
DOWNLOAD_HINT = ("pip install gguf && pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 "
                 "-d ~/.cache/rloo/tokenizers")

# Our names for the families -> the file's name in llama.cpp.
VOCABULARIES = {
    "qwen2": "qwen2",          # Qwen2 / Qwen2.5 (151,936 ids; ChatML template; <|im_end|> ends a turn)
    "llama3": "llama-bpe",     # Llama 3 (128,256 ids; <|eot_id|> ends a turn)
    "llama2": "llama-spm",     # Llama 2 (32,000 ids; SentencePiece; <s> BOS, </s> EOS)
    "phi3": "phi-3",           # Phi-3 (32,064 ids; <|end|> ends a turn)
    "gpt2": "gpt-2",           # GPT-2 (50,257 ids; <|endoftext|> only)
}


def vocabulary_folder() -> Path:
    return cache_root() / "tokenizers"


def vocabularies_available() -> bool:
    """True when the sdist is cached and `gguf` is installed."""
    import importlib.util

    return (vocabulary_folder() / SDIST).is_file() and importlib.util.find_spec("gguf") is not None


def vocab_gguf(name: str) -> Path:
    """The cached GGUF vocabulary of a family in VOCABULARIES, extracted from the sdist on first use."""
    if name not in VOCABULARIES:
        raise ValueError(f"unknown vocabulary {name!r}; known: {sorted(VOCABULARIES)}")
    target = vocabulary_folder() / "vocab" / f"ggml-vocab-{VOCABULARIES[name]}.gguf"
    if target.is_file():
        return target
    archive = vocabulary_folder() / SDIST
    if not archive.is_file():
        raise FileNotFoundError(f"{archive} is missing: {DOWNLOAD_HINT}")
    member = f"{SDIST[: -len('.tar.gz')]}/vendor/llama.cpp/models/{target.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as sdist:
        data = sdist.extractfile(member).read()
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


def load_vocab_tokenizer(name: str) -> Any:
    """A transformers tokenizer read from a family's GGUF vocabulary."""
    from transformers import AutoTokenizer

    path = vocab_gguf(name)
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
