"""A recipe's CPU variant on the real model, trained by rloo and by TRL 1.16 with identical settings.

    python recipes/prepare.py gsm8k smollm2 --gsm8k-dir ../shared/data/gsm8k
    nice -n 10 python benchmarks/recipes/recipes.py --recipe gsm8k --steps 10 --seeds 0 --eval-size 32
    python benchmarks/recipes/recipes.py --recipe gsm8k --steps 40 --set learning_rate=2e-5 --parallel --threads 1
    python benchmarks/recipes/recipes.py --systems rloo --steps 6 --eval-size 0 --rloo-set async_rollouts=true --tag async
    python benchmarks/recipes/recipes.py --steps 3 --eval-size 0 --lora 16 --set learning_rate=1e-4 --tag lora

Both trainers read the same settings from recipes/<recipe>_cpu.yaml (--steps overrides max_steps, --set
KEY=VALUE a shared setting for both, --rloo-set KEY=VALUE rloo's alone; a recipe setting that changes the reward
and that TRL lacks, missing_eos_penalty, is left out when TRL runs), train SmolLM2-135M-Instruct in
a fresh process each with the same seed and threads, and call the same reward functions, which record
what they score (--lora RANK: the same LoRA adapters on every linear layer for both, in place of a full
fine-tune). Each run reports:

- the reward curve: the mean weighted reward of each optimizer step's completions, and each reward
  function's mean;
- held-out: the recipe's reward functions on greedy completions of a fixed subset of its test split (the
  first --eval-size rows): accuracy and format rate (gsm8k), pass@1 (code), the reward model's mean score
  (tldr); before training (once) and after each run, as means and row by row;
- seconds per optimizer step (train() alone; loading and evaluation are outside the clock), wall and
  CPU (user + system: on shared cores wall time measures the neighbours as much as the trainer), the
  peak RSS of the process and its growth during train() (the peak less the RSS once the model is loaded,
  every weight read in, and the trainer built: what training itself adds, the measure the project's memory
  figures use);
- each step's mean completion length and the CPU and wall seconds between two steps' reward calls (one
  step's update and the next one's sampling), plotted against each other: a step's cost grows with its
  completions' length, so trainers whose policies drift to different lengths compare at equal lengths;
- the first held-out completions before and after, to read what was learned.

With --parallel the systems of a seed train at the same time, each with --threads threads (so that
two one-thread runs on a 2-core machine each have a core). --eval-size 0 skips the held-out scores.

Results go to benchmarks/results/recipes_<recipe>[_<tag>].json and docs/recipes_<recipe>[_<tag>].png;
the table and the figures in docs/recipes.md come from these files.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's rloo wins over any installed copy
sys.path.insert(0, str(HERE.parent / "memory"))  # benchmarks/memory/memory.py

from memory import rss_bytes  # noqa: E402  (benchmarks/memory/memory.py)

# Settings both configs share by name; everything else in the recipe is rloo-only or the same default.
SHARED = ["num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
          "temperature", "learning_rate", "lr_scheduler_type", "max_grad_norm", "beta", "reward_weights",
          "max_steps", "seed", "logging_steps", "gradient_checkpointing"]
RLOO_ONLY = ["max_prompt_length", "shared_prefix_forward"]  # no TRL counterpart: rloo's runs take them from the recipe
# Recipe settings that change the reward and that TRL 1.16's RLOOTrainer lacks: left out of a comparison with TRL,
# so both trainers optimise the same reward.
NOT_IN_TRL = ["missing_eos_penalty"]
# What the held-out score is: the recipe's own reward functions on greedy completions (the tldr reward model's
# score is unbounded; the others lie in [0, 1]).
EVAL_FUNCTIONS = {"gsm8k": ("gsm8k_accuracy", "gsm8k_format"), "code": ("code_execution",),
                  "tldr": ("recipes/models/smollm2-tldr-reward",)}


def load_recipe(name: str, steps: int | None, drop: list[str], settings: dict) -> dict:
    recipe = yaml.safe_load((ROOT / "recipes" / f"{name}_cpu.yaml").read_text())
    for key in drop:
        recipe.pop(key, None)
    if steps is not None:
        recipe["max_steps"] = steps
    return {**recipe, **settings}


def key_values(pairs: list[str]) -> dict:
    """["learning_rate=2e-5", "async_rollouts=true"] -> {"learning_rate": 2e-05, "async_rollouts": True} (YAML values)."""
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set / --rloo-set take KEY=VALUE, got {pair!r}")
        parsed = yaml.safe_load(value)
        try:  # YAML reads 2e-5 (no dot) as a string
            values[key] = float(parsed) if isinstance(parsed, str) else parsed
        except ValueError:
            values[key] = parsed
    return values


class RecordingReward:
    """A reward function that records the mean of what it returns, call by call (same for both trainers)."""

    def __init__(self, function, name: str):
        self.function, self.__name__, self.calls = function, name, []
        self.marks = []  # (completions, their tokens, CPU s, wall s) at each call: a clock both trainers share

    def __call__(self, **kwargs):
        values = self.function(**kwargs)
        scored = [v for v in values if v is not None]
        self.calls.append((len(values), sum(scored)))
        tokens = sum(len(ids) for ids in kwargs.get("completion_ids") or [])
        self.marks.append((len(values), tokens, process_cpu_seconds(), time.perf_counter()))
        return values


def step_spans(counts: list[int], per_step: int) -> list[tuple[int, int]]:
    """Completions per reward call -> (first, end) call indices of each optimizer step's `per_step` completions."""
    spans, first, n = [], 0, 0
    for index, count in enumerate(counts):
        n += count
        if n >= per_step:
            spans.append((first, index + 1))
            first, n = index + 1, 0
    return spans


def step_means(calls: list[tuple[int, float]], per_step: int) -> list[float]:
    """Call records -> the mean reward of each optimizer step's `per_step` completions."""
    return [sum(s for _, s in calls[a:b]) / sum(n for n, _ in calls[a:b])
            for a, b in step_spans([n for n, _ in calls], per_step)]


def step_timeline(marks: list[tuple[int, int, float, float]], per_step: int) -> dict:
    """Reward calls -> per optimizer step: the mean completion length, and the CPU and wall seconds from the
    previous step's scoring to this one's (the previous step's update plus this step's sampling)."""
    spans = step_spans([mark[0] for mark in marks], per_step)
    stamps = [marks[b - 1][2:] for _, b in spans]  # (CPU s, wall s) at each step's last reward call
    return {"completion_length": [sum(m[1] for m in marks[a:b]) / sum(m[0] for m in marks[a:b]) for a, b in spans],
            "cpu_seconds": [b[0] - a[0] for a, b in zip(stamps, stamps[1:])],
            "wall_seconds": [b[1] - a[1] for a, b in zip(stamps, stamps[1:])]}


def scorer(spec: str):
    """A recipe's reward_funcs entry as a function: a reward model path becomes rloo's RewardModel (fp32), called
    with prompts and completions alone, so both trainers get the same scores from the same code."""
    from rloo.cli import resolve_reward_func

    resolved = resolve_reward_func(spec)
    if not isinstance(resolved, str):
        return resolved
    from rloo.rewards.reward_model import RewardModel

    model = RewardModel.from_pretrained(str(ROOT / resolved), dtype="float32")
    return lambda prompts, completions, **_: model(prompts, completions)


def reward_functions(recipe: dict) -> list[RecordingReward]:
    return [RecordingReward(scorer(spec), spec.rstrip("/").split("/")[-1]) for spec in recipe["reward_funcs"]]


def held_out(model, tokenizer, recipe_name: str, recipe: dict, rows: list[dict]) -> dict:
    """Greedy completions of the held-out rows, scored by the recipe's eval functions."""
    import torch

    texts = []
    tokenizer.padding_side = "left"
    for start in range(0, len(rows), 16):
        batch = rows[start:start + 16]
        rendered = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in batch]
        inputs = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=recipe["max_completion_length"], do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        texts += tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    scores, per_row = {}, {}
    for name in EVAL_FUNCTIONS[recipe_name]:
        values = [v or 0.0 for v in scorer(name)(completions=texts, prompts=[r["prompt"] for r in rows], **columns)]
        scores[name.split("/")[-1]] = sum(values) / len(values)
        per_row[name.split("/")[-1]] = values  # row by row, so that a larger eval's first rows compare with a smaller one's
    return {"scores": scores, "per_row": per_row, "completions": texts[:4]}


def test_rows(recipe: dict, size: int) -> list[dict]:
    path = ROOT / recipe["dataset_name"] / "test.jsonl"
    with open(path) as lines:
        return [json.loads(line) for _, line in zip(range(size), lines)]


def train_dataset(recipe: dict):
    from rloo.data.loading import load_prompt_dataset

    return load_prompt_dataset(str(ROOT / recipe["dataset_name"]), recipe.get("dataset_split", "train"))


def lora_config(rank: int):
    """The same adapters for both trainers: every linear layer of the decoder, alpha = 2 x rank."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def build_trainer(system: str, recipe: dict, model, tokenizer, rewards, output_dir: str, lora_rank: int = 0):
    shared = {k: recipe[k] for k in SHARED if k in recipe}
    peft_config = lora_config(lora_rank) if lora_rank else None
    if system == "trl":
        from trl import RLOOConfig, RLOOTrainer

        # gradient_checkpointing is on in TRL's defaults and off in rloo's: off for both unless --set turns it on.
        shared.setdefault("gradient_checkpointing", False)
        args = RLOOConfig(**shared, output_dir=output_dir, disable_dropout=True,
                          use_vllm=False, report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                          bf16=False, top_p=1.0, top_k=0, dataloader_num_workers=0, warmup_steps=0, weight_decay=0.0)
        return RLOOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=train_dataset(recipe),
                           processing_class=tokenizer, peft_config=peft_config)
    from rloo import RLOOConfig, RLOOTrainer

    only = {**{k: recipe[k] for k in RLOO_ONLY if k in recipe}, **recipe.get("rloo_only", {})}
    args = RLOOConfig(**shared, **only, output_dir=output_dir, save_steps=0, bf16=False, top_p=1.0, top_k=0,
                      report_to=[], warmup_steps=0, weight_decay=0.0)
    return RLOOTrainer(model, rewards, args=args, train_dataset=train_dataset(recipe), processing_class=tokenizer,
                       peft_config=peft_config)


def load_model(recipe: dict):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    folder = ROOT / recipe["model_name_or_path"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    # The safetensors weights are memory-mapped and read in at first use: read them all now, so that the RSS
    # before train() holds the whole model and the growth in train() is what training adds (for both trainers).
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.sum()
    return model, tokenizer


def process_cpu_seconds() -> float:
    """User + system CPU time of this process and its ended children (async_rollouts' sampler process):
    on shared cores it varies far less than wall time."""
    return sum(usage.ru_utime + usage.ru_stime
               for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def metrics_lines(output_dir: str) -> list[dict]:
    """rloo's per-step metrics.jsonl lines that carry reward-function means (TRL writes none there)."""
    path = Path(output_dir) / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if any(key.startswith("rewards/") and key.endswith("/mean") for key in line)]


def run_worker(spec: dict) -> dict:
    """One process: train once (or only evaluate, system == "base") and measure."""
    import torch

    torch.set_num_threads(spec["threads"])
    recipe = spec["recipe"]
    model, tokenizer = load_model(recipe)
    rows = test_rows(recipe, spec["eval_size"])

    def evaluate() -> dict | None:
        return held_out(model, tokenizer, spec["name"], recipe, rows) if rows else None

    if spec["system"] == "base":
        return {"system": "base", "held_out": evaluate()}
    rewards = reward_functions(recipe)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = build_trainer(spec["system"], recipe, model, tokenizer, rewards, output_dir, spec["lora"])
        rss_before_train_mb = rss_bytes() / 2**20
        start, cpu_start = time.perf_counter(), process_cpu_seconds()
        trainer.train()
        seconds, cpu_seconds = time.perf_counter() - start, process_cpu_seconds() - cpu_start
        logged = metrics_lines(output_dir)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # training's peak; eval adds little
    per_step = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]
    weights = recipe.get("reward_weights") or [1.0] * len(rewards)
    curves = {r.__name__: step_means(r.calls, per_step) for r in rewards}
    if not any(r.calls for r in rewards):  # async_rollouts: the functions ran in the sampler process
        curves = {r.__name__: [line[f"rewards/{r.__name__}/mean"] for line in logged] for r in rewards}
    weighted = [sum(w * curves[r.__name__][i] for w, r in zip(weights, rewards))
                for i in range(min(len(c) for c in curves.values()))]
    return {"system": spec["system"], "seed": recipe["seed"], "steps": recipe["max_steps"],
            "seconds_per_step": seconds / recipe["max_steps"], "cpu_seconds_per_step": cpu_seconds / recipe["max_steps"],
            "peak_rss_mb": peak_rss_mb, "rss_before_train_mb": rss_before_train_mb,
            "growth_in_train_mb": peak_rss_mb - rss_before_train_mb,
            "reward_curve": weighted, "reward_function_curves": curves,
            "step_timeline": step_timeline(rewards[0].marks, per_step),
            "rloo_only": recipe.get("rloo_only", {}) if spec["system"] == "rloo" else {},
            "held_out": evaluate()}


def spawn(spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(spec["threads"]),
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{spec['system']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def moving_average(values: list[float], width: int = 5) -> list[float]:
    """The mean of each value and up to width - 1 before it (one step's 8 completions are noisy)."""
    return [sum(values[max(0, i - width + 1):i + 1]) / len(values[max(0, i - width + 1):i + 1])
            for i in range(len(values))]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_held_out = results["base"]["held_out"] is not None
    with_timeline = any("step_timeline" in run for run in results["runs"])
    panels = 2 + with_held_out + with_timeline
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.8))
    colours = {"rloo": "tab:blue", "trl": "tab:orange"}
    names = list(results["runs"][0]["reward_function_curves"]) if results["runs"] else []
    for run in results["runs"]:
        label, colour = f"{run['system']} seed {run['seed']}", colours.get(run["system"])
        steps = range(1, len(run["reward_curve"]) + 1)
        axes[0].plot(steps, run["reward_curve"], color=colour, alpha=0.25, linewidth=0.8)
        axes[0].plot(steps, moving_average(run["reward_curve"]), color=colour, label=label)
        for name, style in zip(names, ["-", "--", ":", "-."]):
            curve = run["reward_function_curves"][name]
            axes[1].plot(range(1, len(curve) + 1), moving_average(curve), style, color=colour,
                         label=f"{label}: {name}")
    axes[0].set(xlabel="optimizer step", ylabel="mean weighted reward", title="training reward (thick: 5-step mean)")
    axes[1].set(xlabel="optimizer step", ylabel="mean reward", title="each reward function (5-step mean)")
    for axis in axes[:2]:
        axis.legend(fontsize=7)
    if with_held_out:
        held = list(results["base"]["held_out"]["scores"])
        systems = ["base"] + sorted({r["system"] for r in results["runs"]})
        for offset, name in enumerate(held):
            values = [results["base"]["held_out"]["scores"][name]] + [
                sum(r["held_out"]["scores"][name] for r in results["runs"] if r["system"] == s)
                / max(1, sum(r["system"] == s for r in results["runs"])) for s in systems[1:]]
            axes[2].bar([i + 0.4 * offset for i in range(len(systems))], values, width=0.4, label=name)
        axes[2].set_xticks([i + 0.2 for i in range(len(systems))], systems)
        bounded = all(0.0 <= v <= 1.0 for r in [results["base"], *results["runs"]] for v in r["held_out"]["scores"].values())
        axes[2].set(ylim=(0, 1) if bounded else None, ylabel="held-out (greedy)",
                    title=f"held-out, greedy, first {results['eval_size']} test rows")
        axes[2].legend(fontsize=8)
    if with_timeline:  # what a step costs against how long its completions are: per-token and fixed costs apart
        for run in results["runs"]:
            timeline = run.get("step_timeline")
            if timeline:
                lengths = timeline["completion_length"]
                both = [(a + b) / 2 for a, b in zip(lengths, lengths[1:])]  # the update's step and the sampled one
                axes[-1].scatter(both, timeline["cpu_seconds"], s=8,
                                 color=colours.get(run["system"]), label=f"{run['system']} seed {run['seed']}")
        axes[-1].set(xlabel="mean completion length, the two steps (tokens)", ylabel="CPU seconds",
                     title="one step's update + the next step's sampling")
        axes[-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--recipe", default="gsm8k", choices=sorted(EVAL_FUNCTIONS))
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's max_steps)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--systems", nargs="+", default=["trl", "rloo"])
    parser.add_argument("--eval-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drop", nargs="+", default=[], metavar="KEY",
                        help="recipe keys to leave out (their defaults apply), e.g. shared_prefix_forward")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="settings",
                        help=f"a setting for both trainers, one of {SHARED}")
    parser.add_argument("--rloo-set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="an RLOOConfig setting for rloo's runs alone, e.g. async_rollouts=true")
    parser.add_argument("--lora", type=int, default=0, metavar="RANK",
                        help="train LoRA adapters of this rank on every linear layer (both trainers) instead of all weights")
    parser.add_argument("--parallel", action="store_true", help="train a seed's systems at the same time")
    parser.add_argument("--tag", default="", help="suffix of the output files' names")
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(run_worker(json.loads(options.worker))))
        return
    settings = key_values(options.settings)
    if set(settings) - set(SHARED):
        raise SystemExit(f"--set takes settings both trainers share ({SHARED}); use --rloo-set for "
                         f"{sorted(set(settings) - set(SHARED))}")
    drop = options.drop + (NOT_IN_TRL if "trl" in options.systems else [])
    recipe = {**load_recipe(options.recipe, options.steps, drop, settings), "rloo_only": key_values(options.rloo_set)}
    common = {"name": options.recipe, "eval_size": options.eval_size, "threads": options.threads, "lora": options.lora}
    results = {"recipe": options.recipe, "settings": recipe, "left_out": drop, "eval_size": options.eval_size,
               "threads": options.threads, "lora_rank": options.lora,
               "parallel": options.parallel, "base": spawn({**common, "system": "base", "recipe": recipe}), "runs": []}
    if results["base"]["held_out"] is not None:
        print("base", json.dumps(results["base"]["held_out"]["scores"]), flush=True)
    name = f"recipes_{options.recipe}{'_' + options.tag if options.tag else ''}"
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(options.systems) if options.parallel else 1) as pool:
        for seed in options.seeds:
            specs = [{**common, "system": system, "recipe": {**recipe, "seed": seed}} for system in options.systems]
            for run in pool.map(spawn, specs):
                results["runs"].append(run)
                held = run["held_out"]["scores"] if run["held_out"] else "not measured"
                print(f"{run['system']} seed {seed}: {run['seconds_per_step']:.1f} s/step "
                      f"({run['cpu_seconds_per_step']:.1f} CPU s), peak RSS {run['peak_rss_mb']:.0f} MB "
                      f"({run['growth_in_train_mb']:.0f} MB grown in train()), "
                      f"reward {[round(r, 3) for r in run['reward_curve']]}, held-out {held}", flush=True)
                out.write_text(json.dumps(results, indent=1))
    plot(results, ROOT / "docs" / f"{name}.png")
    print(f"wrote {out} and docs/{name}.png")


if __name__ == "__main__":
    main()
