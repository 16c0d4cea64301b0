"""A character tokenizer and chat templates that speak Hermes-style tool calls, for the multi-turn tests.

The tokenizer is the toy tool task's (`rloo.toy.tool_task.build_tool_tokenizer`: the character tokenizer
plus braces, and `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` as single tokens). `HERMES` is the toy's own
template (`TOOL_CHAT_TEMPLATE`): it renders tools, tool calls and tool results the way Qwen's templates do (`<eos>`
ends every message, like `<|im_end|>`); `THINK_DROPPING` is the same but renders every assistant turn but the last without
its `<think>...</think>` block, as Qwen3's template does: re-rendering a conversation with it gives
other ids than the ones sampled.
"""

from __future__ import annotations

import transformers

from rloo.generation.base import SampledBatch, batch_from_token_lists
from rloo.toy.tool_task import TOOL_CHAT_TEMPLATE, build_tool_tokenizer, tool_chat_template

HERMES = TOOL_CHAT_TEMPLATE
THINK_DROPPING = tool_chat_template("(m.content if loop.last else m.content.split('</think>')[-1])")


def tool_tokenizer(template: str = HERMES) -> transformers.PreTrainedTokenizerFast:
    """The toy tool task's tokenizer (`rloo.toy.tool_task`) with `template` and room for longer test rows."""
    tokenizer = build_tool_tokenizer()
    tokenizer.model_max_length = 4096
    tokenizer.chat_template = template
    return tokenizer


def call(name: str, **arguments) -> str:
    """A Hermes tool call as the model would write it."""
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedSampler:
    """A sampler that answers from a script: for each prompt (its decoded text, with every earlier turn) and
    generation, `script(text, row)` followed by EOS (cut at max_new_tokens, or the call's own `max_new_tokens`, a
    multi-turn trajectory's remaining budget), with log-probs -0.5 per token (or
    none). A turn's number is `text.count("<tool_response>")`. It records every call's prompts and completions."""

    def __init__(self, tokenizer, script, max_new_tokens: int = 400, with_logprobs: bool = True):
        self.tokenizer, self.script, self.max_new_tokens = tokenizer, script, max_new_tokens
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.with_logprobs = with_logprobs
        self.calls: list[list[list[int]]] = []
        self.sampled: list[list[list[int]]] = []

    def sample(self, model, prompts, num_generations, max_new_tokens=None) -> SampledBatch:
        self.calls.append([list(p) for p in prompts])
        limit = max_new_tokens or self.max_new_tokens
        completions = []
        for index, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            for k in range(num_generations):
                ids = self.tokenizer.encode(self.script(text, index * num_generations + k)) + [self.tokenizer.eos_token_id]
                completions.append(ids[:limit])
        self.sampled.append(completions)
        logprobs = [[-0.5] * len(c) for c in completions] if self.with_logprobs else None
        batch = batch_from_token_lists(prompts, completions, logprobs, num_generations, self.tokenizer.pad_token_id,
                                       self.eos_token_ids)
        batch.logprobs_from_policy = False
        return batch

    def on_optimizer_step(self, model) -> None:
        pass
