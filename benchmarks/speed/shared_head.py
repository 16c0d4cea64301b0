"""The fast sampler's shared head (prompts that begin alike run their common head once) on the GSM8K tool
recipe's real prompts.

    python recipes/prepare.py gsm8k smollm2 smollm2-tools --gsm8k-dir ../shared/data/gsm8k
    python benchmarks/speed/shared_head.py --prompts 16 --new-tokens 32

SmolLM2-135M-Instruct with the tool template (recipes/models/smollm2-135m-instruct-tools); the first --prompts
test prompts of recipes/data/gsm8k_1shot rendered with the calculator's schema, as the tool recipe renders them
(system message with the schema, the worked example, the problem). Greedy, one completion per prompt (an
evaluation batch, or a multi-turn rollout's later turn: K = 1 per row), --new-tokens tokens, best of --repeats,
with the shared head and with the whole-row prefill (`fast.MIN_SHARED_HEAD` set out of reach); the two must
draw the same tokens. Prints the head length, the seconds of each, and the largest log-prob difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parents[1] / "recipes" / "tools"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()

    import torch
    from calculator import calculator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.data.prompts import tokenize_prompts
    from rloo.generation import fast
    from rloo.tools import tool_schemas

    folder = HERE.parents[1] / "recipes" / "models" / "smollm2-135m-instruct-tools"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    lines = (HERE.parents[1] / "recipes" / "data" / "gsm8k_1shot" / "test.jsonl").read_text().splitlines()[:options.prompts]
    prompts = tokenize_prompts([json.loads(line)["prompt"] for line in lines], tokenizer, 1024,
                               {"tools": tool_schemas([calculator])})
    sampler = fast.FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=options.new_tokens,
                               do_sample=False)
    head = fast.shared_head_length(prompts)
    lengths = sorted(map(len, prompts))
    print(f"{len(prompts)} prompts of {lengths[0]}-{lengths[-1]} tokens, common head {head} tokens; "
          f"{options.new_tokens} new tokens each, greedy; {torch.get_num_threads()} threads")

    results = {}
    for name, threshold in (("whole rows", 10**9), ("shared head", fast.MIN_SHARED_HEAD)):
        fast.MIN_SHARED_HEAD = threshold
        seconds = []
        for _ in range(options.repeats):
            start = time.perf_counter()
            batch = sampler.sample(model, prompts, 1)
            seconds.append(time.perf_counter() - start)
        results[name] = batch
        print(f"{name:>12}: {min(seconds):6.2f} s (best of {options.repeats})")
    whole, shared = results["whole rows"], results["shared head"]
    assert torch.equal(whole.completion_ids, shared.completion_ids), "the shared head drew other tokens"
    gap = (whole.logprobs - shared.logprobs).abs().max().item()
    print(f"same tokens; largest log-prob difference {gap:.1e}")


if __name__ == "__main__":
    main()
