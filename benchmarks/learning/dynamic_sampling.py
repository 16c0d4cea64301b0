"""Dynamic sampling on the offline addition task: optimizer steps to a held-out greedy accuracy.

    PYTHONPATH=src python benchmarks/learning/dynamic_sampling.py            # 2 seeds x 2 settings
    PYTHONPATH=src python benchmarks/learning/dynamic_sampling.py --quick    # 1 seed, fewer steps (a check)

The warm-started addition model (held-out greedy accuracy about 0.37, `rloo.toy.warm_started_addition_model`)
trained with the binary exact-match reward, K=4, 64 completions per step, lr 3e-5: many groups are all
wrong or all right and so have zero spread. Each run trains the same number of optimizer steps with dynamic_sampling off and on
(dynamic_sampling_max_rounds=4) and measures held-out greedy accuracy every `eval_every` steps. It
prints, per setting and seed: the accuracy curve, the first step reaching `--target`, the completions
generated (dynamic sampling generates more per step) and the wall time; and writes the raw numbers to
--out (JSON).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy import addition_split, exact_match_reward, greedy_accuracy, warm_started_addition_model


class HeldOutAccuracy(TrainerCallback):
    """Greedy accuracy on the held-out set every `every` optimizer steps."""

    def __init__(self, trainer_box: dict, held_out, tokenizer, every: int):
        self.box, self.held_out, self.tokenizer, self.every = trainer_box, held_out, tokenizer, every
        self.points: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            trainer = self.box["trainer"]
            model = trainer.accelerator.unwrap_model(trainer.model)
            self.points.append((state.global_step, greedy_accuracy(model, self.tokenizer, self.held_out)))
            model.train()


def run(cache_dir: str, dynamic: bool, seed: int, steps: int, eval_every: int, eval_prompts: int) -> dict:
    train, held_out = addition_split(4000, 500, seed=0)
    held_out = held_out.select(range(eval_prompts))
    model, tokenizer = warm_started_addition_model(cache_dir, verbose=False)
    start = greedy_accuracy(model, tokenizer, held_out)
    box: dict = {}
    callback = HeldOutAccuracy(box, held_out, tokenizer, eval_every)
    with tempfile.TemporaryDirectory() as out:
        config = RLOOConfig(output_dir=out, seed=seed, num_generations=4, per_device_train_batch_size=64,
                            learning_rate=3e-5, lr_scheduler_type="constant", beta=0.0, max_completion_length=5,
                            max_prompt_length=16, max_steps=steps, logging_steps=1, save_steps=0,
                            dynamic_sampling=dynamic, dynamic_sampling_max_rounds=4)
        trainer = RLOOTrainer(model, exact_match_reward, args=config, train_dataset=train, processing_class=tokenizer,
                              callbacks=[callback])
        box["trainer"] = trainer
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
        lines = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    extra = sum(line.get("dynamic_sampling/extra_prompts", 0.0) for line in lines) * config.num_generations
    return dict(dynamic=dynamic, seed=seed, points=[(0, start)] + callback.points, seconds=seconds,
                completions_generated=steps * config.completions_per_step + extra,
                zero_spread=[line["frac_reward_zero_std"] for line in lines],
                dropped=[line.get("dynamic_sampling/dropped_frac") for line in lines])


def first_reaching(points: list[tuple[int, float]], target: float) -> int | None:
    return next((step for step, accuracy in points if accuracy >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--target", type=float, default=None,
                        help="held-out greedy accuracy to reach (default: the warm start's + 0.05)")
    parser.add_argument("--cache_dir", default=str(Path(tempfile.gettempdir()) / "rloo-warm-start"))
    parser.add_argument("--out", default=None, help="JSON file for the raw numbers")
    options = parser.parse_args()
    torch.set_num_threads(1)
    seeds = (0,) if options.quick else (0, 1)
    steps = options.steps or (20 if options.quick else 100)
    eval_every, eval_prompts = (5, 64) if options.quick else (10, 500)
    runs = [run(options.cache_dir, dynamic, seed, steps, eval_every, eval_prompts)
            for seed in seeds for dynamic in (False, True)]
    start = runs[0]["points"][0][1]
    target = options.target if options.target is not None else round(start + 0.05, 3)
    for r in runs:
        name = "dynamic_sampling" if r["dynamic"] else "plain          "
        curve = " ".join(f"{step}:{accuracy:.3f}" for step, accuracy in r["points"])
        print(f"{name} seed {r['seed']}: steps to {target:.3f}: {first_reaching(r['points'], target)}; "
              f"completions generated {r['completions_generated']:.0f}; {r['seconds']:.0f} s; "
              f"mean zero-spread fraction trained {sum(r['zero_spread']) / len(r['zero_spread']):.3f}; curve {curve}",
              flush=True)
    if options.out:
        Path(options.out).write_text(json.dumps(dict(target=target, steps=steps, runs=runs), indent=1))


if __name__ == "__main__":
    main()
