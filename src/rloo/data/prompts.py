"""Prompts, standard and conversational: checking a dataset, rendering, tokenizing, truncating.

A standard row is `{"prompt": "2+2=", ...}`; a conversational row is
`{"prompt": [{"role": "user", "content": "2+2="}], ...}`. Conversational prompts are rendered by
the tokenizer's chat template with `add_generation_prompt=True` (plus `chat_template_kwargs`, e.g.
`{"enable_thinking": False}`), and their completions reach reward functions as messages,
`[{"role": "assistant", "content": text}]`, as in TRL.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from rloo.config import ConfigError

logger = logging.getLogger(__name__)

# Keyword arguments the trainer passes to reward functions; a dataset column may not reuse them.
RESERVED_REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state")
# Roles chat templates know; another role is a typo that templates drop or render oddly.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def is_conversational(prompt: Any) -> bool:
    """Whether `prompt` is a list of {"role", "content"} messages."""
    return isinstance(prompt, list) and len(prompt) > 0 and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def render_prompt(prompt: Any, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The text the policy sees: the prompt itself, or the conversation through the chat template."""
    if is_conversational(prompt):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
    return prompt


def as_completions(prompts: list, texts: list[str]) -> list:
    """Completions as reward functions receive them: strings, or assistant messages for conversations."""
    return [[{"role": "assistant", "content": text}] if is_conversational(prompt) else text
            for prompt, text in zip(prompts, texts)]


def check_prompt_dataset(dataset: Any, name: str) -> None:
    """Fail early on a dataset the trainer cannot use: empty, no prompt column, a column named like an
    argument the trainer passes to reward functions, or a malformed prompt."""
    if "prompt" not in dataset.column_names:
        raise ConfigError(f"{name} has no 'prompt' column (columns: {dataset.column_names}); rename your prompt "
                         f"column to 'prompt'.")
    reserved = [column for column in RESERVED_REWARD_ARGUMENTS if column in dataset.column_names]
    if reserved:
        raise ValueError(f"{name} has a column named {reserved[0]!r}, a name the trainer itself passes to reward "
                         f"functions (reserved: {', '.join(RESERVED_REWARD_ARGUMENTS)}); it would be silently replaced. "
                         f"Rename the column, e.g. dataset.rename_column({reserved[0]!r}, 'reference_{reserved[0]}').")
    if len(dataset) == 0:
        raise ConfigError(f"{name} is empty.")
    for index, prompt in enumerate(dataset["prompt"]):
        if not (isinstance(prompt, str) or is_conversational(prompt)):
            raise ConfigError(f"{name} row {index}: 'prompt' must be a string or a list of {{'role', 'content'}} "
                             f"messages, got {type(prompt).__name__}: {str(prompt)[:100]!r}.")
        _check_prompt_text(prompt, name, index)


def _check_prompt_text(prompt: Any, name: str, index: int) -> None:
    """A prompt has text, and each chat message a known role and string content."""
    if isinstance(prompt, str):
        if not prompt:
            raise ConfigError(f"{name} row {index}: the prompt is an empty string; the model needs at least one "
                              f"token to continue. Drop the row or give it text.")
        return
    for position, message in enumerate(prompt):
        if message["role"] not in CHAT_ROLES:
            raise ConfigError(f"{name} row {index}, message {position}: unknown role {message['role']!r}; a chat "
                              f"message's role is one of {CHAT_ROLES}.")
        if not isinstance(message["content"], str) and not _is_content_parts(message["content"]):
            raise ConfigError(f"{name} row {index}, message {position}: 'content' is "
                              f"{type(message['content']).__name__}, not a string or a list of {{'type': 'text' | 'image'}} "
                              f"parts; give every message its text.")


def _is_content_parts(content: Any) -> bool:
    """Multimodal content: a list of {"type": "text", "text": ...} and {"type": "image"[, "image": ...]} parts."""
    return isinstance(content, list) and all(isinstance(part, dict) and part.get("type") in ("text", "image")
                                             for part in content)


def check_vocabulary(tokenizer: Any, model: Any) -> None:
    """The model has an embedding row for every token id the tokenizer can produce."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows, so "
                          f"some token ids have no embedding. Use the tokenizer saved with this model, or call "
                          f"model.resize_token_embeddings(len(tokenizer)) before training.")


def tokenize_prompts(prompts: list, tokenizer: Any, max_length: int | None,
                     chat_template_kwargs: dict[str, Any] | None = None) -> list[list[int]]:
    """Token ids of each rendered prompt, keeping the last `max_length` (the question is usually at the end;
    None keeps every token, the default: max_prompt_length is an opt-in).

    Standard prompts get the tokenizer's default special tokens (e.g. BOS); chat-templated ones get none added.
    """
    rendered = _rendered_token_ids(prompts, tokenizer, chat_template_kwargs)
    return rendered if max_length is None else [ids[-max_length:] for ids in rendered]


def fit_prompt_lengths(ids: list[list[int]], max_length: int | None, policy: str,
                       describe: Callable[[int], str]) -> tuple[list[list[int]], int]:
    """Prompts as the policy sees them at sampling time (tool schemas and an environment's reset text included)
    held to `max_length`: "error" raises naming the first long row (`describe(index)`), "left" keeps the last
    `max_length` tokens. Returns (the ids, how many rows were cut), so that the caller can warn; None: no limit."""
    too_long = [i for i, row in enumerate(ids) if max_length is not None and len(row) > max_length]
    if not too_long:
        return ids, 0
    first = too_long[0]
    if policy == "error":
        raise ConfigError(f"{describe(first)} is {len(ids[first])} tokens as the model sees it (with the tool schemas "
                          f"and the environment's reset() text), more than max_prompt_length={max_length} "
                          f"({len(too_long)} of {len(ids)} prompts of this batch). Raise max_prompt_length, or leave it "
                          f"None (no limit), or set truncate_prompts='left' to keep the last {max_length} tokens "
                          f"(which drops the system message and the tool schemas first).")
    return [row[-max_length:] for row in ids], len(too_long)


def _rendered_token_ids(prompts: list, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> list[list[int]]:
    """Untruncated token ids of each prompt as the policy sees it.

    A standard (string) prompt is tokenized as the tokenizer does by default, special tokens
    included, as TRL does: Llama, Mistral and Gemma prompts keep their BOS. A conversational
    prompt is rendered by the chat template, which writes its own BOS, so nothing is added to it
    (adding would give two).
    """
    texts = [render_prompt(p, tokenizer, chat_template_kwargs) for p in prompts]
    chat = [is_conversational(p) for p in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    for templated in (False, True):
        rows = [i for i, flag in enumerate(chat) if flag == templated]
        if rows:
            encoded = tokenizer([texts[i] for i in rows], add_special_tokens=not templated)["input_ids"]
            for i, row_ids in zip(rows, encoded):
                ids[i] = row_ids
    return ids


_LENGTH_CHUNK = 256  # prompts per tokenizer call when measuring lengths


def check_prompt_lengths(dataset: Any, name: str, tokenizer: Any, max_length: int | None, policy: str,
                         chat_template_kwargs: dict[str, Any] | None = None) -> None:
    """Refuse rows that render to no tokens; with `max_length` set, apply `truncate_prompts` up front: warn once
    with the count ("left") or reject the first long row ("error")."""
    if any(column in dataset.column_names for column in ("image", "images")):
        return  # rendered with their images by the processor at sampling time, and refused there when too long
    prompts = list(dataset["prompt"])
    # In chunks: one tokenizer call on a whole dataset holds every row's encoding (offsets, masks) at once, and
    # the allocator keeps that memory after it is freed (139 MB of RSS for GSM8K's 7,473 rows).
    lengths = [len(ids) for start in range(0, len(prompts), _LENGTH_CHUNK)
               for ids in _rendered_token_ids(prompts[start:start + _LENGTH_CHUNK], tokenizer, chat_template_kwargs)]
    empty = [index for index, length in enumerate(lengths) if length == 0]
    if empty:
        raise ConfigError(f"{name} row {empty[0]} renders to no tokens ({len(empty)} such rows); the model needs at "
                          f"least one prompt token. Drop those rows or give them text.")
    too_long = [index for index, length in enumerate(lengths) if max_length is not None and length > max_length]
    if not too_long:
        return
    first = too_long[0]
    if policy == "error":
        raise ConfigError(
            f"{name} row {first} has a prompt of {lengths[first]} tokens, more than max_prompt_length={max_length} "
            f"({len(too_long)} rows are too long). Raise max_prompt_length, shorten the prompts, or set "
            f"truncate_prompts='left' to keep their last {max_length} tokens."
        )
    logger.warning("%d of %d prompts in %s are longer than max_prompt_length=%d tokens (row %d has %d); they are "
                   "truncated from the left, keeping their end.", len(too_long), len(lengths), name, max_length,
                   first, lengths[first])
