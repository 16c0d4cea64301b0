"""`rloo demo --task add_tool`: RLOO teaches a tiny model to use an `add` tool, offline, on CPU.

1. Build the tool tokenizer and a 0.13M-parameter Qwen2 model from a config (no download).
2. Warm-start it on four-digit additions, showing the tool exchange on 40% of the rows and a bare guess
   (never the sum) on the others, so it cannot learn the sums itself; cached, so the control reuses it.
3. Measure held-out greedy accuracy and tool-call rate (the tool runs when called).
4. Train with RLOO, `tools=[add]` and the exact-match reward on the final answer
   (`--no_tools`, the control: the same prompts, the tool listed but never run).
5. Measure held-out accuracy and tool-call rate again.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from rloo.config import RLOOConfig
from rloo.rewards import exact_match
from rloo.tools import tool_schemas
from rloo.toy.tool_task import (
    MAX_COMPLETION_LENGTH,
    TOOL_FRACTION,
    WARM_START_STEPS,
    add,
    copy_accuracy,
    evaluate_with_tool,
    tool_addition_split,
    warm_started_tool_model,
)
from rloo.trainer import RLOOTrainer


def default_cache_dir() -> Path:
    """`rloo demo`'s cache directory (as `toy.demo.default_cache_dir`; that module imports this one)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rloo" / "demo"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rloo demo --task add_tool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/demo_add_tool", help="Where the run (metrics, model) is written.")
    parser.add_argument("--cache_dir", default=str(default_cache_dir()),
                        help="Where the warm-started model is cached (the control run reuses the tool run's).")
    parser.add_argument("--warm_start_steps", type=int, default=WARM_START_STEPS, help="Supervised steps before RL.")
    parser.add_argument("--tool_fraction", type=float, default=TOOL_FRACTION,
                        help="Warm-start rows that show the tool call (the others answer with a guess, never the sum).")
    parser.add_argument("--episodes", type=int, default=4096, help="Trajectories to sample in total.")
    parser.add_argument("--num_generations", type=int, default=8, help="K, trajectories per prompt.")
    parser.add_argument("--batch_size", type=int, default=32, help="Trajectories per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="RLOO learning rate.")
    parser.add_argument("--num_eval", type=int, default=200, help="Held-out problems.")
    parser.add_argument("--no_tools", action="store_true", help="Train without tools= (the control: same prompts, no tool runs).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the data, the warm start and RLOO.")
    return parser


def demo_config(options: argparse.Namespace) -> tuple[RLOOConfig, list | None]:
    """The RLOO config and `tools=` of a run. The control (`--no_tools`) renders the same prompts, the tool listed
    in them through `chat_template_kwargs` (the warm start only ever saw such prompts), but runs no tool."""
    config = RLOOConfig(
        output_dir=options.output_dir, overwrite_output_dir=True, seed=options.seed,
        num_generations=options.num_generations, per_device_train_batch_size=options.batch_size,
        gradient_accumulation_steps=1, learning_rate=options.learning_rate, lr_scheduler_type="constant", beta=0.0,
        max_completion_length=MAX_COMPLETION_LENGTH, max_prompt_length=64, temperature=1.0,
        total_episodes=options.episodes, logging_steps=4, save_steps=0, max_tool_calling_iterations=1,
        report_to="none", chat_template_kwargs={"tools": tool_schemas([add])} if options.no_tools else None,
    )
    return config, None if options.no_tools else [add]


def run(options: argparse.Namespace) -> dict[str, Any]:
    """Warm start, evaluate, RLOO, evaluate; returns the figures (also written to tool_demo_result.json)."""
    start = time.perf_counter()
    train_dataset, eval_dataset = tool_addition_split(4096, options.num_eval, seed=options.seed)
    model, tokenizer = warm_started_tool_model(train_dataset, seed=options.seed, steps=options.warm_start_steps,
                                               tool_fraction=options.tool_fraction, cache_dir=options.cache_dir,
                                               log_every=100)
    before = evaluate_with_tool(model, tokenizer, eval_dataset)
    copying = copy_accuracy(model, tokenizer, eval_dataset)
    print(f"after warm start (before RLOO): held-out accuracy {before['accuracy']:.3f}, "
          f"tool-call rate {before['tool_call_rate']:.3f}; calls with the prompt's operands "
          f"{copying['operands_right']:.3f}, the tool's result copied into the answer {copying['answer_copied']:.3f}",
          flush=True)
    config, tools = demo_config(options)
    trainer = RLOOTrainer(model, reward_funcs=exact_match, args=config, train_dataset=train_dataset,
                          processing_class=tokenizer, tools=tools)
    trainer.train()
    after = evaluate_with_tool(trainer.accelerator.unwrap_model(trainer.model), tokenizer, eval_dataset)
    print(f"after RLOO: held-out accuracy {after['accuracy']:.3f}, tool-call rate {after['tool_call_rate']:.3f}")
    result = {"seed": options.seed, "tools": not options.no_tools, "before": before, "copying_after_warm_start": copying,
              "after": after,
              "episodes": trainer.episode, "seconds": round(time.perf_counter() - start, 1),
              "torch_threads": torch.get_num_threads()}
    Path(options.output_dir, "tool_demo_result.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    options = build_parser().parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, os.cpu_count() or 1))
    return run(options)
