"""Advantage estimators on the offline demo task: gradient variance and bias, then learning curves.

    PYTHONPATH=src python benchmarks/learning/estimators.py            # full (about 10 minutes on one core)
    PYTHONPATH=src python benchmarks/learning/estimators.py --quick    # a check (1-2 minutes)

Part 1, the policy-gradient estimate of ONE FIXED policy (the warm-started addition model, exact-match
reward). A batch is B completions: B/K prompts drawn uniformly from a fixed set of prompts, K samples
each. For each estimator, the batch gradient is g = (1/B) sum_i A_i grad log pi(y_i|x_i), taken over
the parameters of the last decoder layer and projected onto D random Gaussian directions scaled by
1/sqrt(D), so that squared norms and dot products estimate those of the full layer gradient.

  reference  g* = for every prompt of the set, M independent samples with the leave-one-out baseline
             over all M (unbiased for the true gradient, low variance), averaged over the prompts.
  mse        mean over batches of ||g - g*||^2  (variance + bias^2 + the reference's own error).
  bias       ||mean over batches of g - g*||, next to its noise floor sqrt(mse / N).
  cos        cosine between the mean batch gradient and g*.
  scale      (E g . g*) / ||g*||^2: 1 for an unbiased estimator, (K-1)/K for the self-inclusive mean.
  rel. var   variance / (E g . g*/||g*||)^2: the noise per unit of useful signal, which compares
             estimators that differ only by a scale (drgrpo is exactly (K-1)/K times rloo, batch by batch).

"drgrpo" is exactly the baseline "mean that includes the sample itself" (r_i - mean(r)), the one
the RLOO paper argues against: its expectation is (K-1)/K times the true gradient.

Part 2, learning curves: RLOOTrainer from the same warm start, each estimator at equal episodes over
a few seeds, held-out sampled reward (eval/reward) against episodes.

Writes docs/estimators.md (tables), docs/estimators.png (plots) and docs/estimators.json (raw numbers);
--quick writes to a temporary directory instead (see --docs_dir).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.algo.advantages import compute_advantages
from rloo.generation import GenerateSampler
from rloo.passes.logprobs import completion_logprobs
from rloo.toy import addition_split, exact_match_reward, greedy_accuracy, warm_started_addition_model

ESTIMATORS = ("rloo", "grpo", "drgrpo", "reinforce", "reinforce_pp")
# The gradient study adds REINFORCE on the reward shifted by -1 (0 for a right answer, -1 for a wrong
# one): the same task, but with an offset that every baseline cancels and plain REINFORCE does not.
STUDIED = ESTIMATORS + ("reinforce_offset",)
LABELS = {"drgrpo": "drgrpo (= r - mean incl. self)", "reinforce_offset": "reinforce on r - 1"}
ROOT = Path(__file__).resolve().parents[2]


def settings(quick: bool) -> dict:
    if quick:
        return dict(ks=(2, 4), batch=16, batches=40, prompts=32, ref_samples=32, directions=32,
                    curve_estimators=("rloo", "reinforce"), seeds=(0,), episodes=256, curve_batch=32, eval_prompts=32)
    return dict(ks=(2, 4, 8), batch=32, batches=200, prompts=64, ref_samples=128, directions=64,
                curve_estimators=ESTIMATORS, seeds=(0, 1), episodes=6144, curve_batch=64, eval_prompts=64)


class ProjectedGradient:
    """Gradients of a scalar w.r.t. a few parameters, projected onto fixed random directions."""

    def __init__(self, params: list[torch.nn.Parameter], directions: int, seed: int = 0):
        self.params = params
        size = sum(p.numel() for p in params)
        generator = torch.Generator().manual_seed(seed)
        self.projection = torch.randn(directions, size, generator=generator) / math.sqrt(directions)  # (D, N)

    def __call__(self, scalar: torch.Tensor, retain_graph: bool) -> torch.Tensor:
        grads = torch.autograd.grad(scalar, self.params, retain_graph=retain_graph)
        return self.projection @ torch.cat([g.reshape(-1) for g in grads])  # (D,)


def sample_and_score(model, tokenizer, sampler, prompts: list[str], answers: list[str], k: int):
    """(n*k,) seq log-probs with grad and (n*k,) rewards for k samples of each prompt."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    batch = sampler.sample(model, ids, k)
    texts = tokenizer.batch_decode([row[m.bool()].tolist() for row, m in zip(batch.completion_ids, batch.completion_mask)],
                                   skip_special_tokens=True)
    rewards = torch.tensor(exact_match_reward(texts, [a for a in answers for _ in range(k)]))
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    logps, _ = completion_logprobs(model, input_ids, attention, batch.completion_ids.shape[1])
    return (logps * batch.completion_mask).sum(dim=1), rewards


def reference_gradient(model, tokenizer, sampler, project, prompts, answers, samples: int) -> torch.Tensor:
    """Leave-one-out over `samples` completions of every prompt, averaged over prompts."""
    total = torch.zeros(project.projection.shape[0])
    chunk = max(1, 256 // samples)
    for start in range(0, len(prompts), chunk):
        seq_logps, rewards = sample_and_score(model, tokenizer, sampler, prompts[start:start + chunk],
                                              answers[start:start + chunk], samples)
        advantages = compute_advantages(rewards.view(-1, samples), "rloo").view(-1)
        total += project((advantages * seq_logps).sum() / samples, retain_graph=False)
    return total / len(prompts)


def gradient_study(model, tokenizer, s: dict) -> list[dict]:
    train, _ = addition_split(4000, 500, seed=0)
    prompt_set = train.select(range(s["prompts"]))
    prompts, answers = list(prompt_set["prompt"]), list(prompt_set["answer"])
    sampler = GenerateSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                              max_new_tokens=5)
    layer = model.model.layers[-1]
    project = ProjectedGradient([p for p in layer.parameters()], s["directions"])
    torch.manual_seed(0)
    start = time.perf_counter()
    reference = reference_gradient(model, tokenizer, sampler, project, prompts, answers, s["ref_samples"])
    print(f"reference gradient: norm {reference.norm():.4g} ({time.perf_counter() - start:.0f} s)", flush=True)
    rows = []
    generator = torch.Generator().manual_seed(1)
    for k in s["ks"]:
        grads = {name: [] for name in STUDIED}
        success = []
        for _ in range(s["batches"]):
            picked = torch.randint(len(prompts), (s["batch"] // k,), generator=generator).tolist()
            seq_logps, rewards = sample_and_score(model, tokenizer, sampler, [prompts[i] for i in picked],
                                                  [answers[i] for i in picked], k)
            success.append(rewards.mean().item())
            for index, name in enumerate(STUDIED):
                if name == "reinforce_offset":
                    advantages = compute_advantages(rewards.view(-1, k) - 1.0, "reinforce").view(-1)
                else:
                    advantages = compute_advantages(rewards.view(-1, k), name).view(-1)
                last = index == len(STUDIED) - 1
                grads[name].append(project((advantages * seq_logps).sum() / s["batch"], retain_graph=not last))
        for name in STUDIED:
            g = torch.stack(grads[name])  # (N, D)
            mean = g.mean(dim=0)
            mse = ((g - reference) ** 2).sum(dim=1).mean().item()
            variance = ((g - mean) ** 2).sum(dim=1).mean().item()
            along = (mean @ reference / reference.norm()).item()  # the mean's component along g*
            rows.append(dict(estimator=name, k=k, mse=mse, variance=variance,
                             scale=along / reference.norm().item(), relative_variance=variance / max(along ** 2, 1e-30),
                             bias=(mean - reference).norm().item(), noise_floor=math.sqrt(mse / len(g)),
                             cos=torch.nn.functional.cosine_similarity(mean, reference, dim=0).item(),
                             ref_norm=reference.norm().item(), success=statistics.mean(success)))
        print(f"K={k}: done ({time.perf_counter() - start:.0f} s)", flush=True)
    return rows


def learning_curves(cache_dir: str, s: dict) -> dict:
    train, held_out = addition_split(4000, 500, seed=0)
    eval_set = held_out.select(range(s["eval_prompts"]))
    curves = {}
    for name in s["curve_estimators"]:
        for seed in s["seeds"]:
            model, tokenizer = warm_started_addition_model(cache_dir, verbose=False)
            with tempfile.TemporaryDirectory() as out:
                steps = s["episodes"] // s["curve_batch"]
                config = RLOOConfig(output_dir=out, seed=seed, advantage_estimator=name, num_generations=4,
                                    per_device_train_batch_size=s["curve_batch"], learning_rate=3e-5,
                                    lr_scheduler_type="constant", beta=0.0, max_completion_length=5,
                                    max_prompt_length=16, max_steps=steps, logging_steps=steps, save_steps=0,
                                    eval_steps=max(1, steps // 6))
                trainer = RLOOTrainer(model, exact_match_reward, args=config, train_dataset=train,
                                      eval_dataset=eval_set, processing_class=tokenizer)
                start_reward = trainer.evaluate()["eval/reward"]
                trainer.train()
                lines = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
                points = [(0, start_reward)] + [(line["step"] * s["curve_batch"], line["eval/reward"])
                                                for line in lines if "eval/reward" in line]
                accuracy = greedy_accuracy(trainer.accelerator.unwrap_model(trainer.model), tokenizer, held_out)
            curves.setdefault(name, []).append(dict(seed=seed, points=points, greedy_accuracy=accuracy))
            print(f"curve {name} seed {seed}: {points[-1][1]:.3f} held-out reward, greedy accuracy {accuracy:.3f}",
                  flush=True)
    return curves


def write_report(rows: list[dict], curves: dict, s: dict, seconds: float, command: str, docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in STUDIED:
        mine = [r for r in rows if r["estimator"] == name]
        axes[0].plot([r["k"] for r in mine], [r["mse"] for r in mine], marker="o", label=LABELS.get(name, name))
        axes[1].plot([r["k"] for r in mine], [r["relative_variance"] for r in mine], marker="o", label=LABELS.get(name, name))
    axes[0].set(xlabel="K", ylabel="mean ||g - g*||^2", title=f"gradient MSE, {s['batch']} completions per batch", yscale="log")
    axes[1].set(xlabel="K", ylabel="variance / (E g . g*/||g*||)^2", title="variance per unit of signal", yscale="log")
    for name, runs in curves.items():
        # The final evaluation repeats the last step's: keep one point per episode count.
        per_run = [dict(run["points"]) for run in runs]
        episodes = sorted(set.intersection(*(set(points) for points in per_run)))
        means = [statistics.mean(points[e] for points in per_run) for e in episodes]
        axes[2].plot(episodes, means, marker=".", label=LABELS.get(name, name))
    axes[2].set(xlabel="episodes (completions)", ylabel="held-out sampled reward",
                title=f"learning curves, K=4, mean of {len(s['seeds'])} seed(s)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(docs / "estimators.png", dpi=110)

    lines = [f"Measured by `{command}` in {seconds / 60:.1f} min on one CPU thread.", "",
             f"Gradient of one fixed policy (last decoder layer, projected onto {s['directions']} random directions), "
             f"{s['batches']} batches of {s['batch']} completions per K; reference from {s['prompts']} prompts x "
             f"{s['ref_samples']} samples (leave-one-out); ||g*|| = {rows[0]['ref_norm']:.3g}; "
             f"sampled success rate {rows[0]['success']:.3f}.", "",
             "| estimator | K | MSE vs g* | variance | rel. variance | bias ‖E g − g*‖ | noise floor √(MSE/N) "
             "| scale | cos(E g, g*) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["k"], STUDIED.index(r["estimator"]))):
        lines.append(f"| {LABELS.get(r['estimator'], r['estimator'])} | {r['k']} | {r['mse']:.4g} | {r['variance']:.4g} | "
                     f"{r['relative_variance']:.4g} | {r['bias']:.4g} | {r['noise_floor']:.4g} | {r['scale']:.3f} "
                     f"| {r['cos']:.3f} |")
    lines += ["", f"Learning curves: K=4, {s['curve_batch']} completions per step, lr 3e-5 (the demo's), beta 0, "
              f"{s['episodes']} episodes, seeds {list(s['seeds'])}; held-out sampled reward on {s['eval_prompts']} "
              f"prompts, greedy accuracy on 500.", "",
              "| estimator | held-out reward, start -> end (per seed) | greedy accuracy (per seed) |", "|---|---|---|"]
    for name, runs in curves.items():
        rewards = ", ".join(f"{run['points'][0][1]:.3f} -> {run['points'][-1][1]:.3f}" for run in runs)
        accuracy = ", ".join(f"{run['greedy_accuracy']:.3f}" for run in runs)
        lines.append(f"| {LABELS.get(name, name)} | {rewards} | {accuracy} |")
    (docs / "estimators.md").write_text("\n".join(lines) + "\n")
    (docs / "estimators.json").write_text(json.dumps({"gradient": rows, "curves": curves, "settings": s,
                                                      "seconds": seconds, "command": command}, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run for checking (1-2 minutes)")
    parser.add_argument("--cache_dir", default=str(Path(tempfile.gettempdir()) / "rloo-warm-start"),
                        help="where the warm-started model is cached (built in about a minute the first time)")
    parser.add_argument("--docs_dir", default=None,
                        help="where estimators.md / .png / .json are written; default docs/, or a temporary "
                             "directory with --quick so that a check never overwrites the committed results")
    parser.add_argument("--replot", action="store_true",
                        help="rewrite estimators.md / .png from the estimators.json of a previous run, measuring nothing")
    options = parser.parse_args(argv)
    quick_dir = Path(tempfile.gettempdir()) / "rloo-estimators-quick"
    docs = Path(options.docs_dir or (quick_dir if options.quick else ROOT / "docs"))
    if options.replot:
        saved = json.loads((docs / "estimators.json").read_text())
        write_report(saved["gradient"], saved["curves"], saved["settings"], saved["seconds"], saved["command"], docs)
        return
    torch.set_num_threads(1)  # a shared machine: oversubscribed OpenMP threads are far slower
    s = settings(options.quick)
    start = time.perf_counter()
    model, tokenizer = warm_started_addition_model(options.cache_dir)
    model.eval()
    rows = gradient_study(model, tokenizer, s)
    curves = learning_curves(options.cache_dir, s)
    docs.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=src python benchmarks/learning/estimators.py" + (" --quick" if options.quick else "")
    write_report(rows, curves, s, time.perf_counter() - start, command, docs)
    print((docs / "estimators.md").read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
