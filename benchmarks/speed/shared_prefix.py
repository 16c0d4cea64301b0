"""Seconds per training forward + backward of one micro-batch: every row whole (`completion_logprobs`
on [prompt | completion], each prompt run K times) against the shared-prefix forward
(`shared_prefix_forward`, `passes.prefix_logprobs.shared_prompt_logprobs`: each prompt run once with
grad, its K completions on copies of its KV cache, which stay in the autograd graph).

    OMP_NUM_THREADS=1 python benchmarks/speed/shared_prefix.py
    OMP_NUM_THREADS=1 python benchmarks/speed/shared_prefix.py --repeats 5 --attn eager --device cuda

One micro-batch = one prompt's K=8 completions (full length), on the models of
benchmarks/speed/prefix_logprobs.py (body: Qwen2 hidden 256, 4 layers, vocabulary 1,000; vocab: hidden
64, 2 layers, vocabulary 151,936), at prompt/completion 512/64, 512/256, 64/256 and 1024/32.
Prints the median seconds (on CPU: this process's CPU seconds, one thread; see `clock`) of each
path, the ratio, and the largest gradient difference relative to the largest gradient of its tensor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this checkout's rloo first

from prefix_logprobs import MODELS, clock  # noqa: E402  (the sibling benchmark: same models, same clock)

from rloo.passes.logprobs import completion_logprobs  # noqa: E402
from rloo.passes.prefix_logprobs import shared_prompt_logprobs  # noqa: E402

SHAPES = [(512, 64), (512, 256), (64, 256), (1024, 32)]  # (prompt, completion)
K = 8


def plain_step(model, prompt_ids, prompt_mask, completion_ids):
    logps, _ = completion_logprobs(model, torch.cat([prompt_ids, completion_ids], 1),
                                   torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1), completion_ids.shape[1])
    logps.sum().backward()


def shared_step(model, prompt_ids, prompt_mask, completion_ids):
    logps, _ = shared_prompt_logprobs(model, prompt_ids, prompt_mask, completion_ids, torch.ones_like(completion_ids))
    logps.sum().backward()


def timed(steps, model, inputs, repeats: int, device: str) -> tuple[list[float], list[dict]]:
    """Median seconds of each of `steps` over `repeats` rounds after one warm-up, and the gradients of
    their last run. The steps alternate within each round, so that load from other processes on a
    shared machine falls on both alike."""
    times, grads = [[] for _ in steps], [None for _ in steps]
    for round_ in range(repeats + 1):
        for index, step in enumerate(steps):
            model.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            start = clock(device)
            step(model, *inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            if round_ > 0:
                times[index].append(clock(device) - start)
            grads[index] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return [statistics.median(t) for t in times], grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # so that CPU seconds are wall seconds on an idle machine
    print(f"{'model':6} {'prompt':>6} {'compl':>6} {'plain s':>8} {'shared s':>8} {'speed-up':>8} {'rel dgrad':>11}")
    for name in args.models:
        config = transformers.Qwen2Config(**MODELS[name], tie_word_embeddings=True, max_position_embeddings=4096,
                                          attn_implementation=args.attn)
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config).to(args.device)
        for prompt, completion in SHAPES:
            gen = torch.Generator().manual_seed(0)
            prompt_ids = torch.randint(2, config.vocab_size, (1, prompt), generator=gen).repeat(K, 1).to(args.device)
            completion_ids = torch.randint(2, config.vocab_size, (K, completion), generator=gen).to(args.device)
            inputs = (prompt_ids, torch.ones_like(prompt_ids), completion_ids)
            (plain_s, shared_s), (plain_grads, shared_grads) = timed([plain_step, shared_step], model, inputs,
                                                                     args.repeats, args.device)
            # The largest gradient difference relative to the largest gradient of the same tensor.
            diff = max(((plain_grads[n] - shared_grads[n]).abs().max() / plain_grads[n].abs().max()).item()
                       for n in plain_grads)
            print(f"{name:6} {prompt:6} {completion:6} {plain_s:8.3f} {shared_s:8.3f} {plain_s / shared_s:7.2f}x "
                  f"{diff:11.2e}", flush=True)


if __name__ == "__main__":
    main()
