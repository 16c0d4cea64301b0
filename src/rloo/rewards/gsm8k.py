"""GSM8K rewards: is the final number right, and is it written the way GSM8K writes it ("#### 18").

A completion's answer is read after its last `</think>` (the reasoning is not graded); a completion
that opens `<think>` and never closes it has no answer. In the answer, the number after the last
"####" wins, then the last `\\boxed{...}`, then the last number in the text. The gold answer is a
GSM8K `answer` cell ("... #### 18") or the bare number. Numbers compare as values: "1,000", "$1000"
and "1000.00" are equal.

    gsm8k_accuracy       1.0 / 0.0 for the right number                      (--reward_funcs gsm8k_accuracy)
    gsm8k_format         1.0 where the answer ends with a "#### <number>" line (--reward_funcs gsm8k_format)
    gsm8k_thinking_accuracy(tokenizer)   as gsm8k_accuracy, but finds `</think>` by its token id in
                         `completion_ids` (151668 for Qwen3), for tokenizers that drop the tag on decoding
"""

from __future__ import annotations

import re
from typing import Any, Callable

from rloo.rewards.thinking import thinking_answer_reward

_NUMBER = r"-?\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"  # 1,000 groups thousands; "1,8" is two numbers
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}")
_ANY_NUMBER = re.compile(_NUMBER)
_FORMAT = re.compile(r"(?:^|\n)\s*####\s*" + _NUMBER + r"\s*\.?\s*$")


def _text(completion: Any) -> str:
    """A completion's text: the string, or the last message's content."""
    return completion[-1]["content"] if isinstance(completion, list) else str(completion)


def after_thinking(text: str, think_end: str = "</think>", think_start: str = "<think>") -> str | None:
    """The text after the last `think_end`; the whole text if it never opens `think_start`; None when it
    opens a think block that it never closes (no answer was given)."""
    end = text.rfind(think_end)
    if end >= 0:
        return text[end + len(think_end):]
    return None if think_start in text else text


def to_number(text: str) -> float | None:
    """"$1,000.50" -> 1000.5; None where the text is not a number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def extract_answer(text: str) -> float | None:
    """The final number of an answer: after the last "####", else in the last \\boxed{}, else the last number."""
    for pattern in (_HASHES, _BOXED, _ANY_NUMBER):
        found = pattern.findall(text)
        if found:
            return to_number(found[-1])
    return None


def gold_number(answer: Any) -> float | None:
    """The number a GSM8K `answer` cell ends with ("... #### 18" -> 18.0), or the bare number given."""
    text = str(answer)
    return to_number(text.rsplit("####", 1)[-1].strip()) if "####" in text else to_number(text.strip())


def gsm8k_score(answer_text: str, gold: Any) -> float:
    """1.0 where the answer text's final number equals the gold number, else 0.0."""
    predicted, expected = extract_answer(answer_text), gold_number(gold)
    return float(predicted is not None and expected is not None and abs(predicted - expected) < 1e-6)


def gsm8k_accuracy(completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where the completion's final number (read after its last `</think>`) equals the gold answer.

    Example:
        >>> gsm8k_accuracy(["<think>16-3-4=9, 9*2=18</think> She makes $18.\\n#### 18", "#### 17", "<think>18"],
        ...                answer=["Janet sells 9 eggs ... #### 18"] * 3)
        [1.0, 0.0, 0.0]
    """
    rewards = []
    for completion, gold in zip(completions, answer):
        answer_text = after_thinking(_text(completion))
        rewards.append(0.0 if answer_text is None else gsm8k_score(answer_text, gold))
    return rewards


def gsm8k_format(completions: list, **kwargs) -> list[float]:
    """1.0 where the answer (after any closed think block) ends with a "#### <number>" line, else 0.0.

    Example:
        >>> gsm8k_format(["3 + 2 = 5\\n#### 5", "The answer is 5.", "<think>3+2\\n#### 5"])
        [1.0, 0.0, 0.0]
    """
    rewards = []
    for completion in completions:
        answer_text = after_thinking(_text(completion))
        rewards.append(float(answer_text is not None and bool(_FORMAT.search(answer_text.strip()))))
    return rewards


def gsm8k_thinking_accuracy(tokenizer: Any, think_end_token: str = "</think>",
                            chat_template_kwargs: dict[str, Any] | None = None) -> Callable[..., list[float]]:
    """gsm8k_accuracy for thinking models, reading the answer after the last `</think>` token id (looked up
    in `tokenizer`: 151668 for Qwen3) in `completion_ids`; an unclosed think block scores 0.0. A prompt
    that closes the block itself (Qwen3 with `enable_thinking=False`) makes the whole completion the
    answer. Built on `thinking_answer_reward`.

    Example:
        >>> reward = gsm8k_thinking_accuracy(qwen3_tokenizer)
        >>> ids = qwen3_tokenizer("<think>7*3=21</think>#### 21", add_special_tokens=False)["input_ids"]
        >>> reward(completion_ids=[ids], answer=["21"])
        [1.0]
    """
    reward = thinking_answer_reward(tokenizer, think_end_token=think_end_token, score=gsm8k_score,
                                    chat_template_kwargs=chat_template_kwargs)
    reward.__name__ = "gsm8k_thinking_accuracy"
    return reward
