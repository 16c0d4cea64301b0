"""GSM8K rewards against hand-picked completions, real GSM8K answers and a Qwen-style tokenizer's ids."""

import pytest

from rloo.assets.gsm8k import gsm8k_folder, gsm8k_rows
from rloo.cli import resolve_reward_func
from rloo.rewards.gsm8k import extract_answer, gold_number, gsm8k_accuracy, gsm8k_format, gsm8k_thinking_accuracy
from rloo.toy import build_char_tokenizer

GSM8K = gsm8k_folder()
JANET = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"


@pytest.mark.parametrize("text, expected", [
    ("so 9 * 2 = 18\n#### 18", 18.0),
    ("#### 1,000", 1000.0),
    ("#### $1,000.50.", 1000.5),
    ("#### -3", -3.0),
    ("The answer is \\boxed{42}. Check: 6*7", 42.0),   # \boxed beats a later bare number
    ("#### 5 then 9 more words 7", 5.0),               # "####" beats every other number
    ("She makes $18 a day.", 18.0),                    # the last number
    ("no number here", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_gold_number_reads_a_gsm8k_cell_or_a_bare_number():
    assert gold_number(JANET) == 18.0
    assert gold_number("18") == 18.0
    assert gold_number("#### 1,234") == 1234.0


def test_accuracy_reads_after_the_last_think_end():
    completions = [
        "<think>16-3-4 = 9 eggs, 9*2 = 18</think>\nShe makes $18.\n#### 18",  # right
        "<think>maybe 18</think> #### 17",                                    # the reasoning is not graded
        "<think>16-3-4 = 9, so 18",                                            # never closed: no answer
        "9 * 2 = 18\n#### 18",                                                 # no thinking at all
        "9 eggs at $2 make $18, or 1,8",                                       # last number 8 -> wrong
    ]
    assert gsm8k_accuracy(completions, answer=[JANET] * 5) == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_accuracy_and_format_accept_conversational_completions():
    completion = [{"role": "assistant", "content": "2 + 3 = 5\n#### 5"}]
    assert gsm8k_accuracy([completion], answer=["5"]) == [1.0]
    assert gsm8k_format([completion]) == [1.0]


def test_format_wants_a_final_hashes_line():
    completions = ["3 + 2 = 5\n#### 5", "#### 5", "The answer is 5.", "#### 5\nbecause 3 + 2", "<think>x\n#### 5",
                   "<think>3+2</think>\n#### 5", "#### five"]
    assert gsm8k_format(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


@pytest.mark.skipif(GSM8K is None, reason="GSM8K's files were not found (set RLOO_GSM8K_DIR)")
def test_every_real_gsm8k_solution_scores_one_against_itself():
    rows = gsm8k_rows("test")
    assert len(rows) == 1319
    solutions = [row["answer"] for row in rows]
    assert gsm8k_accuracy(solutions, answer=solutions) == [1.0] * len(rows)
    assert sum(gsm8k_format(solutions)) == len(rows)
    shifted = solutions[1:] + solutions[:1]  # another problem's solution is almost always wrong
    assert sum(gsm8k_accuracy(shifted, answer=solutions)) < 0.05 * len(rows)


def test_thinking_accuracy_finds_the_think_end_by_its_id():
    tokenizer = build_char_tokenizer()  # its own copy: the shared one must keep its vocabulary
    tokenizer.add_tokens(["<think>", "</think>"])
    reward = gsm8k_thinking_accuracy(tokenizer)
    assert reward.think_end_id == tokenizer.convert_tokens_to_ids("</think>")
    ids = [tokenizer("<think>7*3=21</think>#### 21", add_special_tokens=False)["input_ids"],
           tokenizer("<think>7*3=21 #### 21", add_special_tokens=False)["input_ids"]]
    assert reward(completion_ids=ids, answer=["21", "21"]) == [1.0, 0.0]


def test_the_cli_names_resolve():
    assert resolve_reward_func("gsm8k_accuracy") is gsm8k_accuracy
    assert resolve_reward_func("gsm8k_format") is gsm8k_format
