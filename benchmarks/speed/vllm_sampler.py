"""rloo's fast sampler vs the vLLM sampler (colocate, vLLM's CPU engine) on the same model and work.

    V=~/.cache/rloo/vllm-venv-*   # built by scripts/test_vllm.sh
    PYTHONPATH=src VLLM_CPU_KVCACHE_SPACE=1 $V/bin/python benchmarks/speed/vllm_sampler.py \\
        --model ~/.cache/rloo/smollm2-135m-instruct --prompts 8 --k 4 --tokens 64

Each sampler runs in a child process of its own (so peak RSS is its own): it loads the model, samples
once (time to first generation: for vLLM the engine start, compilation included), then samples `--repeats`
more times. Every completion runs to --tokens (no end id can be drawn: vLLM gets ignore_eos), so both do
the same work. Prints completions/s over the repeats, time to first generation, the process's peak RSS
growth after the model is loaded, and for vLLM the largest |engine - trainer| log-prob difference of
its samples (fp32, temperature 1).
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def policy_gap(model, batch) -> float:
    import torch

    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    width = batch.completion_ids.shape[1]
    logps = logits[:, -width - 1:-1].float().log_softmax(-1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    return ((logps - batch.logprobs) * batch.completion_mask).abs().max().item()


def run_one(kind: str, opts: argparse.Namespace) -> dict:
    import torch
    import transformers

    from rloo import RLOOConfig
    from rloo.generation import FastSampler
    from rloo.generation.vllm import VLLMSampler

    torch.set_num_threads(opts.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(opts.model)
    prompts = [tokenizer(f"Question {i}: what is {i} plus {2 * i}?", add_special_tokens=False)["input_ids"]
               for i in range(opts.prompts)]
    common = dict(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[10**6], max_new_tokens=opts.tokens)
    if kind == "fast":
        sampler = FastSampler(**common)
    else:
        args = RLOOConfig(sampler="vllm", output_dir="/tmp/rloo-bench-vllm", seed=0)
        common["eos_token_ids"] = []  # vLLM refuses an out-of-vocabulary stop id
        sampler = VLLMSampler(**common, generation_kwargs={"ignore_eos": True}, args=args)
    base = rss_mb()
    start = time.perf_counter()
    batch = sampler.sample(model, prompts, opts.k)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(opts.repeats):
        batch = sampler.sample(model, prompts, opts.k)
    elapsed = time.perf_counter() - start
    assert int(batch.completion_mask.sum()) == opts.prompts * opts.k * opts.tokens, "a completion ended early"
    result = dict(sampler=kind, completions_per_s=opts.prompts * opts.k * opts.repeats / elapsed,
                  first_generation_s=first, peak_rss_growth_mb=rss_mb() - base)
    if kind == "vllm":
        result["max_logprob_diff"] = policy_gap(model, batch)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the fast sampler")
    parser.add_argument("--run", choices=["fast", "vllm"], help=argparse.SUPPRESS)  # the child's part
    opts = parser.parse_args()
    if opts.run:
        print("RESULT " + json.dumps(run_one(opts.run, opts)), flush=True)
        return
    print(f"{opts.model}: {opts.prompts} prompts x K={opts.k} x {opts.tokens} tokens, {opts.repeats} timed repeats")
    for kind in ("fast", "vllm"):
        child = subprocess.run([sys.executable, __file__, "--run", kind, *sys.argv[1:]], capture_output=True, text=True)
        lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
        if child.returncode != 0 or not lines:
            print(f"{kind}: failed (exit {child.returncode})\n{child.stderr[-3000:]}")
            continue
        result = json.loads(lines[-1][len("RESULT "):])
        extra = f", max |engine - trainer| log-prob {result['max_logprob_diff']:.1e}" if kind == "vllm" else ""
        print(f"{kind:5s}: {result['completions_per_s']:.2f} completions/s, first generation "
              f"{result['first_generation_s']:.1f} s, peak RSS growth {result['peak_rss_growth_mb']:,.0f} MB{extra}")


if __name__ == "__main__":
    main()
