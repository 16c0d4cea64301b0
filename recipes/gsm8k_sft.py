"""A short supervised warm start of SmolLM2-135M-Instruct on GSM8K's own solutions, with or without the calculator.

GSM8K's reference solutions mark each computation with a calculator annotation: "48/2 = <<48/2=24>>24 clips".
`tool_transcript` turns one solution into a Hermes tool-call conversation mechanically: the text up to each
annotation is an assistant turn ending in a call `calculator(expression="48/2")`, the calculator's own result comes
back as a tool message, and the next assistant turn continues the solution from the annotation's result on, the last
one ending "#### n" as the recipe's rewards expect. `plain_solution` removes the annotations instead (the arithmetic
stays inline, as the solution reads), for the no-tool arm. A solution whose annotation the calculator cannot compute,
or computes to another value than the annotation's, is skipped (`TranscriptError`), never silently changed.

`sft_example` builds the ids the RLOO rollout would hold for such a conversation, piece by piece as the rollout
builds them (the prompt with its generation prompt; each assistant turn's text and end-of-turn id, sampled by the
model; each tool result and the next generation prompt, appended by `rloo.tools.tool_suffix_ids`), with a loss mask
of 1 on the assistant's tokens only. `warm_start` runs a short AdamW loop on the TRAIN split and saves the model
(`python recipes/prepare.py smollm2-sft-tools smollm2-sft-plain`). The prompts' common start (system message, tool
schema, worked example) runs once per step without gradient and the batch continues from its KV cache, which keeps
a step to seconds on CPU; the gradient flows through the question and the solution only.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE / "tools"))

from calculator import calculator  # noqa: E402

ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")


class TranscriptError(ValueError):
    """A solution that cannot be turned into a faithful tool transcript."""


def plain_solution(solution: str) -> str:
    """The solution with its calculator annotations removed: "48/2 = <<48/2=24>>24" -> "48/2 = 24"."""
    return ANNOTATION.sub("", solution)


def _same_number(computed: str, annotated: str) -> bool:
    try:
        return abs(float(computed) - float(annotated.replace(",", "").strip())) <= 1e-6 * max(1.0, abs(float(computed)))
    except ValueError:
        return False


def tool_transcript(solution: str, max_calls: int | None = None) -> list[dict]:
    """The assistant's side of one GSM8K solution as Hermes tool messages: one call per annotation (the first
    `max_calls` of them; later ones are written inline as in `plain_solution`), each followed by the tool message
    holding `calculator`'s result. A "$" written just before an annotation moves after the call, with the number."""
    messages: list[dict] = []
    pending, calls = "", 0
    position = 0
    for match in ANNOTATION.finditer(solution):
        before = solution[position:match.start()]
        position = match.end()
        if max_calls is not None and calls >= max_calls:
            pending += before
            continue
        expression, annotated = match.group(1).strip(), match.group(2)
        try:
            result = calculator(expression)
        except ValueError as error:
            raise TranscriptError(f"the calculator refuses {expression!r}: {error}") from None
        if not _same_number(result, annotated):
            raise TranscriptError(f"the calculator gives {result} for {expression!r}, the annotation {annotated!r}")
        text = pending + before
        currency = text.endswith("$")
        text = text[:-1] if currency else text
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        messages.append({"role": "assistant", "content": text.rstrip(), "tool_calls": [call]})
        messages.append({"role": "tool", "name": "calculator", "content": result})
        pending, calls = ("$" if currency else ""), calls + 1
    messages.append({"role": "assistant", "content": (pending + solution[position:]).strip()})
    return messages


def sft_example(tokenizer, prompt: list[dict], turns: list[dict], tools: list[dict] | None, end_ids: set[int]):
    """(ids, loss mask) of the prompt then `turns`, built as the rollout builds a trajectory: the rendered prompt with
    its generation prompt (mask 0), each assistant turn's text up to and including its end-of-turn id (mask 1, the
    model's tokens), each run of tool messages as `tool_suffix_ids` renders them with the next generation prompt
    (mask 0). No earlier piece is tokenized again."""
    from rloo.tools import tool_suffix_ids

    def render(messages: list[dict], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)

    ids = tokenizer(render(prompt, True), add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    done = list(prompt)
    index = 0
    while index < len(turns):
        turn = turns[index]
        if turn["role"] == "assistant":
            head = render(done, True)
            text = render([*done, turn], False)
            if not text.startswith(head):
                raise TranscriptError("the template renders the earlier turns differently once a turn follows")
            body = text[len(head):].rstrip("\n")  # the turn up to its end-of-turn token; "\n" after it is the tools'
            turn_ids = tokenizer(body, add_special_tokens=False)["input_ids"]
            if not turn_ids or turn_ids[-1] not in end_ids:
                raise TranscriptError(f"an assistant turn does not end with an end-of-turn token: {body[-40:]!r}")
            ids += turn_ids
            mask += [1] * len(turn_ids)
            done.append(turn)
            index += 1
        else:
            tool_messages = []
            while index < len(turns) and turns[index]["role"] == "tool":
                tool_messages.append(turns[index])
                index += 1
            suffix = tool_suffix_ids(tokenizer, tool_messages, end_ids)
            ids += suffix
            mask += [0] * len(suffix)
            done.extend(tool_messages)
    return ids, mask


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    first = sequences[0]
    length = min(len(ids) for ids in sequences)
    for ids in sequences[1:]:
        length = next((i for i in range(length) if ids[i] != first[i]), length)
    return first[:length]


def sft_rows(problems: list[dict], with_tools: bool, max_calls: int | None,
             prompt_of: Callable[[str], list[dict]] | None = None) -> tuple[list[dict], int]:
    """(rows of prompt and assistant turns, solutions skipped): the recipe's prompt (`prompt_of(question)`; GSM8K's
    one-shot prompt by default), and the solution as a tool transcript (with_tools) or with its annotations removed;
    the same problems in both arms."""
    from rloo.assets.gsm8k import gsm8k_prompt

    prompt_of = prompt_of or (lambda question: gsm8k_prompt(question, one_shot=True))

    rows, skipped = [], 0
    for problem in problems:
        try:
            tool_turns = tool_transcript(problem["answer"], max_calls)
        except TranscriptError:
            skipped += 1
            continue
        turns = tool_turns if with_tools else [{"role": "assistant", "content": plain_solution(problem["answer"])}]
        rows.append({"prompt": prompt_of(problem["question"]), "turns": turns})
    return rows, skipped


def warm_start(model_folder: Path, output: Path, problems: list[dict], with_tools: bool, steps: int, batch_size: int,
               learning_rate: float, max_calls: int | None, seed: int = 0,
               prompt_of: Callable[[str], list[dict]] | None = None) -> dict:
    """SFT `model_folder` on the first steps * batch_size usable problems (assistant tokens only in the loss; the
    mean over those tokens), AdamW at a constant learning rate, fp32; saves the model, tokenizer and template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.tools import tool_schemas

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    model.train()
    tools = tool_schemas([calculator]) if with_tools else None
    end_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    rows, skipped = sft_rows(problems[: steps * batch_size * 2], with_tools, max_calls, prompt_of)
    rows = rows[: steps * batch_size]
    if len(rows) < steps * batch_size:
        raise ValueError(f"only {len(rows)} usable solutions for {steps} steps of {batch_size}")
    examples = [sft_example(tokenizer, row["prompt"], row["turns"], tools, end_ids) for row in rows]
    # Every prompt starts with the same system message, tool schema and worked example: those ids run once per step,
    # without gradient, and the batch continues from their KV cache (the gradient flows through the rest only).
    shared = _common_prefix([ids for ids, _ in examples])
    shared = shared[: min(mask.index(1) for _, mask in examples)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses, start = [], time.perf_counter()
    for step in range(steps):
        batch = [(ids[len(shared):], mask[len(shared):]) for ids, mask in examples[step * batch_size:(step + 1) * batch_size]]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
        attention = torch.tensor([[1] * (len(shared) + len(ids)) + [0] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask)] + [-100] * (width - len(ids))
                               for ids, mask in batch])
        with torch.no_grad():
            cache = model(input_ids=torch.tensor([shared]), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(batch))
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels, past_key_values=cache,
                     use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        print(f"sft step {step + 1}/{steps}: loss {losses[-1]} ({time.perf_counter() - start:.0f} s)", flush=True)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    record = {"with_tools": with_tools, "shared_prefix_tokens": len(shared),
              "steps": steps, "batch_size": batch_size, "learning_rate": learning_rate,
              "max_calls": max_calls, "examples": len(rows), "skipped_solutions": skipped, "losses": losses,
              "seconds": round(time.perf_counter() - start, 1),
              "assistant_tokens": sum(sum(mask) for _, mask in examples),
              "tool_calls": sum(sum(1 for t in row["turns"] if t.get("tool_calls")) for row in rows)}
    (output / "sft.json").write_text(json.dumps(record, indent=1))
    return record
