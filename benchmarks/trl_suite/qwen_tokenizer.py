"""A Qwen3 tokenizer for the stand-ins whose tests script real Qwen token ids (TRL's tool and environment tests).

TRL's GRPOTrainer tool tests patch `generate` to return fixed Qwen3 ids, e.g. `151657, 198, 4913, 606, ...` for
'<tool_call>\\n{"name" ...', and they need a chat template that renders tool calls and tool messages. The
byte-level stand-ins of standins.py decode those ids to filler and render no tools, so under them the tests fail
for TRL and rloo alike, and mean nothing.

This builds the real thing from offline parts: Qwen2's byte-level BPE vocabulary and merges from llama.cpp's
`ggml-vocab-qwen2.gguf` (the same 151,643 regular tokens as Qwen3; `rloo.assets.vocabularies`), Qwen3's added tokens
at their ids (151,643-151,668, with `<tool_call>`, `<tool_response>` and `<think>` not special, as in Qwen3's
tokenizer, so that decoding with skip_special_tokens keeps them), and the Qwen3 chat template that the installed TRL
ships (`trl/chat_templates/qwen3.jinja`), which TRL recognises for its response parsing.
"""

from __future__ import annotations

import json
from pathlib import Path

import transformers
from tokenizers import Tokenizer

# Qwen3's added tokens from 151,643 on: (text, special). The ids are consecutive.
QWEN3_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
FIRST_ADDED = 151643
QWEN3_TOKENIZER_SIZE = FIRST_ADDED + len(QWEN3_ADDED)  # 151,669, as len() of Qwen3's tokenizer


def trl_qwen3_template() -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")


def qwen3_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Qwen3's tokenizer, rebuilt offline (module docstring): len 151,669, eos <|im_end|>, pad <|endoftext|>."""
    from rloo.assets.vocabularies import load_vocab_tokenizer

    data = json.loads(load_vocab_tokenizer("qwen2").backend_tokenizer.to_str())
    vocab = {text: index for text, index in data["model"]["vocab"].items() if index < FIRST_ADDED}
    for offset, (text, _) in enumerate(QWEN3_ADDED):
        vocab[text] = FIRST_ADDED + offset
    data["model"]["vocab"] = vocab
    data["added_tokens"] = [
        {"id": FIRST_ADDED + offset, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special} for offset, (text, special) in enumerate(QWEN3_ADDED)]
    data["post_processor"] = None  # Qwen adds no BOS
    backend = Tokenizer.from_str(json.dumps(data))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=131072,
        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = trl_qwen3_template()
    if len(tokenizer) != QWEN3_TOKENIZER_SIZE:
        raise RuntimeError(f"rebuilt Qwen3 tokenizer has {len(tokenizer)} tokens, expected {QWEN3_TOKENIZER_SIZE}")
    return tokenizer
