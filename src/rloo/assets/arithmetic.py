"""Long arithmetic where a calculator decides the answer: the tool-learning task of issue #50.

"What is (48213 * 7904) - 1187?" asks for numbers too long for a 135M model to multiply in its head, while the
plan is written in the question: compute each operation in order, carry the result on, answer the last one. A
model that calls the calculator and copies its results succeeds; one that guesses digits does not.

Each problem is a row in GSM8K's shape, so the GSM8K rewards (`gsm8k_accuracy`, `gsm8k_format`) and the GSM8K
tool warm start (recipes/gsm8k_sft.py) read it unchanged: `prompt` (a conversation), `answer` (a worked solution,
one calculator annotation per operation, "48213 * 7904 = <<48213 * 7904=381075552>>381075552", ending "#### n")
and `question`. `arithmetic_rows` is deterministic per (seed, split): train, test (1-3 operations, like train)
and test_hard (4-5 operations) use disjoint seeds.
"""

from __future__ import annotations

import random

INSTRUCTION = ("Compute the expression one operation at a time, in the order the parentheses give, with the "
               "calculator tool for every operation. End with a line '#### <number>' holding only the final answer.")

SPLIT_SEEDS = {"train": 0, "test": 1, "test_hard": 2}
SPLIT_OPERATIONS = {"train": (1, 3), "test": (1, 3), "test_hard": (4, 5)}


def operand(rng: random.Random, operator: str) -> int:
    """A number to combine with `operator`: 4-5 digits to add or subtract, 2-4 digits to multiply by."""
    return rng.randint(10, 9999) if operator == "*" else rng.randint(1000, 99999)


def arithmetic_problem(rng: random.Random, operations: int) -> tuple[str, list[tuple[int, str, int, int]]]:
    """(expression, steps): `operations` of + - * applied left to right to a 4-5 digit start, parenthesised so
    the written order is the order of evaluation; steps are (left, operator, right, result) in that order."""
    value = rng.randint(1000, 99999)
    expression, steps = str(value), []
    for index in range(operations):
        operator = rng.choice("+-*")
        right = operand(rng, operator)
        result = value + right if operator == "+" else value - right if operator == "-" else value * right
        expression = f"({expression}) {operator} {right}" if index else f"{expression} {operator} {right}"
        steps.append((value, operator, right, result))
        value = result
    return expression, steps


def worked_solution(steps: list[tuple[int, str, int, int]]) -> str:
    """The solution in GSM8K's annotated form: one line per operation, then '#### n'."""
    lines = [f"{left} {operator} {right} = <<{left} {operator} {right}={result}>>{result}"
             for left, operator, right, result in steps]
    return "\n".join([*lines, f"#### {steps[-1][3]}"])


def arithmetic_prompt(question: str) -> list[dict]:
    """The conversation asking one question (the calculator's schema reaches the model through the template)."""
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]


def arithmetic_rows(split: str, count: int, seed: int | None = None) -> list[dict]:
    """`count` problems of a split (train, test, test_hard) as prompt rows; the same rows for the same arguments."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split {split!r}: choose one of {sorted(SPLIT_SEEDS)}")
    rng = random.Random(f"arithmetic/{split}/{SPLIT_SEEDS[split] if seed is None else seed}")
    low, high = SPLIT_OPERATIONS[split]
    rows = []
    for _ in range(count):
        expression, steps = arithmetic_problem(rng, rng.randint(low, high))
        question = f"What is {expression}?"
        rows.append({"prompt": arithmetic_prompt(question), "answer": worked_solution(steps), "question": question})
    return rows
