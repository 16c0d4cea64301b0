"""Tool results as tokens: the chat template renders the NEW tool messages only.

Token in, token out: a trajectory is the prompt's ids, then the ids the sampler drew, then the ids
appended here, then the next turn's sampled ids; no earlier turn is rendered or tokenized again.
Re-rendering the whole conversation each turn would train on ids the model never sampled wherever a
template renders an earlier turn differently from how it was generated (thinking templates drop
earlier `<think>` blocks), or where text re-tokenizes to other ids.

The tool messages' tokens come from a short conversation, `[user, assistant with the calls]` plus the
tool messages and the generation prompt: they are what follows the end-of-turn id that closes the
assistant's turn (e.g. Qwen's "\\n", `<|im_start|>user\\n<tool_response>...`), the sampled turn
already ending there. That turn is found by counting end-of-turn ids, not by comparing renderings:
templates such as Qwen3's render the last assistant turn with an empty `<think></think>` block and an
earlier one without, which changes that turn's ids but not where it ends or what follows it.
"""

from __future__ import annotations

from typing import Any

from rloo.config import ConfigError
from rloo.tools import formats
from rloo.tools.formats import CallFormat

_NAME, _KEY, _VALUE, _CONTENT = "tool_name_7c1e", "tool_key_3f9a", "tool_value_5b2d", "tool_content_9e4f"


def _render(tokenizer: Any, messages: list[dict], tokenize: bool, add_generation_prompt: bool,
            chat_template_kwargs: dict[str, Any] | None) -> Any:
    return tokenizer.apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=add_generation_prompt,
                                         return_dict=False, **(chat_template_kwargs or {}))


def _exchange(name: str, arguments: dict) -> list[dict]:
    calls = [{"type": "function", "function": {"name": name, "arguments": arguments}}]
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": calls}]


def tool_suffix_ids(tokenizer: Any, tool_messages: list[dict[str, Any]], end_ids: set[int],
                    chat_template_kwargs: dict[str, Any] | None = None, end_opens_next: bool = False) -> list[int]:
    """The token ids that follow a sampled assistant turn (ending in one of `end_ids`): its tool
    messages, then the generation prompt of the next assistant turn. `end_opens_next`: the id the turn ends with is
    the first token of the tool message (GLM-4's `<|observation|>`: `call_turn_ending`), so it is not repeated."""
    exchange = _exchange(tool_messages[0]["name"], {})  # the real name: some templates head the result with it
    before = _render(tokenizer, exchange, True, False, chat_template_kwargs)
    after = _render(tokenizer, exchange + tool_messages, True, True, chat_template_kwargs)
    before_ends = [i for i, token in enumerate(before) if token in end_ids]
    after_ends = [i for i, token in enumerate(after) if token in end_ids]
    # The user's turn and the assistant's each end in an end-of-turn id; the assistant's is the last in `before`.
    # Where the end-of-turn id opens the next message instead, the tool message's is the first after `before`'s.
    wanted = len(before_ends) + 1 if end_opens_next else len(before_ends)
    if not before_ends or len(after_ends) < wanted or before[: before_ends[0] + 1] != after[: before_ends[0] + 1]:
        raise ValueError("the chat template does not end the user's and the assistant's turns with the end-of-turn "
                         "token the same way once tool messages follow, so the tool messages' tokens cannot be told "
                         "apart from the assistant's turn; use a template that ends every message with the tokenizer's "
                         "eos token (check_tool_template refuses such templates up front).")
    return after[after_ends[wanted - 1] + 1:]


def check_tool_template(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None,
                        end_ids: set[int] | None = None) -> None:
    """Refuse, before training, a chat template that cannot carry a tool conversation: one that drops the
    assistant's tool calls or the tool messages, fails on the role `tool`, or does not end the assistant's
    turn with one of `end_ids` (default: the eos token) before the tool messages (then results cannot be
    appended as tokens)."""
    _check_renders_tools(tokenizer, chat_template_kwargs)
    _check_suffix(tokenizer, chat_template_kwargs, end_ids or {tokenizer.eos_token_id})


def prepare_tool_calls(tokenizer: Any, schemas: dict[Any, list[dict[str, Any]]], stop_ids: set[int],
                       chat_template_kwargs: dict[str, Any] | None = None) -> CallFormat:
    """Before training: the format the model's calls are parsed in (`tools.formats`; `schemas`: each environment's
    tool schemas), after checking that the chat template renders a tool conversation, ends a call turn with a token
    generation stops at (`call_turn_end`) and lets tool results follow it as tokens; ConfigError naming the family
    and the problem otherwise."""
    _check_renders_tools(tokenizer, chat_template_kwargs)
    call_format = formats.call_format(tokenizer, [s for group in schemas.values() for s in group], chat_template_kwargs)
    _, call_format.end_opens_next = call_turn_ending(tokenizer, stop_ids, chat_template_kwargs)
    _check_suffix(tokenizer, chat_template_kwargs, stop_ids, call_format.end_opens_next)
    return call_format


def _check_renders_tools(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("tools need a chat template that renders tool calls and tool messages, and the tokenizer has "
                          "none. Set tokenizer.chat_template (e.g. the model's instruct template), or train without tools.")
    messages = _exchange(_NAME, {_KEY: _VALUE}) + [{"role": "tool", "name": _NAME, "content": _CONTENT}]
    try:
        text = _render(tokenizer, messages, False, False, chat_template_kwargs)
    except Exception as error:  # jinja2's TemplateError and its subclasses, or a template's raise_exception
        raise ConfigError(f"the chat template cannot render a tool conversation (user, assistant with tool_calls, "
                          f"tool): {error}. Use the model's tool-calling template.") from error
    missing = [part for part in (_NAME, _KEY, _VALUE, _CONTENT) if part not in text]
    if missing:
        raise ConfigError(f"the chat template ({formats.template_family(tokenizer)}) drops part of a tool conversation "
                          f"({len(missing)} of the tool name, "
                          f"argument key, argument value and tool result are missing from its rendering), so the model "
                          f"would never see its calls or their results. Use a template that renders `tool_calls` and "
                          f"role 'tool' messages (e.g. a Hermes / Qwen-style template).")


def _check_suffix(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None, end_ids: set[int],
                  end_opens_next: bool = False) -> None:
    messages = _exchange(_NAME, {_KEY: _VALUE}) + [{"role": "tool", "name": _NAME, "content": _CONTENT}]
    try:
        suffix = tool_suffix_ids(tokenizer, messages[2:], end_ids, chat_template_kwargs, end_opens_next)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if _CONTENT not in tokenizer.decode(suffix):
        raise ConfigError("the chat template's tokens after the assistant's turn do not hold the tool result (the "
                          "turn does not end where its end-of-turn token says), so results cannot be appended as "
                          "tokens; use a template that ends every message with an end-of-turn token.")


def call_turn_end(tokenizer: Any, stop_ids: set[int], chat_template_kwargs: dict[str, Any] | None = None) -> int:
    """The id a sampled assistant turn that makes tool calls ends with (`call_turn_ending`)."""
    return call_turn_ending(tokenizer, stop_ids, chat_template_kwargs)[0]


def call_turn_ending(tokenizer: Any, stop_ids: set[int],
                     chat_template_kwargs: dict[str, Any] | None = None) -> tuple[int, bool]:
    """(the id that ends an assistant turn making tool calls, whether that id opens the next message), read from the
    chat template: the added token its rendering of such a turn ends with (`<|im_end|>`, `<|eot_id|>`, GPT-OSS's
    `<|call|>`, ...), else the one the tool message then begins with (GLM-4's `<|observation|>`: its turns have no end
    token of their own, and generation stops at the next message's first token). It must be one of `stop_ids`, the
    ids generation stops at, or the sampled turn could never end where the template ends it."""
    turn = formats.rendered_call_turn(tokenizer, chat_template_kwargs).rstrip()
    vocabulary = tokenizer.get_added_vocab()
    added = {text: index for text, index in vocabulary.items() if turn.endswith(text)}
    if not added:
        raise ConfigError(f"the chat template ({formats.template_family(tokenizer)}) ends an assistant turn that makes tool "
                          f"calls with {turn[-40:]!r}, not with a token of its own, so the turn's end cannot be told "
                          f"from its text; tool results can be appended as tokens only after an end-of-turn token.")
    text, index = max(added.items(), key=lambda item: len(item[0]))
    if index in stop_ids:
        return index, False
    following = _next_message_start(tokenizer, chat_template_kwargs)
    opening = {t: i for t, i in vocabulary.items() if following.startswith(t) and i in stop_ids}
    if opening:
        return max(opening.items(), key=lambda item: len(item[0]))[1], True
    names = sorted(tokenizer.convert_ids_to_tokens(sorted(stop_ids)))
    raise ConfigError(f"the chat template ({formats.template_family(tokenizer)}) ends an assistant turn that makes tool "
                      f"calls with {text!r} (id {index}), and generation does not stop there (it stops at "
                      f"{names}), nor at the token the tool message begins with, so a turn would run past its calls. "
                      f"To stop there, add it to RLOOConfig(stop_token_ids=[{index}]).")


def _next_message_start(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> str:
    """The text the chat template puts right after an assistant turn making calls when a tool message follows."""
    exchange = _exchange(_NAME, {_KEY: _VALUE})
    turn = _render(tokenizer, exchange, False, False, chat_template_kwargs)
    whole = _render(tokenizer, exchange + [{"role": "tool", "name": _NAME, "content": _CONTENT}], False, False,
                    chat_template_kwargs)
    return whole[len(turn):].lstrip() if whole.startswith(turn) else ""
