"""`rloo demo`: RLOO that visibly learns, offline, on two CPU cores, in a few minutes.

1. Build a character tokenizer and a ~1.0M-parameter Qwen2 model from a config (no download).
2. Warm-start it with a short supervised run on two-digit addition to partial accuracy
   (62 CPU seconds for seed 0, its expected time printed as it starts; cached, so a second run skips it).
3. Measure greedy accuracy on held-out problems.
4. Train with RLOO and an exact-match reward.
5. Measure held-out greedy accuracy again and say where the run was written.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Sequence

import torch

from rloo.config import RLOOConfig
from rloo.rewards import exact_match
from rloo.run.run_dir import previous_run_files
from rloo.toy.greedy_accuracy import greedy_accuracy
from rloo.toy.tasks import addition_split
from rloo.toy.warm_start import ADDITION_NUM_EVAL, DEMO_WARM_START, warm_started_addition_model
from rloo.trainer import RLOOTrainer

MARKER = ".rloo-demo"  # in an output_dir the demo wrote: a later demo may replace that run


def claim_output_dir(output_dir: str | Path) -> bool:
    """The demo owns its output folder: one holding an earlier demo run (its marker file) is handed
    over to the new run, which replaces it (returns True). A folder holding any other run's files is
    left alone, and the trainer refuses it with its usual message; an empty or new one is marked."""
    directory = Path(output_dir)
    if (directory / MARKER).exists() or (directory / "demo_result.json").exists():  # the latter: older demos
        print(f"replacing the earlier demo run in {directory}")
        return True
    if previous_run_files(directory):
        return False
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text("written by `rloo demo`: a later `rloo demo` replaces the run in this folder\n")
    return False


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rloo" / "demo"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rloo demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/demo", help="Where the run (metrics, model) is written.")
    parser.add_argument("--cache_dir", default=str(default_cache_dir()), help="Where the warm-started model is cached.")
    parser.add_argument("--episodes", type=int, default=8192, help="Completions to sample in total.")
    parser.add_argument("--num_generations", type=int, default=4, help="K, completions per prompt.")
    parser.add_argument("--batch_size", type=int, default=64, help="Completions per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=3e-5, help="RLOO learning rate.")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model).")
    parser.add_argument("--num_eval", type=int, default=ADDITION_NUM_EVAL,
                        help=f"Held-out problems for greedy accuracy (at most {ADDITION_NUM_EVAL}: "
                             "the warm start never saw them).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the data, the warm start and RLOO.")
    parser.add_argument("--task", choices=("addition", "add_tool"), default="addition",
                        help="addition (this demo) or add_tool: four-digit additions with an `add` tool "
                             "(rloo demo --task add_tool --help).")
    return parser


def _task(argv: Sequence[str] | None) -> tuple[str, list[str]]:
    """(the --task chosen, the other arguments): "addition" (this demo) or "add_tool" (`toy.tool_demo`)."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--task", choices=("addition", "add_tool"), default="addition")
    known, rest = chooser.parse_known_args(argv)
    return known.task, rest


def _tool_demo(argv: list[str]) -> dict:
    from rloo.toy.tool_demo import main as tool_demo_main

    return tool_demo_main(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    task, rest = _task(argv)
    if task == "add_tool":  # the tool task has options of its own (rloo demo --task add_tool --help)
        return _tool_demo(rest)
    parser = build_parser()
    options = parser.parse_args(rest)
    if not 1 <= options.num_eval <= ADDITION_NUM_EVAL:
        parser.error(f"--num_eval must be between 1 and {ADDITION_NUM_EVAL}: "
                     "more would include problems the warm start trained on.")
    # OMP_NUM_THREADS, when set, is the user's choice (a shared machine); else every core.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, os.cpu_count() or 1))
    start = time.perf_counter()

    # 1-2. Tiny model, warm-started to partial accuracy (cached).
    model, tokenizer = warm_started_addition_model(options.cache_dir, seed=options.seed, **DEMO_WARM_START)
    train_dataset, eval_dataset = addition_split(num_train=8192, num_eval=options.num_eval, seed=options.seed)

    # 3. Held-out accuracy before RL.
    before = greedy_accuracy(model, tokenizer, eval_dataset)
    print(f"held-out greedy accuracy before RLOO: {before:.3f}")

    # 4. RLOO with an exact-match reward.
    config = RLOOConfig(
        output_dir=options.output_dir,
        overwrite_output_dir=claim_output_dir(options.output_dir),
        seed=options.seed,
        num_generations=options.num_generations,
        per_device_train_batch_size=options.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=options.learning_rate,
        lr_scheduler_type="constant",
        beta=options.beta,
        max_completion_length=5,  # up to three digits and EOS
        max_prompt_length=16,
        temperature=1.0,
        total_episodes=options.episodes,
        logging_steps=16,
        save_steps=0,
        log_completions=True,
        num_completions_to_print=4,
    )
    trainer = RLOOTrainer(model, reward_funcs=exact_match, args=config,
                          train_dataset=train_dataset, processing_class=tokenizer)
    trainer.train()

    # 5. Held-out accuracy after RL.
    after = greedy_accuracy(trainer.accelerator.unwrap_model(trainer.model), tokenizer, eval_dataset)
    elapsed = time.perf_counter() - start
    result = {"accuracy_before": before, "accuracy_after": after, "episodes": trainer.episode, "seconds": elapsed}
    Path(options.output_dir, "demo_result.json").write_text(json.dumps(result, indent=2))
    print(f"\nheld-out greedy accuracy: {before:.3f} -> {after:.3f} "
          f"({options.num_eval} problems, {trainer.episode} episodes, {elapsed:.0f} s)")
    print(f"run written to {Path(options.output_dir).resolve()} (metrics.jsonl, completions.jsonl, model)")
    try:  # the page of plots needs matplotlib, an optional extra
        from rloo.run.report import build_report

        print(f"report: {build_report(options.output_dir).resolve()}")
    except ImportError as error:
        print(f"no report: {error}")
    return result


if __name__ == "__main__":
    main()
