"""Synthetic tasks with verifiable answers, and their rewards.

Datasets are `datasets.Dataset`s with string columns "prompt" and "answer". Rewards have the
trainer's shape `f(prompts, completions, completion_ids, **columns) -> list[float]`.
"""

from __future__ import annotations

import random
from typing import Any

from datasets import Dataset

from rloo.rewards import completion_text, exact_match

# The addition task's reward is the library's built-in `exact_match` (trim, collapse white space,
# drop a trailing period, lower-case, then compare); the name is kept for the benchmarks.
exact_match_reward = exact_match


def _addition_example(a: int, b: int) -> dict[str, str]:
    """One addition problem: prompt "a+b=" and answer str(a + b), no leading zeros."""
    return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


def _rows_to_dataset(rows: list[dict[str, str]]) -> Dataset:
    """A prompt/answer Dataset from rows, with the columns even when there are no rows."""
    return Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "answer": [r["answer"] for r in rows]})


def addition_dataset(num_examples: int, *, seed: int = 0, digits: int = 2) -> Dataset:
    """Random addition problems such as prompt "12+34=" with answer "46".

    Args:
        num_examples: number of rows (problems are drawn with replacement, so repeats happen).
        seed: the rows are a deterministic function of the seed.
        digits: operands are uniform in [0, 10**digits - 1].

    Returns:
        A Dataset with string columns "prompt" and "answer".
    """
    rng = random.Random(seed)
    high = 10**digits - 1
    rows = [_addition_example(rng.randint(0, high), rng.randint(0, high)) for _ in range(num_examples)]
    return _rows_to_dataset(rows)


def addition_split(num_train: int, num_eval: int, *, seed: int = 0, digits: int = 2) -> tuple[Dataset, Dataset]:
    """Disjoint train and held-out eval sets of distinct addition problems.

    Every problem (an ordered operand pair) appears at most once across both sets, so held-out
    accuracy measures generalisation, not memorisation. "12+34=" and "34+12=" are different
    prompts and may fall in different sets.

    Problems come from one seeded stream of distinct problems: the eval set is its first
    `num_eval`, the train set the next `num_train`. So the eval set depends only on `seed`,
    `num_eval` and `digits`, and a larger train set extends a smaller one: a warm start on
    `addition_split(4000, 500)` and RL on `addition_split(8192, 500)` share the same held-out set,
    which neither trains on.

    Args:
        num_train: number of training problems.
        num_eval: number of held-out problems.
        seed: both sets are a deterministic function of the seed.
        digits: operands are uniform in [0, 10**digits - 1]; there are 10**(2 * digits) problems.

    Returns:
        (train, eval) Datasets with string columns "prompt" and "answer".
    """
    base = 10**digits
    total = base * base
    if num_train + num_eval > total:
        raise ValueError(f"{num_train} + {num_eval} problems requested but only {total} distinct ones exist")
    # Rejection from an i.i.d. stream (rather than random.sample) keeps every prefix the same
    # whatever the requested size; it stays cheap even when nearly all problems are requested.
    rng = random.Random(seed)
    seen: set[int] = set()
    rows = []
    while len(rows) < num_eval + num_train:
        code = rng.randrange(total)
        if code not in seen:
            seen.add(code)
            rows.append(_addition_example(*divmod(code, base)))
    return _rows_to_dataset(rows[num_eval:]), _rows_to_dataset(rows[:num_eval])


def reverse_dataset(num_examples: int, *, seed: int = 0, min_length: int = 32, max_length: int = 64) -> Dataset:
    """String reversal, a task with long completions: prompt "reverse:abc=" and answer "cba".

    Args:
        num_examples: number of rows.
        seed: the rows are a deterministic function of the seed.
        min_length: shortest string (inclusive).
        max_length: longest string (inclusive).

    Returns:
        A Dataset with string columns "prompt" and "answer".
    """
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    prompts, answers = [], []
    for _ in range(num_examples):
        text = "".join(rng.choice(letters) for _ in range(rng.randint(min_length, max_length)))
        prompts.append(f"reverse:{text}=")
        answers.append(text[::-1])
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def char_match_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """Dense reward for the reverse task: per-character agreement, with a penalty for running long.

    With c and a the stripped completion and answer, the reward is

        matches / len(a) - 0.5 * max(0, len(c) - len(a)) / len(a), clipped to [0, 1],

    where matches counts positions i < len(a) with c[i] == a[i]. A too-short completion loses
    the positions it lacks; a too-long one loses half a position per extra character. An exact
    match scores 1.0. An empty answer scores 1.0 for an empty completion and 0.0 otherwise.

    Args:
        completions: decoded completions (strings or conversations), one per row.
        answer: the dataset's "answer" column, aligned with `completions`.
        **kwargs: the other arguments a trainer passes (prompts, completion_ids, columns); unused.
    """
    rewards = []
    for completion, target in zip(completions, answer, strict=True):
        c, a = completion_text(completion).strip(), target.strip()
        if not a:
            rewards.append(float(not c))
            continue
        matches = sum(x == y for x, y in zip(c, a))  # zip stops at the shorter string
        score = (matches - 0.5 * max(0, len(c) - len(a))) / len(a)
        rewards.append(min(1.0, max(0.0, score)))
    return rewards
