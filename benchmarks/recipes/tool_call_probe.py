"""Does SmolLM2-135M-Instruct call the calculator at all? Sample completions of GSM8K training prompts rendered
with the calculator's schema (recipes/templates/smollm2_tools.jinja) and count `<tool_call>` blocks.

    python benchmarks/recipes/tool_call_probe.py --prompts 8                       # the recipe's prompts, 4 samples each
    python benchmarks/recipes/tool_call_probe.py --prompts 6 --tokens 64 --tool-example
    python benchmarks/recipes/tool_call_probe.py --prompts 8 --model recipes/models/smollm2-135m-instruct-sft-tools

--tool-example replaces the prompts' worked example (a direct answer) by the same example solved with a
calculator call and its result, to see whether a demonstration makes the model call the tool.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "recipes" / "tools"))


def main() -> None:
    import torch
    from calculator import calculator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.tools import parse_tool_calls, tool_schemas

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--tool-example", action="store_true")
    parser.add_argument("--model", default="recipes/models/smollm2-135m-instruct-tools",
                        help="model folder relative to the repository root, e.g. recipes/models/smollm2-135m-instruct-sft-tools")
    options = parser.parse_args()
    folder = ROOT / options.model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with open(ROOT / "recipes" / "data" / "gsm8k_1shot" / "train.jsonl") as lines:
        prompts = [json.loads(line)["prompt"] for _, line in zip(range(options.prompts), lines)]
    if options.tool_example:
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 + 2 * 4"}}}
        prompts = [[p[0], {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "calculator", "content": "11"}, p[1], p[2]] for p in prompts]
    torch.manual_seed(0)
    texts = [tokenizer.apply_chat_template(p, tools=tool_schemas([calculator]), tokenize=False, add_generation_prompt=True)
             for p in prompts]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    start = time.perf_counter()
    out = model.generate(**inputs, max_new_tokens=options.tokens, do_sample=True, temperature=0.8,
                         num_return_sequences=options.samples, pad_token_id=tokenizer.pad_token_id)
    completions = [text.split("<|im_end|>")[0] for text in
                   tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=False)]
    opened = sum("<tool_call>" in text for text in completions)
    parsed = sum(any(call.error is None for call in parse_tool_calls(text)[1]) for text in completions)
    print(f"{len(completions)} completions ({time.perf_counter() - start:.0f} s): {opened} open a <tool_call>, "
          f"{parsed} hold a parsable call")
    for text in completions[:6]:
        print("---", repr(text[:200]))


if __name__ == "__main__":
    main()
