"""A LoRA step on SmolLM2-135M: peak memory of QLoRA (4-bit base) against LoRA (fp32 base), and a step's seconds
with async_rollouts against the synchronous loop.

    PYTHONPATH=src python benchmarks/memory/lora_step.py --json benchmarks/results/lora_step.json
    PYTHONPATH=src python benchmarks/memory/lora_step.py --runs lora qlora --steps 2   # a quick look

Each run is a fresh process: SmolLM2-135M-Instruct (rloo.assets.smollm2) with LoRA r=16, alpha 32 on every linear
layer of the decoder, trained `--steps` optimizer steps of 8 completions (2 prompts x K=4, at most 32 new tokens),
beta 0.04 (the reference: the base with the adapters off), fp32, on CPU
with the in-process sampler. Runs: "lora" (fp32 base), "qlora" (model_init_kwargs load_in_4bit: NF4 base through
bitsandbytes' CPU backend, compute in fp32), "lora_async" (async_rollouts, max_staleness 1: a forked sampler
process). Printed per run: the process's peak resident set during train() (VmHWM after resetting it when train()
starts; an async run's sampler process is not counted, it shares most pages at fork), the resident set before
train() (the loaded model, after malloc_trim returns what loading freed; of it, the mapped file pages), the
policy's weights and buffers
(`get_memory_footprint`), and seconds per optimizer step (wall time of train() / steps, sampling included).
bitsandbytes must be importable for "qlora" (the `quantization` or `dev` extra).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time


def rss_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def digit_fraction(completions, **kwargs):
    texts = [c[-1]["content"] for c in completions]  # conversational: the assistant's message
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]


def run_one(name: str, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from rloo import RLOOConfig, RLOOTrainer
    from rloo.assets.smollm2 import smollm2_folder

    torch.set_num_threads(1)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}]}
                              for a in range(10) for b in range(10)])
    init = {"dtype": "float32", **({"load_in_4bit": True} if name == "qlora" else {})}
    with tempfile.TemporaryDirectory() as out:
        args = RLOOConfig(output_dir=out, model_init_kwargs=init, num_generations=4, per_device_train_batch_size=8,
                          max_completion_length=32, max_steps=steps,
                          learning_rate=1e-4, beta=0.04, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                          async_rollouts=name == "lora_async")
        lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
        trainer = RLOOTrainer(model=str(smollm2_folder()), reward_funcs=digit_fraction, args=args, train_dataset=data,
                              peft_config=lora)
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # return the heap freed while loading (4-bit: the fp32 weights)
        loaded, loaded_file = rss_kib("VmRSS"), rss_kib("RssFile")  # RssFile: mapped file pages (the checkpoint)
        weights = trainer.model.get_memory_footprint() / 2**20
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM (the peak) to the current resident set
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        base = type(trainer.model.base_model.model.model.layers[0].mlp.down_proj.base_layer).__name__
        lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    return {"run": name, "steps": steps, "base_layer": base, "mean_completion_length": sum(lengths) / len(lengths),
            "weights_mib": weights, "rss_loaded_mib": loaded / 1024, "rss_file_loaded_mib": loaded_file / 1024,
            "peak_rss_train_mib": rss_kib("VmHWM") / 1024, "seconds_per_step": seconds / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["lora", "qlora", "lora_async"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.one:
        print("RESULT " + json.dumps(run_one(opts.one, opts.steps)), flush=True)
        return
    results = []
    for name in opts.runs:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        child = subprocess.run([sys.executable, __file__, "--one", name, "--steps", str(opts.steps)], env=env,
                               capture_output=True, text=True)
        lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            print(f"{name} failed:\n{child.stderr[-3000:]}", file=sys.stderr)
            continue
        result = json.loads(lines[0][len("RESULT "):])
        results.append(result)
        print(f"{name:11s} {result['base_layer']:10s} weights {result['weights_mib']:5.0f} MiB  loaded "
              f"{result['rss_loaded_mib']:5.0f} MiB (files {result['rss_file_loaded_mib']:4.0f})  peak in train() "
              f"{result['peak_rss_train_mib']:7.0f} MiB  {result['seconds_per_step']:6.2f} s/step", flush=True)
    if opts.json:
        with open(opts.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
