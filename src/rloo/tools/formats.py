"""Tool calls in every format rloo reads: one parser per model family, chosen by what the chat template renders.

A model writes its calls the way its chat template renders them, and that differs by family:

| format | families | a call as the model writes it |
|---|---|---|
| `hermes` | Hermes, Qwen2.5, Qwen3, SmolLM2 (recipes) | `<tool_call>{"name": "add", "arguments": {"a": 7}}</tool_call>` |
| `qwen-xml` | Qwen3.5, Qwen3.6, Nemotron 3 | `<tool_call><function=add><parameter=a>7</parameter></function></tool_call>` |
| `llama3-json` | Llama 3.1, 3.2, 3.3 | `{"name": "add", "parameters": {"a": 7}}` (the whole turn) |
| `glm-xml` | GLM-4.5 / 4.6 (MoE) | `<tool_call>add<arg_key>a</arg_key><arg_value>7</arg_value></tool_call>` |
| `pythonic` | LFM2, LFM2.5 | `<\\|tool_call_start\\|>[add(a=7)]<\\|tool_call_end\\|>` |
| `harmony` | GPT-OSS | `to=functions.add<\\|channel\\|>commentary json<\\|message\\|>{"a": 7}<\\|call\\|>` |
| `gemma4` | Gemma 4 | `<\\|tool_call>call:add{a:7}<tool_call\\|>` |
| `transformers` | any tokenizer carrying a `response_template` / `response_schema` | the tokenizer's own `parse_response` |

`call_format(tokenizer, ...)` picks the format the way a model would learn it: it renders a call through the chat
template and takes the first parser that reads that very call back (name and arguments); a tokenizer that carries a
response schema is parsed by transformers instead. A template none of them reads is refused at construction, with
its family named where rloo knows it (`FAMILY_MARKERS`), never read as plain text. The formats' facts (markers,
key names, value encodings) follow TRL 1.16's response schemas and each family's published chat template.

Arguments are typed by the tool's JSON schema (`cast_arguments`): formats that write values as raw text (the XML
ones) give strings, and `"7"` becomes 7 for an integer parameter while `"75001"` stays a string for a string one.
A call that is there but cannot be used (bad JSON, no name, never closed) is a `ToolCall` with an `error`, which
the model reads as a tool error on its next turn.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from rloo.config import ConfigError
from rloo.tools.parsing import ToolCall, parse_tool_calls

Parser = Callable[[str], "tuple[str, list[ToolCall]]"]


# ------------------------------------------------------------------ the parsers: text -> (content, calls)


def _blocks(text: str, open_: str, close: str, body: Callable[[str], ToolCall]) -> tuple[str, list[ToolCall]]:
    """Every `open_ ... close` block (an unclosed last one included) parsed by `body`; the text outside them."""
    pattern = re.compile(re.escape(open_) + r"(.*?)(?:" + re.escape(close) + r"|$)", re.S)
    calls = [body(match.group(1)) if match.group(0).endswith(close) else
             ToolCall("", error=f"the tool call was not closed with {close}") for match in pattern.finditer(text)]
    return pattern.sub("", text).strip(), calls


_XML_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)(?:</function>\s*)?$", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _qwen_xml_call(body: str) -> ToolCall:
    match = _XML_FUNCTION.match(body)
    if match is None:
        return ToolCall("", error="the tool call has no <function=name> block (expected <tool_call><function=name>"
                                  "<parameter=key>value</parameter></function></tool_call>)")
    return ToolCall(match.group(1).strip(), {key.strip(): value for key, value in _XML_PARAMETER.findall(match.group(2))})


def parse_qwen_xml(text: str) -> tuple[str, list[ToolCall]]:
    return _blocks(text, "<tool_call>", "</tool_call>", _qwen_xml_call)


_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _glm_call(body: str) -> ToolCall:
    name = body.split("<arg_key>", 1)[0].strip()
    if not name:
        return ToolCall("", error="the tool call has no name (expected <tool_call>name<arg_key>...)")
    return ToolCall(name, {key.strip(): value for key, value in _GLM_ARGUMENT.findall(body)})


def parse_glm_xml(text: str) -> tuple[str, list[ToolCall]]:
    return _blocks(text, "<tool_call>", "</tool_call>", _glm_call)


def parse_llama3_json(text: str) -> tuple[str, list[ToolCall]]:
    """A turn that is one JSON object with "name" and "parameters" (or "arguments") is a call; any other is text."""
    body = text.replace("<|python_tag|>", "").strip()
    if not re.match(r'^\{\s*"name"\s*:', body):
        return text.strip(), []
    try:
        payload, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as error:
        return "", [ToolCall("", error=f"the tool call is not valid JSON ({error.msg} at character {error.pos})")]
    arguments = payload.get("parameters", payload.get("arguments", {})) if isinstance(payload, dict) else None
    if not isinstance(payload.get("name") if isinstance(payload, dict) else None, str):
        return "", [ToolCall("", error='the tool call has no "name" (expected {"name": ..., "parameters": {...}})')]
    if not isinstance(arguments, dict):
        return "", [ToolCall(payload["name"], error='the tool call\'s "parameters" is not a JSON object')]
    return body[end:].strip(), [ToolCall(payload["name"], arguments)]


def _pythonic_calls(body: str) -> list[ToolCall]:
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except SyntaxError as error:
        return [ToolCall("", error=f"the tool calls are not a Python list of calls ({error.msg})")]
    calls = []
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            calls.append(ToolCall("", error="expected a call such as name(key=value)"))
            continue
        try:
            calls.append(ToolCall(node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}))
        except ValueError:
            calls.append(ToolCall(node.func.id, error="an argument is not a literal value"))
    return calls


def parse_pythonic(text: str) -> tuple[str, list[ToolCall]]:
    pattern = re.compile(r"<\|tool_call_start\|>(.*?)(<\|tool_call_end\|>|$)", re.S)
    calls: list[ToolCall] = []
    for match in pattern.finditer(text):
        calls += _pythonic_calls(match.group(1)) if match.group(2) else [
            ToolCall("", error="the tool call was not closed with <|tool_call_end|>")]
    return pattern.sub("", text).strip(), calls


_HARMONY = re.compile(r"to=functions\.([^\s<]+)[^<]*<\|channel\|>[^<]*<\|message\|>(.*?)(<\|call\|>|$)", re.S)


def parse_harmony(text: str) -> tuple[str, list[ToolCall]]:
    calls = []
    for name, body, closed in _HARMONY.findall(text):
        try:
            arguments = json.loads(body) if closed else None
        except json.JSONDecodeError as error:
            calls.append(ToolCall(name, error=f"the arguments are not valid JSON ({error.msg})"))
            continue
        calls.append(ToolCall(name, arguments) if isinstance(arguments, dict) else
                     ToolCall(name, error="the tool call's arguments are not a closed JSON object"))
    content = re.sub(r"<\|[a-z]+\|>", " ", _HARMONY.sub("", text)).strip()
    return content, calls


_GEMMA_CALL = re.compile(r"<\|tool_call>call:(\w+)(\{.*?\})?(<tool_call\|>|$)", re.S)


def _gemma_json(body: str) -> Any:
    """Gemma 4's argument object (bare keys, strings between <|"|> marks) as JSON."""
    parts = body.split('<|"|>')
    for i in range(0, len(parts), 2):  # outside the strings: quote the bare keys
        parts[i] = re.sub(r"([{,]\s*)([A-Za-z_]\w*)\s*:", r'\1"\2":', parts[i])
    for i in range(1, len(parts), 2):
        parts[i] = json.dumps(parts[i])
    return json.loads("".join(parts))


def parse_gemma4(text: str) -> tuple[str, list[ToolCall]]:
    calls = []
    for name, body, closed in _GEMMA_CALL.findall(text):
        try:
            calls.append(ToolCall(name, _gemma_json(body or "{}")) if closed else
                         ToolCall(name, error="the tool call was not closed with <tool_call|>"))
        except json.JSONDecodeError as error:
            calls.append(ToolCall(name, error=f"the arguments do not parse ({error.msg})"))
    return _GEMMA_CALL.sub("", text).strip(), calls


FORMATS: dict[str, Parser] = {
    "hermes": parse_tool_calls, "qwen-xml": parse_qwen_xml, "llama3-json": parse_llama3_json,
    "glm-xml": parse_glm_xml, "pythonic": parse_pythonic, "harmony": parse_harmony, "gemma4": parse_gemma4,
}

# Text in a chat template that names its family, for messages (checked in order; the first found names it).
FAMILY_MARKERS = (
    ("<｜Assistant｜>", "DeepSeek-R1 (distill) / DeepSeek-V3"), ("<|turn>", "Gemma 4"),
    ("<start_of_turn>", "Gemma 2/3"), ("<|channel|>", "GPT-OSS"), ("<arg_key>", "GLM-4"),
    ("<|tool_call_start|>", "LFM2"), ("<function=", "Qwen3.5 / Qwen3.6 / Nemotron 3"),
    ("<|start_header_id|>", "Llama 3"), ("<|START_OF_TURN_TOKEN|>", "Cohere Command"), ("[INST]", "Mistral"),
    ("<|user|>", "Phi-3 / GLM"), ("<|im_start|>", "ChatML (Qwen, SmolLM, Hermes)"),
)


def template_family(tokenizer: Any) -> str:
    """The family the chat template belongs to, as far as FAMILY_MARKERS tell, or "an unknown family"."""
    template = getattr(tokenizer, "chat_template", None) or ""
    template = template if isinstance(template, str) else " ".join(template.values())
    return next((family for marker, family in FAMILY_MARKERS if marker in template), "an unknown family")


# ------------------------------------------------------------------ typing arguments by the tool's schema


def cast_arguments(arguments: dict[str, Any], parameters: dict[str, Any] | None) -> dict[str, Any]:
    """String values typed by the tool's JSON-schema `parameters` (integer, number, boolean, array, object, null);
    a value that does not convert, or a parameter without a type, is left as it is."""
    properties = (parameters or {}).get("properties", {})
    return {key: _cast(value, properties.get(key, {}).get("type")) for key, value in arguments.items()}


def _cast(value: Any, kind: Any) -> Any:
    if not isinstance(value, str) or kind in (None, "string") or (isinstance(kind, list) and "string" in kind):
        return value
    try:
        parsed = json.loads(value.strip())
    except json.JSONDecodeError:
        return value
    kinds = kind if isinstance(kind, list) else [kind]
    python = {"integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict,
              "null": type(None)}
    matches = [k for k in kinds if k in python and isinstance(parsed, python[k])]
    if not matches or (isinstance(parsed, bool) and "boolean" not in matches):
        return value
    return parsed


# ------------------------------------------------------------------ choosing the format


@dataclass
class CallFormat:
    """The format a model's turns are parsed in; `parse(text)` takes the turn decoded with its special tokens."""

    name: str
    parser: Parser
    parameters: dict[str, dict[str, Any]]  # each tool's JSON-schema parameters, by name
    special_tokens: tuple[str, ...] = ()  # removed from the content (the turn's end, channel markers)
    end_opens_next: bool = False  # the turn's end id is the next message's first token (GLM-4's <|observation|>)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        content, calls = self.parser(text)
        for token in self.special_tokens:
            content = content.replace(token, "")
        for call in calls:
            if call.error is None:
                call.arguments = cast_arguments(call.arguments, self.parameters.get(call.name))
        return content.strip(), calls


def transformers_parser(tokenizer: Any, schemas: list[dict[str, Any]],
                        chat_template_kwargs: dict[str, Any] | None = None) -> Parser:
    """The tokenizer's own response parsing (transformers' `parse_response`, arguments typed by `schemas`), given
    the generation prompt as the `prefix` the turn follows (templates pre-write part of the turn, e.g. `<think>`)."""
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True,
                                           **(chat_template_kwargs or {}))

    def parse(text: str) -> tuple[str, list[ToolCall]]:
        try:
            message = tokenizer.parse_response(text, prefix=prefix, tools=schemas or None)
        except Exception as error:  # a turn the schema does not match is a failed call, not a crash
            return text, [ToolCall("", error=f"the response does not parse ({type(error).__name__}: {error})")]
        calls = [ToolCall(c["function"]["name"], c["function"].get("arguments") or {})
                 for c in message.get("tool_calls") or []]
        return message.get("content") or "", calls

    return parse


_NAME, _KEY, _VALUE = "tool_name_7c1e", "tool_key_3f9a", "tool_value_5b2d"


def rendered_call_turn(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None,
                       calls: list[tuple[str, dict[str, Any]]] | None = None) -> str:
    """The text of an assistant turn making `calls` ((name, arguments) pairs; by default one call with marker
    values), as the chat template renders it: what follows the generation prompt, up to the turn's end."""
    user = [{"role": "user", "content": "hi"}]
    tool_calls = [{"type": "function", "function": {"name": name, "arguments": arguments}}
                  for name, arguments in (calls or [(_NAME, {_KEY: _VALUE})])]
    kwargs = dict(chat_template_kwargs or {})
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True, **kwargs)
    whole = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                          tokenize=False, **kwargs)
    shared = 0
    while shared < min(len(prompt), len(whole)) and prompt[shared] == whole[shared]:
        shared += 1
    return whole[shared:]


def call_format(tokenizer: Any, schemas: list[dict[str, Any]],
                chat_template_kwargs: dict[str, Any] | None = None) -> CallFormat:
    """The format the model's calls are parsed in: the tokenizer's response schema when it carries one, else the
    first of FORMATS that reads back a call rendered by the chat template; ConfigError naming the family if none."""
    parameters = {s["function"]["name"]: s["function"].get("parameters", {}) for s in schemas if "function" in s}
    special = tuple(sorted(set(getattr(tokenizer, "all_special_tokens", []) or []), key=len, reverse=True))
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return CallFormat("transformers", transformers_parser(tokenizer, schemas, chat_template_kwargs), parameters,
                          special)
    turn = rendered_call_turn(tokenizer, chat_template_kwargs)
    for name, parser in FORMATS.items():
        try:
            _, calls = parser(turn)
        except Exception:  # noqa: S112 (a parser that chokes on another family's text just does not match)
            continue
        if len(calls) == 1 and calls[0].name == _NAME and calls[0].arguments == {_KEY: _VALUE}:
            return CallFormat(name, parser, parameters, special)
    raise ConfigError(f"rloo cannot read the tool calls of this chat template ({template_family(tokenizer)}): it "
                      f"renders a call as {turn[:300]!r}, which none of rloo's formats ({', '.join(FORMATS)}; "
                      f"docs/multi_turn.md) reads back. Use a template in one of these formats, or set a transformers "
                      f"response schema on the tokenizer (tokenizer.response_template).")
