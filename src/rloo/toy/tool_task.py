"""A toy task that needs a tool: additions too long for a tiny model, with an `add` tool.

The prompt is a conversation `[{"role": "user", "content": "4821+1907="}]` whose answer ("6728")
a 0.13M-parameter model cannot compute itself in minutes of training, but can copy: it writes a
Hermes call `<tool_call>{"name": "add", "arguments": {"a": 4821, "b": 1907}}</tool_call>`, the
rollout runs `add` and appends `<tool_response>6728</tool_response>`, and the model's next turn
repeats the result. The reward (`rloo.rewards.exact_match`) reads the final assistant message only.

A tiny character-level model never discovers that format by sampling, so a supervised warm start
(`warm_started_tool_model`) shows it the whole exchange on a fraction of its rows (`TOOL_FRACTION`) and a
bare guess on the others (a number that is never the sum, so the warm start cannot teach the addition itself).
Afterwards it copies well (the operands into the call, the tool's result into the answer), samples a call on
about that fraction of prompts, but greedily calls on few (the guess's first digit, a copy, usually outscores
`<tool_call>`) and answers the rest with a guess, wrongly. RL then has something to improve: calling the tool
is the only way to be right. docs/recipes.md has the calibration and the figures.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import torch
import transformers
from datasets import Dataset
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from rloo.data.prompts import tokenize_prompts
from rloo.generation import FastSampler
from rloo.rewards import exact_match
from rloo.tools import parse_tool_calls, run_tool_calls, tool_schemas, tool_suffix_ids
from rloo.toy.models import build_tiny_model, set_generation_ids
from rloo.toy.tokenizer import CHARACTERS, MODEL_MAX_LENGTH, SPECIAL_TOKENS
from rloo.toy.warm_start import supervised_warm_start, write_cache_entry

TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# Qwen-style: `<eos>` ends every message (as `<|im_end|>` does), so a turn that calls a tool ends at EOS.
# An assistant turn shows ASSISTANT_CONTENT, a Jinja expression: its content here; the multi-turn tests also
# render one that drops earlier turns' `<think>` blocks, as Qwen3's template does.
_TOOL_CHAT_MESSAGES = (
    "{%- if tools %}{{ 'system: tools' }}{% for t in tools %}{{ ' ' + t.function.name }}{% endfor %}{{ '<eos>\\n' }}"
    "{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ 'assistant: ' + ASSISTANT_CONTENT }}"
    "{%- for c in m.tool_calls or [] %}{{ '<tool_call>' }}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{{ '</tool_call>' }}{% endfor %}"
    "{{ '<eos>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ 'tool: <tool_response>' + m.content + '</tool_response><eos>\\n' }}"
    "{%- else %}{{ m.role + ': ' + m.content + '<eos>\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def tool_chat_template(assistant_content: str = "m.content") -> str:
    """The toy's chat template, an assistant turn rendered as the Jinja expression `assistant_content`."""
    return _TOOL_CHAT_MESSAGES.replace("ASSISTANT_CONTENT", assistant_content)


TOOL_CHAT_TEMPLATE = tool_chat_template()
DIGITS = 4  # operands up to 9999: the tiny model does not learn that in minutes, and copies it easily
TOOL_FRACTION = 0.4  # warm-start rows that show the tool call; the others answer with a guess
ANSWER_ROWS = True  # each tool row also teaches the final copy alone (`warm_start_rows`)
MAX_COMPLETION_LENGTH = 96  # a call (about 50 tokens), the tool's message (about 30) and the answer
# 0.13M parameters: copying needs no more, and a warm-start step costs about 0.18 s on one CPU thread (the
# 1.0M-parameter hidden-128, 4-layer model took 0.5-1.5 s and had not learned to copy after 320 steps).
TOOL_MODEL_KWARGS: dict[str, Any] = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                                     "intermediate_size": 256}
WARM_START_STEPS = 1500
WARM_START_LEARNING_RATE = 3e-3


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return int(a) + int(b)


def build_tool_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The toy's character tokenizer plus braces and the four Hermes tool tags (one token each),
    with `TOOL_CHAT_TEMPLATE`, which renders tools, tool calls and tool results."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + TOOL_TOKENS + tuple(CHARACTERS + "{}"))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        additional_special_tokens=["<think>", "</think>"], padding_side="left", model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def tool_addition_split(num_train: int, num_eval: int, *, seed: int = 0, digits: int = DIGITS) -> tuple[Dataset, Dataset]:
    """Disjoint train and held-out sets of distinct additions of two `digits`-digit numbers, as conversational prompts.

    Operands have exactly `digits` digits and start with 1 to 4 (no leading zero: JSON integers have none), so the
    sum has exactly `digits` digits too. Then each digit of the call's `"a": ...` sits at one fixed distance from
    the same digit in the prompt, and each digit of the final answer at one fixed distance from the same digit in
    the tool's message: copying is a fixed-offset lookup, which a tiny model learns in a few hundred steps. With
    operands of any width (0 to 9999) it did not learn to copy (docs/recipes.md).

    Returns:
        (train, eval) Datasets with "prompt" ([{"role": "user", "content": "a+b="}]) and "answer" (str(a + b)).
    """
    low, high = 10 ** (digits - 1), 5 * 10 ** (digits - 1)
    rng = random.Random(seed)
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < num_train + num_eval:
        pairs[(rng.randrange(low, high), rng.randrange(low, high))] = None
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a, b in pairs]
    as_dataset = lambda part: Dataset.from_list(part)  # noqa: E731
    return as_dataset(rows[num_eval:]), as_dataset(rows[:num_eval])


def operands(prompt: list[dict[str, str]]) -> tuple[int, int]:
    """(a, b) of a prompt "a+b=" (its last message)."""
    a, b = prompt[-1]["content"].rstrip("=").split("+")
    return int(a), int(b)


def tool_exchange_text(tokenizer: Any, prompt: list[dict[str, str]], answer: str) -> tuple[str, str]:
    """(prompt text, completion text) of the exchange that uses the tool, as the chat template renders it:
    the call, the tool's message, the answer. The completion ends before the final EOS."""
    a, b = operands(prompt)
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    conversation = [*prompt, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "add", "content": str(add(a, b))}, {"role": "assistant", "content": answer}]
    tools = tool_schemas([add])
    prompt_text = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False)
    assert full.startswith(prompt_text) and full.endswith(tokenizer.eos_token + "\n")
    return prompt_text, full[len(prompt_text): -len(tokenizer.eos_token + "\n")]


def warm_start_rows(tokenizer: Any, dataset: Dataset, tool_fraction: float, seed: int = 0,
                    answer_rows: bool = ANSWER_ROWS) -> Dataset:
    """The warm start's rows: prompt text and the completion to imitate, the tool exchange on a seeded
    `tool_fraction` of the rows and a bare guess on the others: a seeded four-digit number that is never the
    sum. With the true sum there, a warm start could learn the addition itself (seed 2 did: 0.89 held-out
    accuracy without calling), and the tool then added nothing; with guesses, only the tool's path is ever right.

    With `answer_rows`, each tool row also gets a second row whose prompt is the whole exchange up to the final
    answer and whose completion is that answer alone: its loss is on the copy of the tool's result only (in the
    whole-exchange row that copy is 5 of about 85 supervised tokens, and was not learned in 2000 steps)."""
    rng = random.Random(seed)
    guesses = random.Random(f"guess-{seed}")  # apart from `rng`, so the same rows show the tool as before
    prompts, completions = [], []
    for prompt, answer in zip(dataset["prompt"], dataset["answer"]):
        prompt_text, exchange = tool_exchange_text(tokenizer, prompt, answer)
        uses_tool = rng.random() < tool_fraction
        prompts.append(prompt_text)
        completions.append(exchange if uses_tool else _wrong_guess(guesses, prompt, int(answer)))
        if uses_tool and answer_rows:
            prompts.append(prompt_text + exchange[: len(exchange) - len(answer)])
            completions.append(answer)
    return Dataset.from_dict({"prompt": prompts, "answer": completions})


def _wrong_guess(rng: random.Random, prompt: list[dict[str, str]], total: int) -> str:
    """A number that is not `total`: the first digit of the prompt's first operand, then digits drawn from `rng`.

    The first digit is a copy, so the model is sure of it: then the bare answer's first token outscores
    `<tool_call>` greedily, as the true sums did, and RL has the call to teach. With every digit random
    (tried on seed 2) the greedy model called on every prompt before RL and RLOO lowered its accuracy."""
    first = str(operands(prompt)[0])[0]
    while (guess := first + "".join(rng.choice("0123456789") for _ in range(DIGITS - 1))) == str(total):
        pass
    return guess


def warm_started_tool_model(
    train_dataset: Dataset, *, seed: int = 0, steps: int = WARM_START_STEPS, tool_fraction: float = TOOL_FRACTION,
    learning_rate: float = WARM_START_LEARNING_RATE, batch_size: int = 32, model_kwargs: dict[str, Any] | None = None,
    answer_rows: bool = ANSWER_ROWS, cache_dir: str | Path | None = None, log_every: int = 0,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """A tiny model (seeded) and its tool tokenizer after `steps` supervised steps on `warm_start_rows`.

    The loss covers the whole completion (the tool's message too; teacher forcing, so the model is told
    the result either way). With `cache_dir`, the result is saved under `cache_dir/add_tool-<key>` (the key
    hashes every setting and the training rows) and loaded from there next time, so that the run with tools and
    the control start from the same model without training it twice. Returns (model in eval mode, tokenizer).
    """
    model_kwargs = TOOL_MODEL_KWARGS if model_kwargs is None else model_kwargs
    tokenizer = build_tool_tokenizer()
    rows = warm_start_rows(tokenizer, train_dataset, tool_fraction, seed, answer_rows)
    # The key hashes the warm start's own rows (what the model imitates), so a change to how they are written
    # (e.g. the bare rows' guesses) never loads a model trained on the old ones.
    rows_text = json.dumps([list(rows["prompt"]), list(rows["answer"])])
    settings = {"seed": seed, "steps": steps, "tool_fraction": tool_fraction, "learning_rate": learning_rate,
                "batch_size": batch_size, "model_kwargs": model_kwargs, "answer_rows": answer_rows,
                "template": TOOL_CHAT_TEMPLATE, "warm_start_rows": hashlib.sha256(rows_text.encode()).hexdigest()}
    entry = None
    if cache_dir is not None:
        entry = Path(cache_dir) / f"add_tool-{hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]}"
        if entry.is_dir():
            print(f"warm start: loaded from cache {entry}", flush=True)
            # The tokenizer is rebuilt, not loaded: saved and reloaded, it comes back as Qwen2's tokenizer class,
            # which drops the spaces and newlines this character tokenizer encodes.
            model = transformers.AutoModelForCausalLM.from_pretrained(entry, dtype=torch.float32).eval()
            set_generation_ids(model, tokenizer)
            return model, tokenizer
    model = build_tiny_model(tokenizer, seed=seed, **model_kwargs)
    losses = supervised_warm_start(model, tokenizer, rows, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                                   seed=seed, log_every=log_every)
    if entry is not None:
        write_cache_entry(entry, model, tokenizer, {**settings, "final_loss": losses[-1] if losses else None})
    return model, tokenizer


@torch.no_grad()
def evaluate_with_tool(
    model: transformers.PreTrainedModel, tokenizer: Any, dataset: Dataset, *, use_tool: bool = True,
    max_new_tokens: int = 64, batch_size: int = 256, sampler: Any = None,
) -> dict[str, float]:
    """Greedy held-out accuracy and tool-call rate, over two turns: the first turn; where it called the tool
    (and `use_tool`), the tool's result appended as tokens and a second turn. The answer is the last turn's text.

    `sampler` (any `Sampler`) replaces the greedy `FastSampler`, e.g. a scripted one in tests.

    Returns:
        {"accuracy": fraction exactly right, "tool_call_rate": fraction whose first turn made a tool call}.
    """
    if model is not None:
        model.eval()
    sampler = sampler or FastSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=max_new_tokens, do_sample=False)
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    finals, calls_made = [], 0
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        prompt_ids = tokenize_prompts(chunk, tokenizer, tokenizer.model_max_length, {"tools": tool_schemas([add])})
        first = _turn(sampler, model, tokenizer, prompt_ids)
        parsed = [parse_tool_calls(text) for _, text in first]
        calling = [i for i, (_, calls) in enumerate(parsed) if calls]
        calls_made += len(calling)
        texts = [text for _, text in first]
        if use_tool and calling:
            results = run_tool_calls([parsed[i][1] for i in calling], [{"add": add}] * len(calling), 5.0)
            continued = []
            for i, turn_results in zip(calling, results):
                messages = [{"role": "tool", "name": r.name, "content": r.content} for r in turn_results]
                suffix = tool_suffix_ids(tokenizer, messages, {tokenizer.eos_token_id})
                continued.append(prompt_ids[i] + first[i][0] + suffix)
            for i, (_, text) in zip(calling, _turn(sampler, model, tokenizer, continued)):
                texts[i] = text
        finals += texts
    accuracy = sum(exact_match([t.strip() for t in finals], answers)) / max(len(answers), 1)
    return {"accuracy": accuracy, "tool_call_rate": calls_made / max(len(answers), 1)}


@torch.no_grad()
def copy_accuracy(model: transformers.PreTrainedModel, tokenizer: Any, dataset: Dataset, *, max_new_tokens: int = 64,
                  sampler: Any = None) -> dict[str, float]:
    """How well the model copies, greedily, each half measured apart from the other.

    Returns:
        {"call_rate": fraction whose first turn made a call, "operands_right": of those, the fraction whose
        first call is add(a, b) with the prompt's operands, "answer_copied": fraction whose final turn, after the
        right call and the tool's result given as context (teacher forcing), is exactly that result}.
    """
    if model is not None:
        model.eval()
    sampler = sampler or FastSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                                     max_new_tokens=max_new_tokens, do_sample=False)
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    prompt_ids = tokenize_prompts(prompts, tokenizer, tokenizer.model_max_length, {"tools": tool_schemas([add])})
    calls = [parse_tool_calls(text)[1] for _, text in _turn(sampler, model, tokenizer, prompt_ids)]
    made = [(c[0], operands(p)) for c, p in zip(calls, prompts) if c]
    right = sum(c.name == "add" and c.arguments == {"a": a, "b": b} for c, (a, b) in made)
    forced = []
    for prompt, answer in zip(prompts, answers):
        prompt_text, exchange = tool_exchange_text(tokenizer, prompt, answer)
        forced.append(tokenizer.encode(prompt_text + exchange[: len(exchange) - len(answer)], add_special_tokens=False))
    copied = sum(text.strip() == answer for (_, text), answer in zip(_turn(sampler, model, tokenizer, forced), answers))
    count = max(len(answers), 1)
    return {"call_rate": len(made) / count, "operands_right": right / max(len(made), 1), "answer_copied": copied / count}


def _turn(sampler: Any, model: Any, tokenizer: Any, prompt_ids: list[list[int]]) -> list[tuple[list[int], str]]:
    """(ids up to and including EOS, decoded text) of one greedy turn per prompt."""
    batch = sampler.sample(model, prompt_ids, num_generations=1)
    turns = []
    for row in range(len(prompt_ids)):
        ids = batch.completion_ids[row, : int(batch.completion_mask[row].sum())].tolist()
        turns.append((ids, tokenizer.decode(ids, skip_special_tokens=True)))
    return turns
