"""Would `torch_compile` (TRL's field) speed rloo up on CPU? A short run with and without torch.compile.

    python benchmarks/speed/torch_compile.py [--model tiny|smollm2] [--steps 6] [--mode default]

Each side trains the same RLOOTrainer run (the toy addition task, K=4, 8 completions per step, completions of
up to --completion-length tokens, seed 0), in a process of its own with one thread; the compiled side calls
`model.compile(dynamic=True)` on the decoder (`model.model`: the module every forward of the sampler and of the
trainer runs, prefill, decode steps and training passes alike) before building the trainer, as transformers'
Trainer compiles the model it wraps. Printed per side: the first optimizer step's seconds (compilation lands
there), the mean of the later steps, the whole run, and how many graphs torch._dynamo compiled. Written to
benchmarks/results/torch_compile_<model>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one_side(model_name: str, compiled: bool, steps: int, completion_length: int, mode: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from rloo import RLOOConfig, RLOOTrainer
    from rloo.toy.models import build_tiny_model
    from rloo.toy.tasks import addition_dataset, char_match_reward
    from rloo.toy.tokenizer import build_char_tokenizer

    torch.manual_seed(0)
    if model_name == "smollm2":
        from rloo.toy.smollm2 import smollm2_folder

        folder = smollm2_folder()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer)
    if compiled:
        model.model.compile(dynamic=True, mode=None if mode == "default" else mode)

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            now = time.perf_counter()
            times.append(now - self.last)
            self.last = now
            print(f"step {len(times)}: {times[-1]:.1f} s", file=sys.stderr, flush=True)

    import tempfile

    args = RLOOConfig(output_dir=tempfile.mkdtemp(prefix="rloo-compile-"), per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=completion_length, learning_rate=1e-5, beta=0.0,
                      max_steps=steps, logging_steps=steps, save_steps=0, seed=0, disable_tqdm=True)
    trainer = RLOOTrainer(model, char_match_reward, args=args, train_dataset=addition_dataset(64, seed=0),
                          processing_class=tokenizer, callbacks=[StepTimer()])
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"] if compiled else 0
    return {"compiled": compiled, "first_step_s": times[0], "later_steps_mean_s": sum(times[1:]) / max(1, len(times) - 1),
            "run_s": total, "graphs_compiled": frames}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--completion-length", type=int, default=16)
    parser.add_argument("--mode", default="default", help="torch.compile mode (default, reduce-overhead, max-autotune)")
    parser.add_argument("--side", choices=("eager", "compiled"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(one_side(args.model, args.side == "compiled", args.steps, args.completion_length, args.mode)))
        return 0
    results = {}
    for side in ("eager", "compiled"):
        command = [sys.executable, __file__, "--side", side, "--model", args.model, "--steps", str(args.steps),
                   "--completion-length", str(args.completion_length), "--mode", args.mode]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env)
        if done.returncode:
            results[side] = {"error": f"exit status {done.returncode}"}
        else:
            results[side] = json.loads(done.stdout.strip().splitlines()[-1])
        print(side, results[side], flush=True)
    out = HERE.parent / "results" / f"torch_compile_{args.model}.json"
    out.write_text(json.dumps({"steps": args.steps, "completion_length": args.completion_length, "mode": args.mode,
                               **results}, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
