"""Peak memory and seconds per step of rloo and TRL at real vocabulary sizes and long completions.

    python benchmarks/memory/memory.py                         # lengths 256, 1024, 4096; beta 0 and 0.05; both systems
    python benchmarks/memory/memory.py --quick                 # length 256, beta 0 only
    python benchmarks/memory/memory.py --lengths 256 1024 --systems rloo
    python benchmarks/memory/memory.py --real --betas 0.05     # the real-model row: SmolLM2-135M-Instruct on GSM8K, 128 tokens
    python benchmarks/memory/memory.py --real --betas 0.05 --systems rloo --rloo-option shared_prefix_forward=true

The model is a local Qwen2 with the vocabulary of Qwen2/Qwen3 (151,936 tokens), hidden size 64,
2 layers and random weights, so sampled completions almost never hit EOS and run to the limit:
the logits, not the weights, dominate memory, as they do for real models at long completions.
Each run is a fresh process (one intra-op thread) training `--steps` optimizer steps of 8
completions (2 prompts x K=4), fp32 on CPU, the same hyper-parameters for both systems.

Printed per run: the growth of the resident set across `train()` (the peak RSS during training minus
the RSS when `train()` starts: the weights, optimizer states and data loaded before are not counted),
and seconds per step (sampling included). A run whose RSS passes `--budget-gb` is stopped and
reported as over budget; the longest tested completion length that fits the budget is printed per
system. `--real` trains SmolLM2-135M-Instruct (rloo.assets.smollm2; 134.5M parameters, vocabulary 49,152)
on GSM8K's one-shot prompts (rloo.assets.gsm8k) with a 0/1 correctness reward instead: a real model's
weights, optimizer states and activations, at completion length 128 by default. `--rloo-option
KEY=VALUE` passes an RLOOConfig field to rloo's runs only (recorded with the result). TRL must be
importable (e.g. run this with a venv that has `trl` installed); without it the TRL rows are
reported as not run, with the import error.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # this checkout's rloo wins over any installed copy

VOCAB = 151_936
PAGE = os.sysconf("SC_PAGE_SIZE")
PROMPTS_PER_STEP, K = 2, 4  # 8 completions per optimizer step


def prepare_model(cache_dir: Path, max_positions: int) -> Path:
    """A random Qwen2 with a 151,936-word vocabulary and a word-level tokenizer to match, saved once."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = cache_dir / f"qwen2-v{VOCAB}-h64-l2-p{max_positions}"
    if path.is_dir():
        return path
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=True,
                                      max_position_embeddings=max_positions, pad_token_id=0, eos_token_id=1,
                                      bos_token_id=1)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class RSSWatch:
    """Samples the RSS every 10 ms in a thread; stops the process (one JSON line) past the budget."""

    def __init__(self, budget: int, report: dict):
        self.budget, self.report, self.peak, self.running = budget, report, 0, True
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self):
        while self.running:
            rss = rss_bytes()
            self.peak = max(self.peak, rss)
            if rss > self.budget:
                print(json.dumps({**self.report, "over_budget": True, "rss_mb": rss / 2**20}), flush=True)
                os._exit(0)
            time.sleep(0.01)


def shared_hyperparameters(length: int, beta: float, steps: int, output_dir: str) -> dict:
    return dict(output_dir=output_dir, per_device_train_batch_size=PROMPTS_PER_STEP * K, gradient_accumulation_steps=1,
                num_generations=K, max_completion_length=length, temperature=1.0, top_p=1.0, top_k=0,
                learning_rate=1e-6, beta=beta, num_iterations=1, max_steps=steps, seed=0, bf16=False,
                logging_steps=steps)


def real_prompts_and_reward(count: int):
    """GSM8K's first `count` training problems as one-shot prompts, and the 0/1 correctness reward."""
    from datasets import Dataset

    from rloo.assets.gsm8k import gsm8k_rows
    from rloo.rewards.gsm8k import gsm8k_accuracy

    rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in gsm8k_rows("train", limit=count, one_shot=True)]
    return Dataset.from_list(rows), gsm8k_accuracy


def run_one(system: str, model_dir: str, length: int, beta: float, steps: int, budget_gb: float,
            real: bool = False, rloo_options: dict | None = None) -> dict:
    """Train `steps` steps in this process; return RSS growth across train() and seconds per step."""
    import torch
    import transformers
    from datasets import Dataset

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    report = {"system": system, "length": length, "beta": beta, "model": "smollm2-135m" if real else "qwen2-random",
              **({"rloo_options": rloo_options} if rloo_options and system == "rloo" else {})}
    tokenizer_class = transformers.AutoTokenizer if real else transformers.PreTrainedTokenizerFast  # not Qwen2's BPE
    tokenizer = tokenizer_class.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = Dataset.from_list([{"prompt": " ".join(f"w{(7 * i + j) % 5000 + 2}" for j in range(16))}
                                 for i in range(PROMPTS_PER_STEP * steps)])

    def reward(completions, **kwargs):
        return [float(len(c) % 7) for c in completions]

    if real:
        prompts, reward = real_prompts_and_reward(PROMPTS_PER_STEP * steps)

    with tempfile.TemporaryDirectory() as output_dir:
        hyper = shared_hyperparameters(length, beta, steps, output_dir)
        if system == "trl":
            from trl import RLOOConfig, RLOOTrainer

            config = RLOOConfig(**hyper, gradient_checkpointing=False, disable_dropout=True, use_vllm=False,
                                report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                                dataloader_num_workers=0)
            trainer = RLOOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=prompts,
                                  processing_class=tokenizer)
        else:
            from rloo import RLOOConfig, RLOOTrainer

            trainer = RLOOTrainer(model, reward, args=RLOOConfig(**hyper, save_steps=0, **(rloo_options or {})),
                                  train_dataset=prompts, processing_class=tokenizer)
        watch = RSSWatch(int(budget_gb * 2**30), report)
        before, max_before = rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        watch.thread.start()
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        watch.running = False
    max_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # The kernel's high-water mark is exact; if train() did not raise it, the sampled peak is used.
    peak = max_after if max_after > max_before else watch.peak
    return {**report, "over_budget": False, "rss_growth_mb": (peak - before) / 2**20,
            "rss_before_mb": before / 2**20, "seconds_per_step": seconds / steps}


def spawn(system: str, model_dir: Path, length: int, beta: float, steps: int, budget_gb: float, python: str,
          real: bool = False, rloo_options: dict | None = None) -> dict:
    spec = json.dumps(dict(system=system, model_dir=str(model_dir), length=length, beta=beta, steps=steps,
                           budget_gb=budget_gb, real=real, rloo_options=rloo_options))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([python, __file__, "--worker", spec], capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"system": system, "length": length, "beta": beta, "error": done.stderr.strip()[-600:]}
    return json.loads(lines[-1])


def row(result: dict) -> str:
    head = f"| {result['length']} | {result['beta']} | {result['system']} |"
    if "error" in result:
        return f"{head} failed: {result['error'].splitlines()[-1] if result['error'] else '?'} | |"
    if result["over_budget"]:
        return f"{head} over budget (> {result['rss_mb']:.0f} MB) | |"
    return f"{head} {result['rss_growth_mb']:.0f} | {result['seconds_per_step']:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--systems", nargs="+", default=["rloo", "trl"], choices=["rloo", "trl"])
    parser.add_argument("--quick", action="store_true", help="length 256 and beta 0 only")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budget-gb", type=float, default=8.0)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the runs (e.g. a venv with trl)")
    parser.add_argument("--cache-dir", type=Path, default=HERE.parent / ".cache")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results" / "memory.json", help="raw results (JSON)")
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct on GSM8K prompts (length 128)")
    parser.add_argument("--rloo-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an RLOOConfig field for rloo's runs, e.g. shared_prefix_forward=true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(run_one(**json.loads(options.worker))))
        return
    if options.quick:
        options.lengths, options.betas = [256], [0.0]
    rloo_options = {key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in options.rloo_option)}
    if options.real:
        from rloo.assets.smollm2 import smollm2_folder

        options.lengths = options.lengths if options.lengths != [256, 1024, 4096] else [128]
        model_dir = smollm2_folder()
        print(f"SmolLM2-135M-Instruct on GSM8K one-shot prompts, {PROMPTS_PER_STEP * K} completions/step, fp32 CPU, "
              f"1 thread, {options.steps} steps, rloo options {rloo_options or 'none'}\n")
    else:
        model_dir = prepare_model(options.cache_dir, max(options.lengths) + 64)
        print(f"vocab {VOCAB}, hidden 64, 2 layers, {PROMPTS_PER_STEP * K} completions/step, fp32 CPU, 1 thread, "
              f"{options.steps} steps, budget {options.budget_gb} GB\n")
    print("| completion length | beta | system | RSS growth in train() MB | s/step |\n|---:|---:|---|---:|---:|")
    results = []
    for length in options.lengths:
        for beta in options.betas:
            pair = [spawn(s, model_dir, length, beta, options.steps, options.budget_gb, options.python, options.real,
                          rloo_options) for s in options.systems]
            results += pair
            for result in pair:
                print(row(result), flush=True)
            save(options, results)  # after every pair, so that a run cut short keeps what it measured
            done = {r["system"]: r for r in pair if "rss_growth_mb" in r}
            if len(done) == 2:
                growth = done["rloo"]["rss_growth_mb"] / done["trl"]["rss_growth_mb"]
                print(f"| {length} | {beta} | **rloo/TRL** | **{growth:.2f}x** "
                      f"| {done['rloo']['seconds_per_step'] / done['trl']['seconds_per_step']:.2f}x |", flush=True)
    print()
    longest = {}
    for system in options.systems:
        fits = [r["length"] for r in results if r["system"] == system and r.get("over_budget") is False]
        longest[system] = max(fits) if fits else None
        print(f"{system}: longest tested completion within {options.budget_gb} GB: {longest[system] or 'none'}")
    save(options, results, longest)


def save(options: argparse.Namespace, results: list[dict], longest: dict | None = None) -> None:
    """Write the raw results (one record per run) and the settings to --out as JSON."""
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"budget_gb": options.budget_gb, "steps": options.steps, "vocab": VOCAB,
                                       "completions_per_step": PROMPTS_PER_STEP * K, "longest_within_budget": longest,
                                       "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
