"""rloo.assets.arithmetic (issue #50's task): problems whose written order is their order of evaluation, worked
solutions the calculator and the GSM8K rewards agree with, fixed per split and disjoint between splits."""

import random
import sys
from pathlib import Path

import pytest

from rloo.assets.arithmetic import arithmetic_problem, arithmetic_rows, worked_solution
from rloo.rewards.gsm8k import gsm8k_accuracy

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
sys.path.insert(0, str(RECIPES))
sys.path.insert(0, str(RECIPES / "tools"))
from calculator import calculator  # noqa: E402
from gsm8k_sft import tool_transcript  # noqa: E402


def test_a_hand_written_solution():
    steps = [(48213, "*", 7904, 381075552), (381075552, "-", 1187, 381074365)]
    assert worked_solution(steps) == ("48213 * 7904 = <<48213 * 7904=381075552>>381075552\n"
                                      "381075552 - 1187 = <<381075552 - 1187=381074365>>381074365\n#### 381074365")


def test_the_written_expression_evaluates_to_the_last_step_as_python_reads_it():
    rng = random.Random(7)
    for operations in (1, 2, 3, 4, 5):
        for _ in range(50):
            expression, steps = arithmetic_problem(rng, operations)
            assert len(steps) == operations
            assert eval(expression) == steps[-1][3]  # noqa: S307 (our own digits and + - * only)
            for (_, _, _, result), (left, _, _, _) in zip(steps, steps[1:]):
                assert left == result  # each step starts from the one before


def test_each_annotation_is_a_calculator_call_that_gives_its_result():
    row = arithmetic_rows("train", 1)[0]
    turns = tool_transcript(row["answer"])
    calls = [turn for turn in turns if turn.get("tool_calls")]
    results = [turn["content"] for turn in turns if turn["role"] == "tool"]
    assert len(calls) == row["answer"].count("<<") == len(results)
    for turn, result in zip(calls, results):
        assert calculator(turn["tool_calls"][0]["function"]["arguments"]["expression"]) == result
    assert turns[-1]["content"].endswith(f"#### {results[-1]}")


def test_the_gsm8k_reward_grades_it():
    rows = arithmetic_rows("test", 3)
    answers = [row["answer"] for row in rows]
    assert gsm8k_accuracy([row["answer"].splitlines()[-1] for row in rows], answers) == [1.0, 1.0, 1.0]
    assert gsm8k_accuracy(["#### 12"] * 3, answers) == [0.0, 0.0, 0.0]


def test_splits_are_fixed_disjoint_and_the_hard_split_is_longer():
    assert arithmetic_rows("test", 20) == arithmetic_rows("test", 20)
    train = {row["question"] for row in arithmetic_rows("train", 2000)}
    test = [row["question"] for row in arithmetic_rows("test", 200)]
    assert not train & set(test)
    operations = lambda rows: [row["answer"].count("<<") for row in rows]  # noqa: E731
    assert set(operations(arithmetic_rows("test", 200))) == {1, 2, 3}
    assert set(operations(arithmetic_rows("test_hard", 200))) == {4, 5}
    with pytest.raises(ValueError, match="choose one of"):
        arithmetic_rows("validation", 1)
