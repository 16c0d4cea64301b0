"""Learning parity with TRL's RLOOTrainer (issue #52): held-out accuracy after RLOO, paired by seed.

    flock /tmp/rloo-heavy.lock python benchmarks/learning/learning_parity.py --seeds 32 --jobs 2   # all runs, then the summary
    python benchmarks/learning/learning_parity.py --seeds 16 --max-runs 64 --jobs 2   # a chunk: at most 64 new runs (22 min here)
    python benchmarks/learning/learning_parity.py --seeds 32 --summary-only           # summarise the saved runs

One script, both trainers, only the trainer swapped; every setting is given explicitly to both
(`shared_settings`). The task: `a+b=` with a, b in 10..99 (8,100 problems; 1,000 held out, the other
7,100 trained on), a character-level tokenizer that adds BOS (7-token prompts), answers of 2-3
digits and EOS. The model: a Qwen2-style LM, 4 layers, hidden 192, intermediate 768, 6 heads (full
multi-head attention), about 2.4M parameters, warm-started here by supervised training (AdamW, 20-step
warm-up, batches of random training pairs) until its held-out greedy accuracy passes the instance's
target. Two instances (`INSTANCES`) differ in the warm start's seed and target. RLOO then runs 128 steps
of 8 prompts x K=4 (4,096 episodes), lr 3e-5 constant, beta 0, 8 new tokens at most, temperature 1,
top_k 0, top_p 1, max_grad_norm 1, AdamW 0.9/0.999/1e-8 without weight decay, one pass per batch, no
advantage normalisation, fp32, one process; then held-out greedy accuracy on the 1,000 problems, by the
same code for both trainers (`held_out_accuracy`; also by transformers' greedy `generate`, as a check).

Each (instance, system, seed) is a fresh one-thread process, deterministic per seed, saved as one JSON
under --runs-dir (benchmarks/.cache/, not committed) as soon as it finishes, so a sweep stopped between
runs resumes where it stopped and sweeps run in chunks add up. The warm starts are cached there too.
The summary pairs TRL and rloo by (instance, seed) and reports the mean paired difference with its 95%
t interval, a paired t-test and a Wilcoxon signed-rank test, per instance and pooled, and the same for
training-side figures (`TRAINING_FIGURES`); it writes --out: every run's accuracies and per-step
records, and whether both trainers drew the same prompts at every step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # this checkout's rloo wins over any installed copy

MODEL = dict(hidden_size=192, num_layers=4, num_heads=6, num_kv_heads=6, intermediate_size=768)
NUM_HELD_OUT = 1000
SPLIT_SEED = 52
# name -> (warm-start seed, held-out greedy accuracy the warm start must reach)
INSTANCES = {"A": (0, 0.27), "B": (1, 0.37)}
# Held-out accuracy is checked every `check_every` steps, then every step from half the target on: the model
# learns addition in a sudden phase change (about +0.02 a step), so a coarser check overshoots the target.
WARM_START = dict(batch_size=64, learning_rate=5e-4, max_steps=3000, check_every=10)
RL = dict(steps=128, num_generations=4, prompts_per_step=8, max_new_tokens=8, learning_rate=3e-5)


# ---------------------------------------------------------------------------------------------
# Task, evaluation, warm start
# ---------------------------------------------------------------------------------------------


def parity_split():
    """(train, held_out) Datasets of "a+b=" -> "a+b" with a, b in 10..99, disjoint, fixed by SPLIT_SEED."""
    from datasets import Dataset

    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(SPLIT_SEED).shuffle(pairs)

    def rows(chosen):
        return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in chosen], "answer": [str(a + b) for a, b in chosen]})

    return rows(pairs[NUM_HELD_OUT:]), rows(pairs[:NUM_HELD_OUT])


def held_out_accuracy(model, tokenizer, held_out, path: str = "fast") -> float:
    """Greedy exact-match accuracy on `held_out`, the same code whichever trainer trained `model`.

    path "fast": rloo.toy.greedy_completions (rloo's sampler with sampling off); "generate":
    transformers' `generate(do_sample=False)` on the left-padded prompts as the tokenizer encodes them.
    """
    from rloo.toy import greedy_completions

    prompts, answers = list(held_out["prompt"]), list(held_out["answer"])
    if path == "fast":
        texts = greedy_completions(model, tokenizer, prompts, max_new_tokens=RL["max_new_tokens"])
    else:
        model.eval()
        texts = []
        with torch.no_grad():
            for start in range(0, len(prompts), 250):
                batch = tokenizer(prompts[start:start + 250], return_tensors="pt", padding=True)
                out = model.generate(**batch, do_sample=False, max_new_tokens=RL["max_new_tokens"],
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
                texts += [t.strip() for t in tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:],
                                                                     skip_special_tokens=True)]
    return sum(t == a for t, a in zip(texts, answers)) / len(answers)


def warm_start(instance: str, cache_dir: Path) -> Path:
    """The instance's warm-started model and tokenizer, trained once and saved under cache_dir.

    Teacher forcing on prompt + answer + EOS (loss on answer and EOS), rloo.toy.warm_start's batch,
    optimizer (AdamW, 20-step linear warm-up, then constant) and step (clip at 1); held-out greedy
    accuracy is checked every WARM_START["check_every"] steps (every step from half the target on) and
    training stops once it reaches the target.
    """
    from rloo.toy import build_char_tokenizer, build_tiny_model
    from rloo.toy.warm_start import _optimizer_step, _optimizer_with_warmup, _ShuffledBatches, _teacher_forcing_batch

    seed, target = INSTANCES[instance]
    path = cache_dir / f"parity-warm-{instance}-s{seed}-t{target}"
    if (path / "warm_start.json").exists():
        return path
    torch.set_num_threads(1)
    train, held_out = parity_split()
    tokenizer = build_char_tokenizer(add_bos=True)
    model = build_tiny_model(tokenizer, seed=seed, **MODEL)
    prompts, answers = list(train["prompt"]), list(train["answer"])
    batches = _ShuffledBatches(len(prompts), WARM_START["batch_size"], seed)
    optimizer, scheduler = _optimizer_with_warmup(model, WARM_START["learning_rate"])
    start, accuracy, step = time.perf_counter(), 0.0, 0
    while step < WARM_START["max_steps"] and accuracy < target:
        model.train()
        for _ in range(WARM_START["check_every"] if accuracy < target / 2 else 1):
            indices = batches.next()
            _optimizer_step(model, optimizer, scheduler,
                            _teacher_forcing_batch(tokenizer, [prompts[i] for i in indices], [answers[i] for i in indices]))
            step += 1
        accuracy = held_out_accuracy(model, tokenizer, held_out)
        if step % 50 == 0:
            print(f"warm start {instance}: step {step}, held-out {accuracy:.3f}", flush=True)
    model.zero_grad(set_to_none=True)
    model.eval()
    record = {"instance": instance, "seed": seed, "target": target, "steps": step, "held_out_accuracy": accuracy,
              "num_params": sum(p.numel() for p in model.parameters()), "seconds": time.perf_counter() - start,
              **{f"warm_start_{k}": v for k, v in WARM_START.items()}}
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "warm_start.json").write_text(json.dumps(record, indent=1))
    print(f"warm start {instance}: {record}", flush=True)
    return path


# ---------------------------------------------------------------------------------------------
# One RL run (the worker)
# ---------------------------------------------------------------------------------------------


def shared_settings(output_dir: str, seed: int) -> dict:
    """Every setting that matters, under the names both configs share, given to both trainers."""
    return dict(
        output_dir=output_dir, seed=seed, max_steps=RL["steps"],
        per_device_train_batch_size=RL["prompts_per_step"] * RL["num_generations"],  # completions, in both
        gradient_accumulation_steps=1, num_generations=RL["num_generations"],
        max_completion_length=RL["max_new_tokens"], temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=RL["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=0.2, normalize_advantages=False,
        mask_truncated_completions=False, shuffle_dataset=True, bf16=False, gradient_checkpointing=False,
        disable_dropout=True, logging_steps=1, report_to="none",
    )


class Recorder:
    """The reward (exact match), recording each call's prompts, rewards and completion lengths."""

    __name__ = "exact_match"

    def __init__(self, eos_id: int, max_new_tokens: int):
        self.eos_id, self.max_new_tokens = eos_id, max_new_tokens
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs):
        from rloo.rewards import exact_match

        rewards = [float(r) for r in exact_match(completions, answer)]
        self.calls.append({
            "prompts": list(dict.fromkeys(prompts)), "reward": statistics.fmean(rewards),
            "length": statistics.fmean(len(ids) for ids in completion_ids),
            "truncated": statistics.fmean(float(len(ids) == self.max_new_tokens and ids[-1] != self.eos_id)
                                          for ids in completion_ids)})
        return rewards


def build_trainer(system: str, model, tokenizer, train, reward, output_dir: str, seed: int):
    settings = shared_settings(output_dir, seed)
    if system == "trl":
        from trl import RLOOConfig, RLOOTrainer

        config = RLOOConfig(**settings, use_vllm=False, save_strategy="no", disable_tqdm=True,
                            use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0)
        return RLOOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train, processing_class=tokenizer)
    from rloo import RLOOConfig, RLOOTrainer

    config = RLOOConfig(**settings, save_steps=0, disable_tqdm=True)
    return RLOOTrainer(model, reward, args=config, train_dataset=train, processing_class=tokenizer)


def run_one(system: str, model_dir: str, seed: int) -> dict:
    """Train once in this process; held-out accuracy before and after, and per-step records."""
    import torch.optim.optimizer as torch_optimizer
    import transformers

    from rloo.model_loading import load_tokenizer

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    tokenizer = load_tokenizer(model_dir, "warm start")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    train, held_out = parity_split()
    before = held_out_accuracy(model, tokenizer, held_out)
    reward = Recorder(tokenizer.eos_token_id, RL["max_new_tokens"])
    applied_lr: list[float] = []
    hook = torch_optimizer.register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: applied_lr.append(optimizer.param_groups[0]["lr"]))
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as output_dir:
            trainer = build_trainer(system, model, tokenizer, train, reward, output_dir, seed)
            trainer.train()
            history = list(trainer.state.log_history)
    finally:
        hook.remove()
    seconds = time.perf_counter() - start
    index = {p: i for i, p in enumerate(train["prompt"])}
    return {
        "system": system, "seed": seed, "seconds": seconds,
        "held_out_before": before, "held_out_after": held_out_accuracy(model, tokenizer, held_out),
        "held_out_after_generate": held_out_accuracy(model, tokenizer, held_out, "generate"),
        "step_prompts": [[index[p] for p in c["prompts"]] for c in reward.calls],
        "step_rewards": [c["reward"] for c in reward.calls],
        "step_lengths": [c["length"] for c in reward.calls],
        "step_truncated": [c["truncated"] for c in reward.calls],
        "grad_norms": [float(e["grad_norm"]) for e in history if "grad_norm" in e],
        "applied_lr": applied_lr,
    }


# ---------------------------------------------------------------------------------------------
# The driver and the paired statistics
# ---------------------------------------------------------------------------------------------


def spawn(system: str, model_dir: Path, seed: int) -> dict:
    spec = json.dumps({"system": system, "model_dir": str(model_dir), "seed": seed})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", spec], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{system} seed {seed} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def paired(differences: list[float]) -> dict:
    """Mean paired difference, its 95% t interval, a paired t-test and a Wilcoxon signed-rank test."""
    from scipy import stats

    n = len(differences)
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    half = stats.t.ppf(0.975, n - 1) * sd / n**0.5
    t = stats.ttest_1samp(differences, 0.0)
    wilcoxon = stats.wilcoxon(differences) if any(differences) else None
    return {"n": n, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half], "t": float(t.statistic),
            "p_t": float(t.pvalue), "p_wilcoxon": None if wilcoxon is None else float(wilcoxon.pvalue),
            "rloo_lower": sum(d < 0 for d in differences), "equal": sum(d == 0 for d in differences),
            "rloo_higher": sum(d > 0 for d in differences)}


# Per-run figures of the training side, paired like the accuracy: a sampler drawing from another
# distribution, or a different loss on short or truncated completions, would show here first.
TRAINING_FIGURES = {
    "mean_step_reward": lambda run: statistics.fmean(run["step_rewards"]),
    "mean_completion_length": lambda run: statistics.fmean(run["step_lengths"]),
    "truncated_fraction": lambda run: statistics.fmean(run["step_truncated"]),
    "median_grad_norm": lambda run: statistics.median(run["grad_norms"]),
}


def summarise(runs: dict, instances: list[str], seeds: list[int], key="held_out_after") -> dict:
    """Per instance and pooled: each system's mean of `key` (a run's field, or a function of the run), and
    the paired rloo - TRL difference."""
    value = key if callable(key) else (lambda run: run[key])
    summary, pooled = {}, []
    for instance in instances:
        pairs = [(value(runs[(instance, "trl", s)]), value(runs[(instance, "rloo", s)])) for s in seeds
                 if (instance, "trl", s) in runs and (instance, "rloo", s) in runs]
        if len(pairs) < 2:
            continue
        differences = [r - t for t, r in pairs]
        pooled += differences
        summary[instance] = {"trl_mean": statistics.fmean(t for t, _ in pairs),
                             "rloo_mean": statistics.fmean(r for _, r in pairs), "paired": paired(differences)}
    if len(summary) > 1:
        summary["pooled"] = {"paired": paired(pooled)}
    return summary


def print_summary(runs: dict, instances: list[str], seeds: list[int], summary: dict) -> None:
    for instance in instances:
        mine = {(sy, s): r for (i, sy, s), r in runs.items() if i == instance}
        if not mine:
            continue
        start = next(iter(mine.values()))["held_out_before"]
        print(f"\ninstance {instance} (start {start:.3f})")
        print("| system | " + " | ".join(str(s) for s in seeds) + " | mean |")
        for system in ("trl", "rloo"):
            values = [mine[(system, s)]["held_out_after"] if (system, s) in mine else None for s in seeds]
            done = [v for v in values if v is not None]
            mean = f"{statistics.fmean(done):.3f}" if done else "-"
            print(f"| {system} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in values) + f" | {mean} |")
    for name, row in summary.items():
        p = row["paired"]
        wilcoxon = "n/a" if p["p_wilcoxon"] is None else f"{p['p_wilcoxon']:.3f}"
        print(f"{name}: rloo - TRL = {p['mean']:+.4f} (95% CI {p['ci95'][0]:+.4f} .. {p['ci95'][1]:+.4f}, sd {p['sd']:.4f}), "
              f"t = {p['t']:.2f} (p {p['p_t']:.3f}), Wilcoxon p {wilcoxon}; "
              f"rloo lower in {p['rloo_lower']}, equal {p['equal']}, higher {p['rloo_higher']} of {p['n']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", nargs="+", default=list(INSTANCES), choices=list(INSTANCES))
    parser.add_argument("--seeds", type=int, default=16, help="seeds 0..N-1, each run by both trainers")
    parser.add_argument("--seed-list", type=int, nargs="+", help="these seeds instead")
    parser.add_argument("--systems", nargs="+", default=["trl", "rloo"], choices=["trl", "rloo"])
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one thread each)")
    parser.add_argument("--max-runs", type=int, default=None, help="run at most this many new runs, then summarise")
    parser.add_argument("--summary-only", action="store_true", help="summarise the saved runs; run nothing")
    parser.add_argument("--cache-dir", type=Path, default=HERE.parent / ".cache")
    parser.add_argument("--runs-dir", type=Path, default=HERE.parent / ".cache" / "learning_parity_runs")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results" / "learning_parity.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.worker:
        spec = json.loads(options.worker)
        print(json.dumps(run_one(spec["system"], spec["model_dir"], spec["seed"])))
        return

    seeds = options.seed_list or list(range(options.seeds))
    options.runs_dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for file in options.runs_dir.glob("*.json"):
        run = json.loads(file.read_text())
        runs[(run["instance"], run["system"], run["seed"])] = run
    if not options.summary_only:
        model_dirs = {instance: warm_start(instance, options.cache_dir) for instance in options.instances}
        todo = [(i, sy, s) for s in seeds for i in options.instances for sy in options.systems if (i, sy, s) not in runs]
        todo = todo[:options.max_runs] if options.max_runs is not None else todo

        def go(job):
            instance, system, seed = job
            run = {"instance": instance, **spawn(system, model_dirs[instance], seed)}
            if len(run["step_rewards"]) != RL["steps"]:
                raise RuntimeError(f"{job} ran {len(run['step_rewards'])} steps, not {RL['steps']}; not saved")
            (options.runs_dir / f"{instance}-{system}-{seed}.json").write_text(json.dumps(run))
            print(f"{instance} {system:4s} seed {seed:2d}: held-out {run['held_out_before']:.3f} -> {run['held_out_after']:.3f} "
                  f"(generate {run['held_out_after_generate']:.3f}), {run['seconds']:.0f} s", flush=True)
            runs[job] = run

        with ThreadPoolExecutor(options.jobs) as pool:
            list(pool.map(go, todo))
    summary = summarise(runs, options.instances, seeds)
    print_summary(runs, options.instances, seeds, summary)
    for name, figure in TRAINING_FIGURES.items():
        row = summarise(runs, options.instances, seeds, figure).get("pooled", {}).get("paired")
        if row:
            print(f"{name}: rloo - TRL = {row['mean']:+.4f} (95% CI {row['ci95'][0]:+.4f} .. {row['ci95'][1]:+.4f}), "
                  f"t = {row['t']:.2f}")
    warm = {i: json.loads((p / "warm_start.json").read_text()) for i in options.instances
            if (p := options.cache_dir / f"parity-warm-{i}-s{INSTANCES[i][0]}-t{INSTANCES[i][1]}").exists()}
    options.out.write_text(json.dumps({
        "torch": torch.__version__, "trl": __import__("trl").__version__, "model": MODEL, "rl": RL,
        "instances": INSTANCES, "warm_starts": warm, "seeds": seeds, "summary": summary,
        "summary_generate_eval": summarise(runs, options.instances, seeds, "held_out_after_generate"),
        "summary_training": {name: summarise(runs, options.instances, seeds, figure)
                             for name, figure in TRAINING_FIGURES.items()},
        "same_prompts_every_step": same_prompts(runs),
        "runs": [{k: v for k, v in runs[key].items() if k != "step_prompts"} for key in sorted(runs)]}, indent=1))


def same_prompts(runs: dict) -> dict:
    """Per instance, whether TRL and rloo trained on the same prompts at every step for every seed both ran."""
    pairs = {}
    for (instance, system, seed), run in runs.items():
        if system == "trl" and (instance, "rloo", seed) in runs:
            pairs.setdefault(instance, []).append(run["step_prompts"] == runs[(instance, "rloo", seed)]["step_prompts"])
    return {instance: all(same) for instance, same in pairs.items()}


if __name__ == "__main__":
    main()
