"""Built-in reward functions. Each has the reward-function shape the trainer calls:
`f(prompts, completions, completion_ids, **columns) -> list[float]`, taking what it names.
"""

from __future__ import annotations

import re
from typing import Callable


def _normalize(text: str) -> str:
    """Light normalisation: trim, collapse white space, drop a trailing period, lower-case."""
    return re.sub(r"\s+", " ", str(text)).strip().rstrip(".").strip().lower()


def exact_match(completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where the completion equals the `answer` column after light normalisation, else 0.0.

    Example: exact_match(["  42. "], answer=["42"]) == [1.0]. Conversational completions
    (lists of messages) are compared by their last message's content.
    """
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(_normalize(t) == _normalize(a)) for t, a in zip(texts, answer)]


BUILTIN_REWARDS: dict[str, Callable] = {
    "exact_match": exact_match,
}
