"""Rewards that read only the answer after a thinking model's reasoning, found by the `</think>` token id.

`thinking_answer_reward` is the general one (a score of the answer text against the `answer` column);
the GSM8K rewards build on it. It lives apart from `builtins` so that both can import it.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from rloo.data.prompts import render_prompt


def normalize_answer(text: str) -> str:
    """Light normalisation: trim, collapse white space, drop a trailing period, lower-case."""
    return re.sub(r"\s+", " ", str(text)).strip().rstrip(".").strip().lower()


def thinking_answer_reward(tokenizer: Any, think_end_token: str = "</think>", unclosed_reward: float = 0.0,
                           score: Callable[[str, str], float] | None = None,
                           chat_template_kwargs: dict[str, Any] | None = None,
                           think_start_token: str = "<think>") -> Callable[..., list[float]]:
    """A reward that scores only what follows the reasoning, found by the `</think>` token id.

    The id is looked up in `tokenizer` (151668 for Qwen3; no hard-coded ids), and a tokenizer
    without that token is an error here, at construction. For each completion the reward finds
    the *last* `</think>` id in `completion_ids`, decodes the tokens after it as the answer, and
    returns `score(answer_text, answer)` (default: 1.0 on a normalised exact match). A completion
    without a closed think block gets `unclosed_reward`.

    A prompt may close the think block itself: Qwen3's template with `enable_thinking=False` ends the
    prompt with `<think>\n\n</think>`. The reward renders each prompt as the policy saw it (the
    chat template with `chat_template_kwargs`: pass the trainer's `RLOOConfig.chat_template_kwargs`;
    the CLI does) and, when its last think tag is `think_end_token`, a completion without one is all
    answer.

    Example:
        >>> reward = thinking_answer_reward(tokenizer)
        >>> ids = tokenizer("<think>2+2 is 4</think>4", add_special_tokens=False)["input_ids"]
        >>> reward(completion_ids=[ids], answer=["4"])
        [1.0]
    """
    think_end_id = tokenizer.get_vocab().get(think_end_token)
    if think_end_id is None:
        raise ValueError(f"the tokenizer has no {think_end_token!r} token, so thinking_answer_reward cannot find "
                         f"where the reasoning ends. Use a tokenizer with thinking tokens (e.g. Qwen3) or pass "
                         f"think_end_token=<its end-of-reasoning token>.")
    score = score or (lambda text, gold: float(normalize_answer(text) == normalize_answer(gold)))

    def closed_by_prompt(prompt: Any) -> bool:
        """Whether the prompt, rendered as the policy saw it, ends its think block itself."""
        text = render_prompt(prompt, tokenizer, chat_template_kwargs)
        end, start = text.rfind(think_end_token), text.rfind(think_start_token)
        return end >= 0 and end > start

    def thinking_answer(completion_ids: list, answer: list, prompts: list | None = None, **kwargs) -> list[float]:
        rewards = []
        closed = [closed_by_prompt(p) for p in prompts] if prompts is not None else [False] * len(answer)
        for ids, gold, prompt_closed in zip(completion_ids, answer, closed):
            ids = list(ids)
            if think_end_id not in ids and not prompt_closed:
                rewards.append(unclosed_reward)
                continue
            boundary = len(ids) - 1 - ids[::-1].index(think_end_id) if think_end_id in ids else -1  # the last </think>
            text = tokenizer.decode(ids[boundary + 1 :], skip_special_tokens=True)
            rewards.append(float(score(text, gold)))
        return rewards

    thinking_answer.think_end_id = think_end_id
    return thinking_answer
