"""Seconds per no-grad log-prob pass (pi_ref, or pi_old when a pass computes it): every row whole
(`completion_logprobs` on [prompt | completion], each prompt run K times) against each prompt once
and its K completions on its KV cache (`grouped_completion_logprobs`).

    OMP_NUM_THREADS=1 python benchmarks/speed/prefix_logprobs.py            # the shapes below, fp32 on CPU
    OMP_NUM_THREADS=1 python benchmarks/speed/prefix_logprobs.py --repeats 5 --device cuda

Shapes (2 prompts x K=8 completions per rollout, micro-batches of 8 rows as the trainer runs them):
  body   Qwen2, hidden 256, 4 layers, vocabulary 1,000: the decoder dominates
  vocab  benchmarks/memory/memory.py's Qwen2: hidden 64, 2 layers, vocabulary 151,936: the LM head dominates
each at prompt 512 / completion 64 (long prompt), prompt 512 / completion 256, and prompt 64 /
completion 256 (short prompt). Prints the median seconds of each path (on CPU: this process's CPU
seconds, one thread; see `clock`), the ratio and the largest difference between their log-probs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this checkout's rloo first

from rloo.passes.logprobs import completion_logprobs  # noqa: E402
from rloo.passes.prefix_logprobs import grouped_completion_logprobs  # noqa: E402

MODELS = {
    "body": dict(vocab_size=1_000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=1024),
    "vocab": dict(vocab_size=151_936, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=256),
}
SHAPES = [(512, 64), (512, 256), (64, 256)]  # (prompt, completion)
PROMPTS, K, MICRO = 2, 8, 8


def batch(vocab: int, prompt: int, completion: int, device: str):
    """Left-padded prompts (lengths prompt, prompt - 37, ...) repeated K times; full-length completions."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([prompt - 37 * p for p in range(PROMPTS)])
    prompt_mask = (torch.arange(prompt)[None] >= prompt - lengths[:, None]).long()  # (N, P)
    prompt_ids = torch.randint(2, vocab, (PROMPTS, prompt), generator=gen) * prompt_mask
    completion_ids = torch.randint(2, vocab, (PROMPTS * K, completion), generator=gen)
    tensors = (prompt_ids.repeat_interleave(K, 0), prompt_mask.repeat_interleave(K, 0), completion_ids,
               torch.ones_like(completion_ids))
    return [t.to(device) for t in tensors]


def plain_pass(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """What the trainer ran before: each micro-batch of whole rows."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    return torch.cat([completion_logprobs(model, input_ids[s : s + MICRO], mask[s : s + MICRO], completion_ids.shape[1])[0]
                      for s in range(0, input_ids.shape[0], MICRO)])


def grouped_pass(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    return grouped_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, K,
                                       rows_per_pass=MICRO)


def clock(device: str) -> float:
    """This process's CPU seconds on CPU (one intra-op thread: the wall time of an idle machine, but
    not inflated by other processes on a shared one); wall seconds on a GPU."""
    return time.process_time() if device == "cpu" else time.perf_counter()


def seconds(runs, inputs, repeats: int, device: str) -> tuple[list[float], list[torch.Tensor]]:
    """Median seconds of each of `runs` over `repeats` rounds after one warm-up, and their last results.

    The runs alternate within each round, so that load from other processes on a shared machine
    falls on both alike."""
    times = [[] for _ in runs]
    results = [None for _ in runs]
    with torch.no_grad():
        for round_ in range(repeats + 1):
            for index, run in enumerate(runs):
                if device == "cuda":
                    torch.cuda.synchronize()
                start = clock(device)
                results[index] = run(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
                if round_ > 0:
                    times[index].append(clock(device) - start)
    return [statistics.median(t) for t in times], results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # so that CPU seconds are wall seconds on an idle machine
    print(f"{'model':6} {'prompt':>6} {'compl':>6} {'plain s':>9} {'grouped s':>9} {'speed-up':>8} {'max |diff|':>10}")
    for name in args.models:
        config = transformers.Qwen2Config(**MODELS[name], tie_word_embeddings=True, max_position_embeddings=1024)
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config).to(args.device).eval()
        for prompt, completion in SHAPES:
            inputs = [model, *batch(config.vocab_size, prompt, completion, args.device)]
            (plain_s, grouped_s), (plain, grouped) = seconds([plain_pass, grouped_pass], inputs, args.repeats,
                                                             args.device)
            diff = (plain - grouped).abs().max().item()
            print(f"{name:6} {prompt:6} {completion:6} {plain_s:9.3f} {grouped_s:9.3f} {plain_s / grouped_s:7.2f}x {diff:10.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
