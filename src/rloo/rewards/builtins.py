"""Built-in reward functions. Each has the reward-function shape the trainer calls:
`f(prompts, completions, completion_ids, **columns) -> list[float | None]`, taking what it names.

Completions are strings for standard prompts and `[{"role": "assistant", "content": text}]` for
conversational ones; every built-in accepts both. `BUILTIN_REWARDS` holds the ready-made functions
(`--reward_funcs exact_match`); `BUILTIN_REWARD_FACTORIES` the ones configured with arguments
(`--reward_funcs length_penalty:target_length=128`; see `rloo.cli.rewards.resolve_reward_func`).
"""

from __future__ import annotations

import concurrent.futures
import re
from typing import Any, Callable, Sequence

from rloo.rewards.gsm8k import gsm8k_accuracy, gsm8k_format, gsm8k_thinking_accuracy
from rloo.rewards.sandbox import run_tests
from rloo.rewards.thinking import normalize_answer, thinking_answer_reward


def completion_text(completion: Any) -> str:
    """The text of a completion: the string itself, or the last message's content."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def exact_match(completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where the completion equals the `answer` column after light normalisation, else 0.0.

    Normalisation trims, collapses white space, drops a trailing period and lower-cases.

    Example: exact_match(["  42. "], answer=["42"]) == [1.0]. Conversational completions
    (lists of messages) are compared by their last message's content.
    """
    return [float(normalize_answer(completion_text(c)) == normalize_answer(a)) for c, a in zip(completions, answer)]


def math_accuracy(completions: list, answer: list, **kwargs) -> list[float | None]:
    """1.0 where math-verify finds the completion's answer equal to the `answer` column, else 0.0.

    The completion's answer is its last `\\boxed{...}` or, failing that, a LaTeX or plain
    expression math-verify can parse; equivalent forms match (`\\frac{1}{2}` and `0.5`).
    A gold answer that math-verify cannot parse gives None: the row is not scored by this
    function rather than punished.

    Example: math_accuracy(["so the result is \\\\boxed{\\\\frac{1}{2}}"], answer=["0.5"]) == [1.0]
    """
    from math_verify import parse, verify

    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer):
        gold_parsed = parse(str(gold))
        if not gold_parsed:
            rewards.append(None)
            continue
        rewards.append(float(verify(gold_parsed, parse(completion_text(completion)))))
    return rewards


_THINK_FORMAT = re.compile(r"^\s*<think>(?:(?!<think>|</think>).)*</think>\s*\S", re.DOTALL)


def think_format(completions: list, **kwargs) -> list[float]:
    """1.0 where the completion opens with one well-formed `<think>...</think>` block followed by an answer.

    The tags must survive decoding: with a tokenizer that treats them as special tokens (which
    `skip_special_tokens=True` drops), use `thinking_answer_reward`, which reads token ids.

    Example: think_format(["<think>2+2 is 4</think> 4", "4", "<think>no end"]) == [1.0, 0.0, 0.0]
    """
    return [float(bool(_THINK_FORMAT.match(completion_text(c)))) for c in completions]


def length_penalty(target_length: int, scale: float | None = None) -> Callable[..., list[float]]:
    """A reward of -|tokens - target_length| / scale: 0 at the target, falling linearly either side.

    Lengths count `completion_ids` (tokens, the EOS included when sampled). `scale` defaults to
    `target_length`, so a completion twice too long scores -1. Weigh it against a correctness
    reward with `reward_weights`.

    Example:
        >>> length_penalty(target_length=4)(completion_ids=[[1, 2, 3, 4], [1, 2]])
        [0.0, -0.5]
    """
    if not isinstance(target_length, int) or target_length < 1:
        raise ValueError(f"length_penalty needs a positive integer target_length, got {target_length!r}.")
    scale = float(scale if scale is not None else target_length)

    def length_penalty_reward(completion_ids: list, **kwargs) -> list[float]:
        return [-abs(len(ids) - target_length) / scale for ids in completion_ids]

    return length_penalty_reward


def overlong_penalty(max_completion_length: int, overlong_buffer: int) -> Callable[..., list[float]]:
    """DAPO's soft overlong punishment: 0 up to max_completion_length - overlong_buffer tokens, then
    falling linearly to -1 at max_completion_length (and -1 beyond).

    With L the completion's length in tokens (`completion_ids`, the EOS included when sampled) and
    free = max_completion_length - overlong_buffer, the reward is min(0, (free - L) / overlong_buffer)
    clipped at -1. Add it beside a correctness reward; `mask_truncated_completions` is the other
    way to handle completions that hit the limit (they leave the loss instead).

    Example:
        >>> overlong_penalty(max_completion_length=10, overlong_buffer=4)(completion_ids=[[0] * 6, [0] * 8, [0] * 10])
        [0.0, -0.5, -1.0]
    """
    if not isinstance(overlong_buffer, int) or not isinstance(max_completion_length, int) or not (
            0 < overlong_buffer < max_completion_length):
        raise ValueError(f"overlong_penalty needs integers 0 < overlong_buffer < max_completion_length, got "
                         f"overlong_buffer={overlong_buffer!r}, max_completion_length={max_completion_length!r}.")
    free = max_completion_length - overlong_buffer

    def overlong_penalty_reward(completion_ids: list, **kwargs) -> list[float]:
        return [max(-1.0, min(0.0, (free - len(ids)) / overlong_buffer)) for ids in completion_ids]

    return overlong_penalty_reward


_CODE_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The code of a completion: its ```python fenced blocks joined, or the whole text if it has none."""
    blocks = _CODE_FENCE.findall(text)
    return "\n\n".join(blocks) if blocks else text


def _as_test_list(tests: Any) -> list[str]:
    """A `tests` cell as a list of snippets: a list as it is, a string as one test per non-empty line."""
    if isinstance(tests, str):
        return [line for line in tests.splitlines() if line.strip()]
    return [str(test) for test in tests]


def code_execution(completions: list, tests: list, timeout_s: float = 5.0, memory_mb: int = 512,
                   allow_unisolated: bool = False, allow_missing: Sequence[str] = (), **kwargs) -> list[float]:
    """The fraction of the row's `tests` that the completion's code passes, run in a sandboxed process.

    The code is the completion's ```python blocks (or the whole completion); `tests` is a list
    of snippets such as `assert add(2, 3) == 5`, or a string with one per line. Each completion
    runs in its own isolated process (namespaces and/or Landlock; see `rloo.rewards.sandbox` and
    docs/rewards.md for what is enforced and what is not) with a wall-clock timeout, memory, file
    size and process limits, no network and no writes outside a temporary directory; the trainer,
    not the child, decides each assertion, so the reward is at most 1.0. A completion that hangs,
    exhausts memory, or breaks those rules fails the affected tests and training goes on. Rows
    without tests get None (not scored). Where the namespaces layer cannot be set up it raises
    `SandboxUnavailable` unless `allow_missing` names it (or RLOO_SANDBOX_ALLOW_MISSING=namespaces, or
    RLOOConfig.sandbox_allow_missing); where the machine can isolate nothing, unless `allow_unisolated=True`
    (or RLOO_SANDBOX_ALLOW_UNISOLATED=1).

    Example:
        >>> code_execution(["```python\\ndef add(a, b):\\n    return a + b\\n```"],
        ...                tests=[["assert add(2, 3) == 5", "assert add(0, 0) == 1"]])
        [0.5]
    """
    def score(completion: Any, row_tests: Any) -> float | None:
        snippets = _as_test_list(row_tests) if row_tests is not None else []
        if not snippets:
            return None
        return run_tests(extract_code(completion_text(completion)), snippets, timeout_s, memory_mb,
                         allow_unisolated=allow_unisolated, allow_missing=allow_missing).fraction

    # Each run waits on its own process, so threads overlap them.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(score, completions, tests))


code_execution.uses_code_sandbox = True  # rloo train checks and prints the sandbox's layers at start

BUILTIN_REWARDS: dict[str, Callable] = {
    "exact_match": exact_match,
    "math_accuracy": math_accuracy,
    "think_format": think_format,
    "code_execution": code_execution,
    "gsm8k_accuracy": gsm8k_accuracy,
    "gsm8k_format": gsm8k_format,
}

# Built-ins configured with arguments; a `tokenizer` argument receives the policy's tokenizer.
BUILTIN_REWARD_FACTORIES: dict[str, Callable[..., Callable]] = {
    "length_penalty": length_penalty,
    "overlong_penalty": overlong_penalty,
    "thinking_answer_reward": thinking_answer_reward,
    "gsm8k_thinking_accuracy": gsm8k_thinking_accuracy,
}
