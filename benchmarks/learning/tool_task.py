"""The toy tool task (`rloo demo --task add_tool`) over seeds, with and without tools: held-out greedy accuracy
and tool-call rate after the warm start and after RLOO, and the training curves.

    python benchmarks/learning/tool_task.py --seeds 0 1 2
    PYTHONPATH=src python benchmarks/learning/tool_task.py --seeds 0 --quick       # a smoke run: tiny sizes, no figures kept

Each seed runs `rloo.toy.tool_demo.run` with tools=[add] and, with --control, the same run without tools
(--control_only: only that one). It prints one line per run and writes docs/tool_task.json and
docs/tool_task_curves.png (reward and tools/call_frequency per step, from each run's metrics.jsonl). Runs already
in docs/tool_task.json (another seed or arm) are kept, and a run of the same seed and arm replaces its entry, so a
sweep can run one arm at a time:

    for seed in 0 1 2; do
        python benchmarks/learning/tool_task.py --seeds $seed
        python benchmarks/learning/tool_task.py --seeds $seed --control_only
    done
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rloo.toy.tool_demo import build_parser, run

DOCS = Path(__file__).resolve().parents[2] / "docs"


def curves(run_dir: Path) -> dict[str, list[float]]:
    """Step, reward and tools/call_frequency of every metrics.jsonl row that has a reward (no call frequency
    without tools=: the control's calls are plain text, never parsed or counted)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward" in r]
    calls = [r["tools/call_frequency"] for r in rows if "tools/call_frequency" in r]
    return {"step": [r.get("step", i) for i, r in enumerate(rows)], "reward": [r["reward"] for r in rows],
            "call_frequency": calls if len(calls) == len(rows) else []}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    for result in results:
        label = f"seed {result['seed']}{'' if result['tools'] else ', no tools'}"
        style = "-" if result["tools"] else "--"
        left.plot(result["curves"]["step"], result["curves"]["reward"], style, label=label)
        if result["curves"]["call_frequency"]:
            right.plot(result["curves"]["step"], result["curves"]["call_frequency"], style, label=label)
    left.set(xlabel="optimizer step", ylabel="mean reward (exact match)", title="reward")
    right.set(xlabel="optimizer step", ylabel="tool calls per trajectory", title="tools/call_frequency (runs with tools)")
    left.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--control", action="store_true", help="Also run each seed without tools.")
    parser.add_argument("--control_only", action="store_true", help="Run each seed without tools only.")
    parser.add_argument("--quick", action="store_true", help="Tiny sizes, to check the script; writes nothing to docs/.")
    parser.add_argument("--demo_args", default="", help="More `rloo demo --task add_tool` options, e.g. '--episodes 1024'.")
    args = parser.parse_args()
    extra = args.demo_args.split()
    if args.quick:
        extra += ["--warm_start_steps", "5", "--episodes", "16", "--batch_size", "16", "--num_eval", "8"]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            for tools in (False,) if args.control_only else (True, False) if args.control else (True,):
                run_dir = Path(scratch, f"seed{seed}-{'tools' if tools else 'none'}")
                options = build_parser().parse_args(["--output_dir", str(run_dir), "--seed", str(seed), *extra]
                                                    + ([] if tools else ["--no_tools"]))
                result = run(options)
                result["curves"] = curves(run_dir)
                results.append(result)
                print(f"seed {seed} tools={tools}: accuracy {result['before']['accuracy']:.3f} -> "
                      f"{result['after']['accuracy']:.3f}, tool-call rate {result['before']['tool_call_rate']:.3f} -> "
                      f"{result['after']['tool_call_rate']:.3f} ({result['seconds']:.0f} s)", flush=True)
    if args.quick:
        return
    command = "benchmarks/learning/tool_task.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items())
    for result in results:
        result["command"] = command
    path = DOCS / "tool_task.json"
    new = {(r["seed"], r["tools"]) for r in results}
    kept = [r for r in json.loads(path.read_text())["runs"] if (r["seed"], r["tools"]) not in new] if path.exists() else []
    runs = sorted(kept + results, key=lambda r: (not r["tools"], r["seed"]))
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    plot(runs, DOCS / "tool_task_curves.png")
    print(f"wrote {DOCS / 'tool_task.json'} and {DOCS / 'tool_task_curves.png'}")


if __name__ == "__main__":
    main()
