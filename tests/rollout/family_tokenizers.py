"""Tokenizers and chat templates of each model family whose tool calls rloo reads, built offline.

The templates are the families' published chat templates as the installed TRL package ships them
(`trl/chat_templates/*.jinja`). The tokenizers are real where llama.cpp's vocabularies give them (Qwen3,
rebuilt from the Qwen2 vocabulary: benchmarks/trl_suite/qwen_tokenizer.py; Llama 3: `ggml-vocab-llama-bpe`);
for the other families, Qwen's byte-level BPE with the family's own control tokens added as special tokens at new
ids (their real ids are not at hand offline; what the tests need is that each is one id, as in the real
tokenizer). `STOPS` lists the ids generation stops at, as each family's generation_config declares them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rloo.assets.vocabularies import vocabularies_available

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "trl_suite"))

# template -> (base tokenizer, the family's control tokens to add, the tokens generation stops at)
FAMILIES = {
    "qwen2_5": ("qwen", [], ["<|im_end|>", "<|endoftext|>"]),
    "qwen3": ("qwen", [], ["<|im_end|>", "<|endoftext|>"]),
    "qwen3_5_think": ("qwen", [], ["<|im_end|>", "<|endoftext|>"]),
    "qwen3_6": ("qwen", [], ["<|im_end|>", "<|endoftext|>"]),
    "nemotron_3_nano": ("qwen", [], ["<|im_end|>"]),
    "llama3_1": ("llama3", [], ["<|eot_id|>", "<|end_of_text|>"]),
    "llama3_2": ("llama3", [], ["<|eot_id|>", "<|end_of_text|>"]),
    "lfm2_2_5": ("qwen", ["<|startoftext|>", "<|tool_call_start|>", "<|tool_call_end|>"], ["<|im_end|>"]),
    "gptoss": ("qwen", ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>",
                        "<|constrain|>"], ["<|return|>", "<|call|>"]),
    "gemma4": ("qwen", ["<bos>", "<eos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                        "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|tool>", "<tool|>"],
               ["<turn|>", "<eos>", "<|tool_response>"]),
    "glm4moe": ("qwen", ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                         "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
                ["<|user|>", "<|observation|>", "<|endoftext|>"]),
    "deepseek_r1_distill": ("qwen", ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                            ["<｜end▁of▁sentence｜>"]),
}


def needs_family_tokenizers() -> None:
    if not vocabularies_available():
        pytest.skip("the real tokenizers are not cached (rloo.assets.vocabularies)")
    pytest.importorskip("trl", reason="the families' chat templates come from TRL's package")


def trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


_BASES: dict[str, object] = {}


def family_tokenizer(name: str):
    """(tokenizer with the family's template, the ids generation stops at)."""
    import copy

    from qwen_tokenizer import qwen3_tokenizer

    from rloo.assets.vocabularies import load_vocab_tokenizer

    base, added, stops = FAMILIES[name]
    if base not in _BASES:
        _BASES[base] = qwen3_tokenizer() if base == "qwen" else load_vocab_tokenizer("llama3")
    tokenizer = copy.deepcopy(_BASES[base])
    if added:
        tokenizer.add_special_tokens({"additional_special_tokens": added})
    if name == "gemma4":
        tokenizer.bos_token, tokenizer.eos_token = "<bos>", "<eos>"
    if name == "gptoss":
        tokenizer.eos_token = "<|return|>"
    if name == "glm4moe":
        tokenizer.eos_token = "<|endoftext|>"
    if name == "deepseek_r1_distill":
        tokenizer.bos_token, tokenizer.eos_token = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    if base == "llama3":
        tokenizer.eos_token = "<|eot_id|>"
    tokenizer.chat_template = trl_template(name)
    return tokenizer, {tokenizer.convert_tokens_to_ids(token) for token in stops}
