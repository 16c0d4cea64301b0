"""Where a real-model run's memory goes: the process's RSS sampled every 20 ms, labelled with the stage running.

    python recipes/prepare.py gsm8k smollm2 --gsm8k-dir ../shared/data/gsm8k
    python benchmarks/memory/memory_trace.py --recipe gsm8k --steps 2
    python benchmarks/memory/memory_trace.py --recipe gsm8k --steps 2 --rloo-set gradient_checkpointing=true
    python benchmarks/memory/memory_trace.py --recipe gsm8k --steps 2 --lora 16 --tag lora

Trains rloo on a recipe's CPU variant (recipes/<recipe>_cpu.yaml, as benchmarks/recipes/recipes.py runs it, one
thread) and prints each stretch of one stage in order: its label, the RSS when it began, its peak, and its
seconds. Stages: "load" (model and tokenizer), "build" (the trainer), "sample" (the sampler), "score" (the
rest of the rollout: rewards, reference and advantages), "learn" (forward and backward of the micro-batches),
"optimizer" (clipping aside, Adam's step) and "other". The peak of a stage is what it adds on top of what
the stages before it left: e.g. Adam's states appear in the first "optimizer" stretch and stay. Written to
benchmarks/results/memory_trace_<recipe>[_<tag>].json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "recipes"))  # benchmarks/recipes/recipes.py
sys.path.insert(0, str(HERE.parents[1] / "src"))

import recipes  # noqa: E402  (benchmarks/recipes/recipes.py: the recipe loading and trainer building both scripts share)
from memory import rss_bytes  # noqa: E402  (benchmarks/memory/memory.py)

INTERVAL_S = 0.02


class StageTrace:
    """RSS samples labelled with the stage running, in a thread; `stretches()` folds them per stretch."""

    def __init__(self) -> None:
        self.stage, self.samples, self._stop = "load", [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.samples.append((self.stage, rss_bytes() / 2**20))
            time.sleep(INTERVAL_S)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def wrap(self, owner: object, method: str, stage: str) -> None:
        """Label every call of owner.method as `stage` (the stage before it resumes on return)."""
        function = getattr(owner, method)

        def labelled(*args, **kwargs):
            before, self.stage = self.stage, stage
            try:
                return function(*args, **kwargs)
            finally:
                self.stage = before

        setattr(owner, method, labelled)

    def stretches(self) -> list[dict]:
        folded: list[dict] = []
        for stage, rss in self.samples:
            if not folded or folded[-1]["stage"] != stage:
                folded.append({"stage": stage, "rss_start_mb": rss, "peak_mb": rss, "seconds": 0.0})
            folded[-1]["peak_mb"] = max(folded[-1]["peak_mb"], rss)
            folded[-1]["seconds"] += INTERVAL_S
        return folded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=["code", "gsm8k", "tldr"], default="gsm8k")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rloo-set", nargs="+", default=[], metavar="KEY=VALUE", help="an RLOOConfig field for rloo")
    parser.add_argument("--lora", type=int, default=0, metavar="RANK", help="LoRA adapters of this rank (recipes.py --lora)")
    parser.add_argument("--tag", default="")
    options = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    trace = StageTrace()
    trace.start()
    recipe = recipes.load_recipe(options.recipe, options.steps, [], {"rloo_only": recipes.key_values(options.rloo_set)})
    model, tokenizer = recipes.load_model(recipe)
    trace.stage = "build"
    rewards = recipes.reward_functions(recipe)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = recipes.build_trainer("rloo", recipe, model, tokenizer, rewards, output_dir, options.lora)
        trace.wrap(trainer.collector, "collect", "score")
        trace.wrap(trainer.sampler, "sample", "sample")
        trace.wrap(trainer.learner, "accumulate_gradients", "learn")
        trace.wrap(trainer.optimizer, "step", "optimizer")
        trace.stage = "other"
        trainer.train()
    trace.stop()

    stretches = trace.stretches()
    settings = recipes.key_values(options.rloo_set) or "the recipe"
    print(f"{options.recipe}, {options.steps} steps, rloo settings {settings}, LoRA rank {options.lora or 'none'}")
    print("| stage | RSS at start MB | peak MB | seconds |\n|---|---:|---:|---:|")
    for stretch in stretches:
        print(f"| {stretch['stage']} | {stretch['rss_start_mb']:.0f} | {stretch['peak_mb']:.0f} | {stretch['seconds']:.1f} |")
    peak = max(s["peak_mb"] for s in stretches)
    print(f"\npeak {peak:.0f} MB")
    name = f"memory_trace_{options.recipe}" + (f"_{options.tag}" if options.tag else "")
    out = HERE.parent / "results" / f"{name}.json"
    out.write_text(json.dumps({"recipe": options.recipe, "steps": options.steps, "rloo_set": options.rloo_set,
                               "lora": options.lora,
                               "peak_mb": peak, "stretches": stretches}, indent=2) + "\n")
    print(f"wrote {out.relative_to(HERE.parents[1])}")


if __name__ == "__main__":
    main()
