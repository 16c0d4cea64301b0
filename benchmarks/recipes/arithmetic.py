"""Long arithmetic with a calculator (issue #50): what the runs of benchmarks/recipes/arithmetic_runs.sh did.

    python benchmarks/recipes/arithmetic.py                 # reads runs/arithmetic/

For each run (rloo with the tool `tools-s<seed>`, rloo without it `plain-s<seed>`, TRL's GRPOTrainer with the
tool `trl-s<seed>`) and each warm start (`<arm>-before`): seconds per optimizer step (rloo: the mean of
metrics.jsonl's step_time; TRL: train()'s wall time over the steps, benchmarks/recipes/tools_vs_trl.py), peak
RSS of the whole process (/usr/bin/time -v), the training batches' accuracy per step, and from the held-out
samples (`rloo eval`'s eval_samples.jsonl, the first 64 test problems, one sample each):

- accuracy (the gsm8k_accuracy reward: the number after '####' equals the expression's value);
- tool-call rate: the share of samples with at least one calculator call, and calls per sample;
- failed-call rate: the share of calls whose result is the tool's error message (calls: the model's tool_calls,
  as tools/call_frequency counts them);
- calls per operation the problem needs (a call for each + - * / of the question is the plan);
- copies a tool result: the share of samples with a '####' answer whose answer is one of that sample's
  (successful) calculator results, and the share whose answer is the last one;
- the plan: the share of samples that made as many calls as the question has operations, and accuracy by the
  number of operations; for each run also seconds per 1,000 of the model's own tokens (the policies' trajectories
  differ in length, so a step is not the same work in two runs).

Writes benchmarks/results/arithmetic_tools.json and docs/arithmetic_tools.png (training accuracy per step of
every run, a 5-step moving average, and held-out accuracy before and after).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs" / "arithmetic"
ANSWER = re.compile(r"####\s*\$?(-?[\d,]*\.?\d+)")
OPERATION = re.compile(r"\s[-+*/]\s")


def normalised(number: str) -> str:
    text = number.replace(",", "").replace("$", "").strip()
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else str(value)


def sample_figures(row: dict) -> dict:
    """One held-out sample: its calls, failed calls, operations asked for, and whether its answer copies a result."""
    completion = row["completion"]
    if isinstance(completion, str):
        completion = [{"role": "assistant", "content": completion}]
    results = [m["content"] for m in completion if m["role"] == "tool"]
    failed = [r for r in results if r.lstrip().startswith('{"error"')]
    good = [normalised(r) for r in results if r not in failed]
    text = "\n".join(m.get("content") or "" for m in completion if m["role"] == "assistant")
    answers = ANSWER.findall(text)
    answer = normalised(answers[-1]) if answers else None
    question = row["prompt"][-1]["content"]
    # A call the rollout ran but whose result did not fit in max_completion_length has no tool message: count
    # the calls the model made (as tools/call_frequency does), the failures among the results it read.
    calls = sum(len(m.get("tool_calls") or []) for m in completion if m["role"] == "assistant")
    return {"right": bool(row["gsm8k_accuracy"]), "calls": calls, "failed": len(failed),
            "operations": len(OPERATION.findall(question)), "answered": answer is not None,
            "copies_a_result": answer is not None and answer in good,
            "copies_last_result": answer is not None and bool(good) and answer == good[-1]}


def eval_summary(folder: Path) -> dict | None:
    path = folder / "eval_samples.jsonl"
    if not path.exists():
        return None
    figures = [sample_figures(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    n, calls = len(figures), sum(f["calls"] for f in figures)
    answered = [f for f in figures if f["answered"]]
    return {"samples": n, "accuracy": sum(f["right"] for f in figures) / n,
            "tool_call_rate": sum(f["calls"] > 0 for f in figures) / n, "calls_per_sample": calls / n,
            "failed_call_rate": sum(f["failed"] for f in figures) / calls if calls else 0.0,
            "calls_per_operation": calls / max(sum(f["operations"] for f in figures), 1),
            "answered": len(answered) / n,
            "copies_a_tool_result": sum(f["copies_a_result"] for f in answered) / len(answered) if answered else 0.0,
            "copies_last_tool_result": sum(f["copies_last_result"] for f in answered) / len(answered) if answered else 0.0,
            # the plan: a call for each operation the question asks for, and accuracy by the number of operations
            "calls_equal_operations": sum(f["calls"] == f["operations"] for f in figures) / n,
            "accuracy_by_operations": {str(k): statistics.fmean(f["right"] for f in figures if f["operations"] == k)
                                       for k in sorted({f["operations"] for f in figures})},
            "source": str(path.relative_to(ROOT)), "model": json.loads((folder / "eval_results.json").read_text())["model"]}


def peak_rss_mb(time_file: Path) -> float | None:
    if not time_file.exists():
        return None
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_file.read_text())
    return int(found.group(1)) / 1024 if found else None


def run_summary(name: str) -> dict | None:
    folder = RUNS / name
    system, seed = ("trl" if name.startswith("trl") else "rloo"), int(name.rsplit("-s", 1)[1])
    arm = "plain" if name.startswith("plain") else "tools"
    if system == "rloo":
        metrics = folder / "metrics.jsonl"
        if not metrics.exists():
            return None
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        rows = [row for row in rows if "step_time" in row]
        step_times = [row["step_time"] for row in rows]
        seconds_per_step = statistics.fmean(step_times)
        median_seconds_per_step = statistics.median(step_times)
        accuracy = [row.get("rewards/gsm8k_accuracy/mean") for row in rows]
        reward = [row.get("reward") for row in rows]
        calls = [row.get("tools/call_frequency") for row in rows]
        length = [row.get("completions/mean_length") for row in rows]
    else:
        result_file = ROOT / "benchmarks" / "results" / f"arithmetic_trl_s{seed}.json"
        history_file = folder / "log_history.json"
        if not (result_file.exists() and history_file.exists()):
            return None
        result = json.loads(result_file.read_text())["results"][0]
        rows = [row for row in json.loads(history_file.read_text()) if "rewards/gsm8k_accuracy/mean" in row]
        seconds_per_step = result["seconds_per_step"]
        step_times = [row["step_time"] for row in rows if "step_time" in row]
        median_seconds_per_step = statistics.median(step_times) if step_times else None
        accuracy = [row["rewards/gsm8k_accuracy/mean"] for row in rows]
        reward = [row.get("reward") for row in rows]
        calls = [row.get("tools/call_frequency") for row in rows]
        length = [row.get("completions/mean_length") for row in rows]
    # The work differs between runs (each policy writes trajectories of its own length): seconds per thousand of
    # the model's own tokens (completions/mean_length counts them alone in both, tool results left out) as well.
    recipe = yaml.safe_load((ROOT / "recipes" / f"arithmetic_{arm}_cpu.yaml").read_text())
    per_step = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]  # trajectories a step
    model_tokens = sum(value or 0.0 for value in length) * per_step
    return {"system": system, "arm": arm, "seed": seed, "steps": len(accuracy),
            "seconds_per_step": seconds_per_step, "median_seconds_per_step": median_seconds_per_step,
            "seconds_per_1k_model_tokens": seconds_per_step * len(accuracy) / model_tokens * 1000 if model_tokens else None,
            "peak_rss_mb": peak_rss_mb(RUNS / f"{name}.time"),
            "train_accuracy_per_step": accuracy, "train_reward_per_step": reward,
            "train_calls_per_step": calls, "train_mean_length_per_step": length,
            "stopped_early": not (folder / "model.safetensors").exists(),
            "train_accuracy_first_half": statistics.fmean(a or 0.0 for a in accuracy[:len(accuracy) // 2]) if accuracy else None,
            "train_accuracy_second_half": statistics.fmean(a or 0.0 for a in accuracy[len(accuracy) // 2:]) if accuracy else None,
            "held_out": eval_summary(RUNS / f"{name}-eval"), "held_out_hard": eval_summary(RUNS / f"{name}-hard-eval")}


def moving_average(values: list[float], width: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {("rloo", "tools"): "tab:blue", ("rloo", "plain"): "tab:orange", ("trl", "tools"): "tab:green"}
    labels = {("rloo", "tools"): "rloo, calculator", ("rloo", "plain"): "rloo, no tool (control)",
              ("trl", "tools"): "TRL GRPO, calculator"}
    figure, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.6, 1]})
    styles = ["-", "--", ":"]
    for name, run in results["runs"].items():
        key = (run["system"], run["arm"])
        values = [v if v is not None else 0.0 for v in run["train_accuracy_per_step"]]
        curves.plot(range(1, len(values) + 1), moving_average(values), styles[run["seed"] % 3], color=colours[key],
                    label=f"{labels[key]}, seed {run['seed']}")
    curves.set_xlabel("optimizer step (8 trajectories)")
    curves.set_ylabel("training accuracy (5-step moving average)")
    curves.set_ylim(-0.02, 1.02)
    curves.legend(fontsize=7, loc="upper left")
    curves.set_title("Training batches")
    names, heights, colors = [], [], []
    for arm in ("tools", "plain"):
        before = results["before"].get(arm)
        if before:
            names.append(f"{arm}\nwarm start")
            heights.append(before["accuracy"])
            colors.append("lightgray")
    for name, run in results["runs"].items():
        if run["held_out"]:
            names.append(name.replace("-s", "\nseed "))
            heights.append(run["held_out"]["accuracy"])
            colors.append(colours[(run["system"], run["arm"])])
    drawn = bars.bar(range(len(names)), heights, color=colors)
    bars.bar_label(drawn, fmt="%.2f", fontsize=7)
    bars.set_xticks(range(len(names)), names, fontsize=7)
    bars.set_ylim(0, 1.05)
    evaluated = [*results["before"].values(), *(run["held_out"] for run in results["runs"].values() if run["held_out"])]
    sizes = sorted({figures["samples"] for figures in evaluated})
    bars.set_title(f"Held-out accuracy (first {'/'.join(map(str, sizes))} test problems, 1 sample)")
    figure.suptitle("SmolLM2-135M, arithmetic on 4-5 digit numbers with a calculator (recipes/arithmetic_*_cpu.yaml)",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    if not RUNS.exists():
        sys.exit(f"no {RUNS}: run benchmarks/recipes/arithmetic_runs.sh first")
    names = sorted({p.name for p in RUNS.iterdir() if p.is_dir() and re.fullmatch(r"(tools|plain|trl)-s\d+", p.name)},
                   key=lambda n: (int(n.rsplit("-s", 1)[1]), ["tools", "trl", "plain"].index(n.split("-")[0])))
    runs = {name: summary for name in names if (summary := run_summary(name))}
    before = {arm: eval_summary(RUNS / f"{arm}-before-eval") for arm in ("tools", "plain")}
    before_hard = {arm: eval_summary(RUNS / f"{arm}-before-hard-eval") for arm in ("tools", "plain")}
    results = {"command": "bash benchmarks/recipes/arithmetic_runs.sh STEPS JOB... && python benchmarks/recipes/arithmetic.py",
               "machine": "2 CPU cores, two jobs at a time (OMP_NUM_THREADS=1 each, so each had a core)",
               "before": {k: v for k, v in before.items() if v},
               "before_hard": {k: v for k, v in before_hard.items() if v}, "runs": runs}
    out = ROOT / "benchmarks" / "results" / "arithmetic_tools.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"{'run':<14}{'s/step':>8}{'RSS MB':>8}{'acc':>7}{'call%':>7}{'calls':>7}{'fail%':>7}{'copy%':>7}"
          f"{'plan%':>7}{'acc1':>6}{'acc2':>6}{'acc3':>6}{'hard':>7}")
    rows = [(f"{arm}-before", None, None, figures, results["before_hard"].get(arm))
            for arm, figures in results["before"].items()]
    rows += [(name, run["seconds_per_step"], run["peak_rss_mb"], run["held_out"], run["held_out_hard"])
             for name, run in runs.items()]
    for name, seconds, rss, figures, hard in rows:
        figures = figures or {}
        by_operations = figures.get("accuracy_by_operations", {})
        print(f"{name:<14}{seconds or float('nan'):>8.1f}{rss or float('nan'):>8.0f}"
              + "".join(f"{figures.get(k, float('nan')):>7.3f}" for k in
                        ("accuracy", "tool_call_rate", "calls_per_sample", "failed_call_rate", "copies_a_tool_result",
                         "calls_equal_operations"))
              + "".join(f"{by_operations.get(k, float('nan')):>6.2f}" for k in ("1", "2", "3"))
              + f"{(hard or {}).get('accuracy', float('nan')):>7.3f}")
    print(f"wrote {out.relative_to(ROOT)}")
    if runs:
        plot(results, ROOT / "docs" / "arithmetic_tools.png")
        print("wrote docs/arithmetic_tools.png")


if __name__ == "__main__":
    main()
