"""Count the squares: TRL's RLOOTrainer and rloo's on the synthetic visual task, same settings and seeds.

    python benchmarks/learning/vision_task.py --trainer trl --seeds 0 1 2 [--steps 30] [--out FILE.json]
    python benchmarks/learning/vision_task.py --trainer rloo --seeds 0 1 2                      # rloo's default (fast) sampler
    python benchmarks/learning/vision_task.py --trainer rloo --sampler generate --seeds 0 1 2  # rloo with `generate`

Per seed: the tiny LLaVA of `rloo.toy.vision_task` is built from the seed and given a short supervised warm start
(the answer format and partial counting: from random weights RL alone does not find a one-digit answer in a few
minutes), then trained with RLOO (`count_reward`, 4 completions per prompt, no KL term). Prints and writes held-out
greedy accuracy before and after RL and the seconds per optimizer step of `trainer.train()` (wall clock).
Both trainers see the same warm-started weights, data set and RLOOConfig arguments; rloo's sampler is its default
(the fast sampler) unless --sampler generate is given (the first recorded rloo figures used `generate`, before the fast
sampler took images).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from rloo.toy.vision_task import build_counting_vlm, count_reward, counting_accuracy, counting_dataset, warm_start_counting

WARM_START_STEPS = 80  # accuracy about 0.3-0.8 after it: room for RL to improve, successes to learn from


def config_kwargs(steps: int, output_dir: str, seed: int) -> dict:
    return dict(output_dir=output_dir, max_steps=steps, learning_rate=5e-4, per_device_train_batch_size=32,
                num_generations=4, max_completion_length=3, temperature=1.0, beta=0.0, seed=seed, logging_steps=5,
                report_to="none", save_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True)


def run_seed(trainer_name: str, seed: int, steps: int, num_train: int, num_eval: int, sampler: str = "fast") -> dict:
    if trainer_name == "trl":
        from trl import RLOOConfig, RLOOTrainer
    else:
        from rloo import RLOOConfig, RLOOTrainer
    torch.manual_seed(seed)
    model, processor = build_counting_vlm(seed)
    train = counting_dataset(num_train, seed=1000 + seed)
    held_out = counting_dataset(num_eval, seed=2000 + seed)
    warm_start_counting(model, processor, train, steps=WARM_START_STEPS, learning_rate=1e-3, seed=seed)
    before = counting_accuracy(model, processor, held_out)
    with tempfile.TemporaryDirectory() as output_dir:
        extra = {"sampler": sampler} if trainer_name == "rloo" else {}
        args = RLOOConfig(**config_kwargs(steps, output_dir, seed), **extra)
        trainer = RLOOTrainer(model=model, reward_funcs=count_reward, args=args, train_dataset=train,
                              processing_class=processor)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    after = counting_accuracy(trainer.model, processor, held_out)
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    return {"seed": seed, "accuracy_before": before, "accuracy_after": after, "seconds_per_step": seconds / steps,
            "train_seconds": seconds, "logged_reward": rewards}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", choices=["trl", "rloo"], required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60, help="RL optimizer steps")
    parser.add_argument("--sampler", choices=["fast", "generate"], default="fast", help="rloo's sampler (rloo only)")
    parser.add_argument("--num-train", type=int, default=512)
    parser.add_argument("--num-eval", type=int, default=200)
    parser.add_argument("--out", default=None, help="JSON file (default: benchmarks/results/vision_task_trl.json, "
                        "vision_task_rloo_fast.json, or vision_task_rloo.json with --sampler generate)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    results = []
    for seed in args.seeds:
        row = run_seed(args.trainer, seed, args.steps, args.num_train, args.num_eval, args.sampler)
        print(f"{args.trainer} seed {seed}: held-out accuracy {row['accuracy_before']:.3f} -> {row['accuracy_after']:.3f}, "
              f"{row['seconds_per_step']:.2f} s/step", flush=True)
        results.append(row)
    name = {"trl": "trl", "rloo": {"generate": "rloo", "fast": "rloo_fast"}[args.sampler]}[args.trainer]
    out = Path(args.out or Path(__file__).parents[1] / "results" / f"vision_task_{name}.json")
    out.write_text(json.dumps({"trainer": args.trainer, "sampler": args.sampler if args.trainer == "rloo" else "generate",
                               "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                               "steps": args.steps, "warm_start_steps": WARM_START_STEPS,
                               "config": config_kwargs(args.steps, "<tmp>", 0), "torch_threads": torch.get_num_threads(),
                               "seeds": results}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
