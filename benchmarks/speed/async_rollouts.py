"""Asynchronous rollouts against the synchronous loop on the offline addition task: episodes per
second and held-out greedy accuracy at equal optimizer steps.

    PYTHONPATH=src python benchmarks/speed/async_rollouts.py                  # 2 seeds, 40 steps each
    PYTHONPATH=src python benchmarks/speed/async_rollouts.py --quick          # 1 seed, 10 steps
    PYTHONPATH=src python benchmarks/speed/async_rollouts.py --threads 2      # torch intra-op threads
    PYTHONPATH=src python benchmarks/speed/async_rollouts.py --max-staleness 2  # the sampler up to 2 rollouts ahead

The warm-started addition model with the exact-match reward, K=4, 32 completions per step. For each
seed, the same run with async_rollouts off and on; it prints wall seconds, episodes per second (trained
completions / wall time of train()), and held-out greedy accuracy before and after. On a machine shared
with other work, compare runs taken together and repeat: the figures move with the load.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.rollout.async_rollouts import AsyncRollouts
from rloo.toy import addition_split, exact_match_reward, greedy_accuracy, warm_started_addition_model

WORKER = "process"


def run(cache_dir: str, use_async: bool, seed: int, steps: int, eval_prompts: int, batch: int,
        max_staleness: int = 1) -> dict:
    train, held_out = addition_split(4000, 500, seed=0)
    held_out = held_out.select(range(eval_prompts))
    model, tokenizer = warm_started_addition_model(cache_dir, verbose=False)
    start = greedy_accuracy(model, tokenizer, held_out)
    with tempfile.TemporaryDirectory() as out:
        config = RLOOConfig(output_dir=out, seed=seed, num_generations=4, per_device_train_batch_size=batch,
                            learning_rate=3e-5, lr_scheduler_type="constant", beta=0.0, max_completion_length=5,
                            max_prompt_length=16, max_steps=steps, logging_steps=steps, save_steps=0,
                            async_rollouts=use_async, max_staleness=max_staleness if use_async else 1)
        trainer = RLOOTrainer(model, exact_match_reward, args=config, train_dataset=train, processing_class=tokenizer)
        if use_async:
            import rloo.rollout.async_rollouts

            rloo.rollout.async_rollouts.AsyncRollouts = functools.partial(AsyncRollouts, worker=WORKER)
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
        policy = trainer.accelerator.unwrap_model(trainer.model)
        end = greedy_accuracy(policy, tokenizer, held_out)
    return dict(async_rollouts=use_async, max_staleness=max_staleness, seed=seed, seconds=seconds,
                episodes_per_s=steps * batch / seconds,
                accuracy_start=start, accuracy_end=end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32, help="completions per optimizer step")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--cache_dir", default=str(Path(tempfile.gettempdir()) / "rloo-warm-start"))
    parser.add_argument("--out", default=None, help="JSON file for the raw numbers")
    parser.add_argument("--max-staleness", type=int, default=1, help="async_rollouts' max_staleness")
    parser.add_argument("--worker", default="process", choices=("process", "thread"), help="where the sampler runs")
    options = parser.parse_args()
    global WORKER
    WORKER = options.worker
    torch.set_num_threads(options.threads)
    seeds = (0,) if options.quick else (0, 1)
    steps = options.steps or (10 if options.quick else 40)
    runs = []
    for seed in seeds:
        for use_async in (False, True):  # interleaved, so that both see the same load
            runs.append(run(options.cache_dir, use_async, seed, steps, 200, options.batch, options.max_staleness))
            r = runs[-1]
            print(f"{'async' if use_async else 'sync '} seed {seed}: {r['seconds']:.1f} s, {r['episodes_per_s']:.1f} "
                  f"episodes/s, held-out greedy accuracy {r['accuracy_start']:.3f} -> {r['accuracy_end']:.3f}", flush=True)
    for use_async in (False, True):
        mine = [r for r in runs if r["async_rollouts"] == use_async]
        print(f"{'async' if use_async else 'sync '} mean: {statistics.mean(r['episodes_per_s'] for r in mine):.1f} "
              f"episodes/s, accuracy {statistics.mean(r['accuracy_end'] for r in mine):.3f}")
    sync = statistics.mean(r["episodes_per_s"] for r in runs if not r["async_rollouts"])
    fast = statistics.mean(r["episodes_per_s"] for r in runs if r["async_rollouts"])
    print(f"speed-up {fast / sync:.2f}x ({steps} steps x {options.batch} completions, {options.threads} torch thread(s), "
          f"max_staleness {options.max_staleness})")
    if options.out:
        Path(options.out).write_text(json.dumps(dict(steps=steps, threads=options.threads, runs=runs), indent=1))


if __name__ == "__main__":
    main()
