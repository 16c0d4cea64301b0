"""Per-step learning curves of rloo and TRL's RLOOTrainer on the same toy task, over many seeds.

    nice -n 10 python benchmarks/learning/learning_curves.py --seeds 8 --episodes 4096 --jobs 2

Each (system, seed) run is a fresh process (one intra-op thread) that trains `vs_trl.py`'s
short-k4 scenario (two-digit addition, the warm-started toy model, BOS tokenizer, K=4, 32
completions a step, lr 3e-5, beta 0, max_grad_norm 1) and records, for every optimizer step, the
mean reward of the completions it trained on and the gradient norm before clipping (so a step was
clipped when that norm exceeds max_grad_norm), plus held-out greedy accuracy before and after and
the L2 distance the parameters moved (the effective step size). The summary gives seed means with
standard errors, per-step reward curves averaged over the seeds and smoothed, and writes
docs/learning_curves.json and docs/learning_curves.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "speed"))  # benchmarks/speed/vs_trl.py
sys.path.insert(0, str(HERE.parents[1] / "src"))  # this checkout's rloo wins over any installed copy

import vs_trl  # noqa: E402 (the scenario, the model cache, the data and both trainers' settings)

DOCS = HERE.parents[1] / "docs"


def run_one(system: str, scenario: vs_trl.Scenario, model_dir: str, seed: int) -> dict:
    """Train once in this process; per-step reward and gradient norm, held-out before/after."""
    import tempfile

    import transformers

    torch.set_num_threads(vs_trl.THREADS)
    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    start_params = [p.detach().clone() for p in model.parameters()]
    train, held_out = vs_trl.datasets_for(scenario)
    reward = vs_trl.CountingReward(scenario.task, tokenizer)
    before = vs_trl.held_out_score(model, tokenizer, scenario, held_out)
    shared = vs_trl.shared_hyperparameters
    vs_trl.shared_hyperparameters = lambda *a: {**shared(*a), "logging_steps": 1}  # a log entry every step
    build = vs_trl.build_trl_trainer if system == "trl" else vs_trl.build_rloo_trainer
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = build(scenario, model, tokenizer, train, reward, output_dir, seed)
        trainer.train()
        history = list(trainer.state.log_history)
    after = vs_trl.held_out_score(model, tokenizer, scenario, held_out)
    moved = sum(float((p.detach() - q).pow(2).sum()) for p, q in zip(model.parameters(), start_params)) ** 0.5
    grad_norms = [float(e["grad_norm"]) for e in history if "grad_norm" in e]
    return {"system": system, "seed": seed, "held_out_before": before, "held_out_after": after,
            "step_rewards": [c["reward"] for c in reward.calls], "grad_norms": grad_norms, "param_distance": moved}


def spawn(system: str, scenario: vs_trl.Scenario, model_dir: Path, seed: int) -> dict:
    spec = json.dumps({"system": system, "scenario": asdict(scenario), "model_dir": str(model_dir), "seed": seed})
    env = {**os.environ, "OMP_NUM_THREADS": str(vs_trl.THREADS), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", spec], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{system} seed {seed} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


def smooth(values: list[float], width: int) -> list[float]:
    """Trailing moving average over up to `width` steps."""
    return [statistics.fmean(values[max(0, i - width + 1): i + 1]) for i in range(len(values))]


def summarise(runs: list[dict], max_grad_norm: float) -> dict:
    """Per system: held-out and reward-by-quarter means with standard errors, gradient norms, clip
    frequency, parameter distance, and the seed-averaged per-step reward curve."""
    summary = {}
    for system in ("trl", "rloo"):
        mine = [r for r in runs if r["system"] == system]
        steps = min(len(r["step_rewards"]) for r in mine)
        quarter = max(1, steps // 4)
        row = {"seeds": [r["seed"] for r in mine]}
        for key in ("held_out_before", "held_out_after", "param_distance"):
            row[key] = mean_se([r[key] for r in mine])
        row["held_out_gain"] = mean_se([r["held_out_after"] - r["held_out_before"] for r in mine])
        row["reward_by_quarter"] = [mean_se([statistics.fmean(r["step_rewards"][q * quarter:(q + 1) * quarter]) for r in mine])
                                    for q in range(4)]
        norms = [n for r in mine for n in r["grad_norms"]]
        row["grad_norm_mean"] = statistics.fmean(norms) if norms else float("nan")
        row["grad_norm_median"] = statistics.median(norms) if norms else float("nan")
        row["clip_fraction"] = sum(n > max_grad_norm for n in norms) / len(norms) if norms else float("nan")
        row["reward_curve"] = [statistics.fmean(r["step_rewards"][i] for r in mine) for i in range(steps)]
        summary[system] = row
    return summary


def plot(summary: dict, path: Path, width: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for system, colour in (("trl", "tab:blue"), ("rloo", "tab:orange")):
        curve = summary[system]["reward_curve"]
        ax.plot(range(1, len(curve) + 1), smooth(curve, width), color=colour,
                label=f"{system} (mean of {len(summary[system]['seeds'])} seeds, {width}-step average)")
    ax.set_xlabel("optimizer step (32 completions)")
    ax.set_ylabel("mean training reward")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report_lines(summary: dict) -> list[str]:
    lines = []
    for system in ("trl", "rloo"):
        s = summary[system]
        q = ", ".join(f"{m:.3f}±{e:.3f}" for m, e in s["reward_by_quarter"])
        after = f"{s['held_out_after'][0]:.3f}±{s['held_out_after'][1]:.3f}"
        lines.append(f"{system:4s} held-out {s['held_out_before'][0]:.3f} -> {after} "
                     f"(gain {s['held_out_gain'][0]:+.3f}±{s['held_out_gain'][1]:.3f}); reward by quarter {q}; "
                     f"grad norm mean {s['grad_norm_mean']:.3f} median {s['grad_norm_median']:.3f}, "
                     f"clipped {100 * s['clip_fraction']:.1f}% of steps; "
                     f"parameters moved {s['param_distance'][0]:.4f}±{s['param_distance'][1]:.4f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8, help="seeds 0..N-1, each run by both systems")
    parser.add_argument("--seed-list", type=int, nargs="+", help="these seeds instead (e.g. a second sweep from the end)")
    parser.add_argument("--saved-only", action="store_true",
                        help="summarise the runs already saved (seeds that both systems finished); run nothing")
    parser.add_argument("--episodes", type=int, default=4096)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each one thread)")
    parser.add_argument("--smooth", type=int, default=8, help="steps in the plotted moving average")
    parser.add_argument("--cache-dir", type=Path, default=HERE.parent / ".cache")
    parser.add_argument("--out", type=Path, default=DOCS / "learning_curves")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.worker:
        spec = json.loads(options.worker)
        print(json.dumps(run_one(spec["system"], vs_trl.Scenario(**spec["scenario"]), spec["model_dir"], spec["seed"])))
        return

    base = vs_trl.SCENARIOS["short-k4"]
    scenario = replace(base, episodes=options.episodes // base.completions_per_step * base.completions_per_step)
    model_dir = vs_trl.prepare_model(scenario, options.cache_dir)
    seeds = options.seed_list or list(range(options.seeds))
    jobs = [(system, seed) for seed in seeds for system in ("trl", "rloo")]

    runs_dir = options.out.parent / f"{options.out.name}_runs"  # one JSON per run: an interrupted sweep resumes
    runs_dir.mkdir(parents=True, exist_ok=True)

    def go(job):
        saved = runs_dir / f"{job[0]}-{job[1]}-{scenario.episodes}.json"
        if saved.exists():
            return json.loads(saved.read_text())
        run = spawn(job[0], scenario, model_dir, job[1])
        if len(run["step_rewards"]) < scenario.episodes // scenario.completions_per_step:  # stopped by a signal
            raise RuntimeError(f"{job[0]} seed {job[1]} stopped after {len(run['step_rewards'])} steps; not saved")
        saved.write_text(json.dumps(run))
        first, last = statistics.fmean(run["step_rewards"][:12]), statistics.fmean(run["step_rewards"][-12:])
        print(f"{run['system']:4s} seed {run['seed']}: held-out {run['held_out_before']:.3f} -> {run['held_out_after']:.3f}, "
              f"reward first/last 12 steps {first:.3f}/{last:.3f}", flush=True)
        return run

    if options.saved_only:
        done = {seed for seed in seeds if all((runs_dir / f"{system}-{seed}-{scenario.episodes}.json").exists()
                                              for system in ("trl", "rloo"))}
        jobs = [job for job in jobs if job[1] in done]
    with ThreadPoolExecutor(options.jobs) as pool:
        runs = list(pool.map(go, jobs))
    summary = summarise(runs, max_grad_norm=1.0)
    print("\n".join(report_lines(summary)))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.with_suffix(".json").write_text(json.dumps(
        {"scenario": asdict(scenario), "torch": torch.__version__, "trl": __import__("trl").__version__,
         "summary": summary, "runs": runs}, indent=1))
    plot(summary, options.out.with_suffix(".png"), options.smooth)


if __name__ == "__main__":
    main()
