"""GSM8K with and without the calculator tool: the table and the figure of docs/recipes.md from the runs of
benchmarks/tools_gsm8k_runs.sh.

    bash benchmarks/tools_gsm8k_runs.sh 10 0 1 2   # rloo train, recipe by recipe, seed by seed
    python benchmarks/tools_gsm8k.py                                           # reads runs/tools-gsm8k/*/metrics.jsonl
    python benchmarks/tools_gsm8k.py --variant sft    # runs/tools-gsm8k-sft: the SFT warm starts (VARIANT=sft above)

Each run is `rloo train --config recipes/gsm8k_tools_cpu.yaml` ("tools") or `recipes/gsm8k_cpu.yaml` ("plain")
with --eval_split test --eval_on_start true --num_generations_eval 1 --max_eval_samples 64: held-out is one
completion sampled at the recipe's temperature (0.8) for each of the first 64 test problems, before the first
step and after the last, scored by gsm8k_accuracy (and, with the tool, eval/tools/call_frequency and
/failure_frequency). Writes benchmarks/results/tools_gsm8k[_sft].json and docs/recipes_gsm8k_tools[_sft].png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs" / "tools-gsm8k"
CURVES = {"accuracy": "rewards/gsm8k_accuracy/mean", "tool calls per trajectory": "tools/call_frequency",
          "failed / calls": "tools/failure_frequency"}


def read_run(folder: Path) -> dict | None:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    evals = [line for line in lines if "eval/reward" in line]
    steps = [line for line in lines if "rewards/gsm8k_accuracy/mean" in line and "eval/reward" not in line]
    held_out = [{"step": e["step"], "accuracy": e["eval/rewards/gsm8k_accuracy/mean"],
                 "format": e["eval/rewards/gsm8k_format/mean"], "tool_calls": e.get("eval/tools/call_frequency"),
                 "tool_failures": e.get("eval/tools/failure_frequency")} for e in evals]
    curves = {name: [s.get(key) for s in steps] for name, key in CURVES.items()}
    return {"held_out": held_out, "curves": curves, "steps": len(steps),
            "train_tool_calls": sum(s.get("tools/call_frequency", 0.0) for s in steps) / max(len(steps), 1)}


def plot(results: dict, path: Path, held_out: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    colours = {"tools": "tab:blue", "plain": "tab:orange"}
    styles = ["-", "--", ":", "-."]  # one per seed: the arms' colours, the seeds' line styles
    for name, run in sorted(results.items()):
        arm, seed = name.split("-s")
        style = {"color": colours[arm], "linestyle": styles[int(seed) % len(styles)], "label": name}
        steps = range(1, run["steps"] + 1)
        axes[0].plot(steps, run["curves"]["accuracy"], alpha=0.7, **style)
        if arm == "tools":
            axes[1].plot(steps, run["curves"]["tool calls per trajectory"], **style)
        points = [(e["step"], e["accuracy"]) for e in run["held_out"]]
        axes[2].plot(*zip(*points), marker="o", **style)
    axes[0].set(title="training accuracy per step (8 trajectories)", xlabel="optimizer step", ylabel="gsm8k_accuracy")
    axes[1].set(title="tool calls per trajectory (training)", xlabel="optimizer step")
    axes[1].set_ylim(bottom=-0.05, top=max(1.05, axes[1].get_ylim()[1]))
    axes[2].set(title=f"held-out accuracy, {held_out} test problems", xlabel="optimizer step")
    for axis in axes:
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="", choices=["", "sft"], help="sft: the runs from the SFT warm starts")
    parser.add_argument("--held-out", type=int, default=64, help="test problems per evaluation (the plot's title)")
    options = parser.parse_args()
    runs = RUNS.with_name(f"{RUNS.name}-{options.variant}") if options.variant else RUNS
    suffix = f"_{options.variant}" if options.variant else ""
    out = ROOT / "benchmarks" / "results" / f"tools_gsm8k{suffix}.json"
    found = {folder.name: run for folder in sorted(runs.iterdir()) if folder.is_dir() and (run := read_run(folder))} \
        if runs.is_dir() else {}
    if not found:
        sys.exit(f"no runs under {runs}: run benchmarks/tools_gsm8k_runs.sh first")
    # Seeds run in separate sessions: runs recorded earlier and absent from runs/ now are kept, not dropped.
    earlier = json.loads(out.read_text()) if out.exists() else {}
    results = dict(sorted({**earlier, **found}.items()))
    kept = sorted(set(earlier) - set(found))
    if kept:
        print(f"kept from {out.name} (no folder under {runs} now): {', '.join(kept)}")
    for name, run in results.items():
        before, after = run["held_out"][0], run["held_out"][-1] if len(run["held_out"]) > 1 else None
        print(f"{name}: {run['steps']} steps; held-out accuracy {before['accuracy']:.3f} -> "
              f"{after['accuracy'] if after else float('nan'):.3f}; tool calls per trajectory held-out "
              f"{before['tool_calls']} -> {after and after['tool_calls']}, training {run['train_tool_calls']:.3f}")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    plot(results, ROOT / "docs" / f"recipes_gsm8k_tools{suffix}.png", options.held_out)
    print(f"wrote {out} and docs/recipes_gsm8k_tools{suffix}.png")


if __name__ == "__main__":
    main()
