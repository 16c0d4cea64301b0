"""Seconds per optimizer step of the vLLM sampler's loop (vLLM's CPU engine, colocated), synchronous and with
async_rollouts, on the real model and the gsm8k CPU recipe's prompts.

    python recipes/prepare.py gsm8k smollm2 --gsm8k-dir ../shared/data/gsm8k
    V=$(ls -d ~/.cache/rloo/vllm-venv-*)   # built by scripts/test_vllm.sh
    PYTHONPATH=src VLLM_CPU_KVCACHE_SPACE=1 $V/bin/python benchmarks/speed/async_vllm.py --steps 6

Each mode trains in a child process of its own: SmolLM2-135M-Instruct, 8 completions (2 prompts x 4) of at
most 128 tokens a step in micro-batches of 4, beta 0, fp32, learning rate 1e-5, the recipe's reward
functions. The engine is built before the clock starts (its start-up, about a minute, is the same for
both). Prints wall and CPU seconds per step over train(), the sampler/max_abs_log_ratio of every step (the
engine against pi_old: float noise when the engine holds the weights pi_old is computed on) and, for
async, async/staleness.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cpu_seconds() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def run_one(mode: str, opts: argparse.Namespace) -> dict:
    import torch
    import transformers

    from rloo import RLOOConfig, RLOOTrainer
    from rloo.cli import resolve_reward_func
    from rloo.data.loading import load_prompt_dataset

    torch.set_num_threads(opts.threads)
    folder = str(ROOT / "recipes" / "models" / "smollm2-135m-instruct")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with tempfile.TemporaryDirectory() as out:
        args = RLOOConfig(output_dir=out, sampler="vllm", async_rollouts=mode == "async", num_generations=4,
                          per_device_train_batch_size=4, gradient_accumulation_steps=2, max_completion_length=128,
                          max_prompt_length=256, temperature=0.8, learning_rate=1e-5, beta=0.0, max_steps=opts.steps,
                          logging_steps=1, save_steps=0, report_to=[], seed=0, shared_prefix_forward=True,
                          reward_weights=[1.0, 0.2])
        data = load_prompt_dataset(str(ROOT / "recipes" / "data" / "gsm8k_1shot"), "train")
        rewards = [resolve_reward_func(name) for name in ("gsm8k_accuracy", "gsm8k_format")]
        trainer = RLOOTrainer(model, rewards, args=args, train_dataset=data,
                              processing_class=tokenizer)
        trainer.sampler.prepare(model)  # the engine's start-up stays outside the clock
        start, cpu = time.perf_counter(), cpu_seconds()
        trainer.train()
        wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        lines = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "sampler/max_abs_log_ratio" in line]
    return dict(mode=mode, seconds_per_step=wall / opts.steps, cpu_seconds_per_step=cpu / opts.steps,
                engine_gap=[line["sampler/max_abs_log_ratio"] for line in steps],
                staleness=[line.get("async/staleness") for line in steps],
                reward=[line.get("reward") for line in steps])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the training process")
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--run", help=argparse.SUPPRESS)  # the child's part
    opts = parser.parse_args()
    if opts.run:
        print(json.dumps(run_one(opts.run, opts)))
        return
    results = []
    for mode in opts.modes:
        done = subprocess.run([sys.executable, __file__, "--run", mode, "--steps", str(opts.steps),
                               "--threads", str(opts.threads)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{done.stderr[-4000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    out = ROOT / "benchmarks" / "results" / "async_vllm.json"
    out.write_text(json.dumps({"steps": opts.steps, "threads": opts.threads, "runs": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
