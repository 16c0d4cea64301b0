"""Tool results appended as tokens under Qwen3's real tokenizer and chat template.

Qwen3's template renders the last assistant turn with an empty `<think>\\n\\n</think>\\n\\n` block and an earlier
one without it, so the same assistant turn has other ids once a tool message follows. rloo never re-renders a
sampled turn; it needs only the ids after the turn's end. The tokenizer is Qwen3's, rebuilt offline from
llama.cpp's Qwen2 vocabulary (the same regular tokens) with Qwen3's added tokens, and the template is the Qwen3
template TRL ships (benchmarks/trl_suite/qwen_tokenizer.py).
"""

import os
import sys
from pathlib import Path

import pytest

from rloo.assets.vocabularies import DOWNLOAD_HINT, vocabularies_available
from rloo.tools.rendering import check_tool_template, tool_suffix_ids

if not vocabularies_available():
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must cache the real tokenizers: {DOWNLOAD_HINT}", pytrace=False)
    pytest.skip(f"the real tokenizers are not cached ({DOWNLOAD_HINT})", allow_module_level=True)
pytest.importorskip("trl", reason="the Qwen3 template comes from TRL's package")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "trl_suite"))

from qwen_tokenizer import qwen3_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return qwen3_tokenizer()


def test_qwen3_renders_the_assistant_turn_differently_once_a_tool_follows(tokenizer):
    """The case itself: the turn's ids change, so comparing renderings would refuse Qwen3."""
    call = {"type": "function", "function": {"name": "add", "arguments": {}}}
    exchange = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    alone = tokenizer.apply_chat_template(exchange, tokenize=False)
    followed = tokenizer.apply_chat_template(exchange + [{"role": "tool", "name": "add", "content": "3"}],
                                             tokenize=False)
    assert "<think>" in alone and "<think>" not in followed


def test_qwen3_template_is_accepted_and_the_suffix_is_the_tool_turn(tokenizer):
    check_tool_template(tokenizer)
    end = {tokenizer.eos_token_id}
    one = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "add", "content": "3"}], end)
    assert tokenizer.decode(one) == ("\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
                                     "<|im_start|>assistant\n")
    # Qwen3 puts consecutive tool results in one user turn.
    two = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "add", "content": "3"},
                                      {"role": "tool", "name": "add", "content": "5"}], end)
    assert tokenizer.decode(two) == ("\n<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n5\n"
                                     "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # The ids are the template's own tokens: <|im_start|> and <|im_end|> as single special ids.
    assert one[1] == tokenizer.convert_tokens_to_ids("<|im_start|>") and tokenizer.eos_token_id in one
