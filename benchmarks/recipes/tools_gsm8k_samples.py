"""What the calculator changes in the GSM8K tool recipe's held-out samples: the arithmetic, problem by problem.

    python benchmarks/tools_gsm8k_samples.py runs/tools-gsm8k-sft-short

reads the samples under the folder (`rloo eval`'s eval_samples.jsonl of an arm's starting model in
`<arm>-before/`, the eval_completions.jsonl of training's final evaluation in `<arm>-s<seed>/`:
benchmarks/tools_gsm8k_runs.sh) and counts, per arm and stage:

- accuracy (the gsm8k_accuracy column) and problems evaluated;
- computations: each calculator call (a failed one counts as wrong) and each "a op b = c" the model wrote in
  its own text (`12/3 = 5.6`: numbers and + - * / x only, a result after the "="), checked with the recipe's
  calculator; the share that is right, and computations per sample;
- the values carried forward (a call's result, the number after a written "="): the share that is one of the
  reference solution's own intermediate results (its <<48/2=24>> annotations, from --data), i.e. a step of a
  right solution, set up and computed right;
- with the tool, how often the text after a result starts with that result (the model copies the calculator);
- paired, on the problems both arms answered at the same stage: solved by the tool arm only, the plain arm only,
  both, neither.

Writes benchmarks/results/tools_gsm8k_samples.json and, from the warm starts' samples ("before"),
docs/recipes_gsm8k_tools_short.png.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes" / "tools"))

from calculator import calculator  # noqa: E402  (the recipe's own tool: the same arithmetic as the runs)

NUMBER = r"\$?\d[\d,]*(?:\.\d+)?"
EQUATION = re.compile(rf"((?:{NUMBER}|[()])(?:\s*(?:[-+*/x×÷]|\(|\))\s*\(?\s*{NUMBER}\)?)+)\s*=\s*({NUMBER})")


def reference_steps(answer: str) -> list[float]:
    """The intermediate results of a GSM8K reference solution: the value after each annotation's "="."""
    return [float(value) for value in re.findall(r"<<[^>]*=\s*(-?[\d.]+)\s*>>", answer) if value.strip(".")]


def as_number(text: str) -> float | None:
    try:
        return float(text.replace("$", "").replace(",", "").strip())
    except ValueError:
        return None


def arithmetic_right(expression: str, stated: str) -> bool | None:
    """Whether `expression` evaluates to `stated` (within a cent), None if the calculator cannot read it."""
    try:
        value = float(calculator(expression))
    except ValueError:
        return None
    target = float(stated.replace("$", "").replace(",", ""))
    return abs(value - target) < 0.01 + 1e-6 * abs(value)


def text_equations(text: str) -> list[tuple[bool, str]]:
    """Each checkable "a op b = c" in `text`: whether it is right, and the stated c."""
    checked = ((arithmetic_right(expression, stated), stated) for expression, stated in EQUATION.findall(text))
    return [(right, stated) for right, stated in checked if right is not None]


def sample_figures(completion, steps: list[float]) -> dict:
    """Computations of one sample (a completion's text, or a trajectory's messages); `steps`: the reference
    solution's intermediate results."""
    if isinstance(completion, str):
        completion = [{"role": "assistant", "content": completion}]
    figures = collections.Counter()
    last_result = None
    for message in completion:
        if message["role"] == "tool":
            last_result = message["content"]
            failed = last_result.startswith('{"error"')
            figures["calls"] += 1
            figures["right"] += not failed
            figures["computations"] += 1
            figures["on_reference"] += on_reference(as_number(last_result), steps)
            continue
        content = message.get("content") or ""
        if last_result is not None and not last_result.startswith('{"error"'):
            figures["results_followed"] += 1
            figures["results_copied"] += content.lstrip(" $").startswith(last_result)
        last_result = None
        equations = text_equations(content)
        right = sum(r for r, _ in equations)
        figures["on_reference"] += sum(on_reference(as_number(stated), steps) for _, stated in equations)
        figures["computations"] += len(equations)
        figures["right"] += right
        figures["text_equations"] += len(equations)
        figures["text_right"] += right
    return figures


def on_reference(value: float | None, steps: list[float]) -> bool:
    return value is not None and any(abs(value - step) < 0.01 for step in steps)


def read_samples(folder: Path) -> dict[tuple[str, str], list[dict]]:
    """{(arm, stage): rows}: stage "before" from <arm>-before, "after" from each <arm>-s<seed>'s last evaluation."""
    found = collections.defaultdict(list)
    for path in sorted([*folder.glob("*/eval_completions.jsonl"), *folder.glob("*-before/eval_samples.jsonl")]):
        arm, _, tag = path.parent.name.partition("-")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if tag != "before":
            last = max(row["step"] for row in rows)
            rows = [{**row, "seed": tag} for row in rows if row["step"] == last]
        found[(arm, "before" if tag == "before" else "after")] += rows
    return found


def summary(rows: list[dict], answers: list[str]) -> dict:
    totals = collections.Counter()
    for row in rows:
        totals.update(sample_figures(row["completion"], reference_steps(answers[row["index"]])))
    n = len(rows)
    return {"samples": n, "accuracy": sum(row["gsm8k_accuracy"] or 0 for row in rows) / n,
            "computations_per_sample": totals["computations"] / n,
            "computations_right": totals["right"] / max(totals["computations"], 1),
            "computations_on_reference": totals["on_reference"] / max(totals["computations"], 1),
            "calls_per_sample": totals["calls"] / n,
            "text_equations_per_sample": totals["text_equations"] / n,
            "text_equations_right": totals["text_right"] / max(totals["text_equations"], 1),
            "results_copied": totals["results_copied"] / max(totals["results_followed"], 1)}


def paired(tools: list[dict], plain: list[dict]) -> dict:
    """Problem by problem (same seed tag, same index): who solved it."""
    key = lambda row: (row.get("seed"), row["index"], row["sample"])  # noqa: E731
    right = {arm: {key(row): bool(row["gsm8k_accuracy"]) for row in rows} for arm, rows in (("tools", tools), ("plain", plain))}
    common = sorted(set(right["tools"]) & set(right["plain"]), key=str)
    table = collections.Counter((right["tools"][k], right["plain"][k]) for k in common)
    return {"pairs": len(common), "tools only": table[(True, False)], "plain only": table[(False, True)],
            "both": table[(True, True)], "neither": table[(False, False)]}


def plot(results: dict, path: Path) -> None:
    """Bars per arm (the warm starts): accuracy, computations right, values on a reference step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = {"accuracy": "accuracy", "computations right": "computations_right",
                "values that are a\nreference solution's step": "computations_on_reference"}
    figure, axis = plt.subplots(figsize=(7.5, 3.6))
    for offset, (arm, colour) in enumerate((("tools", "tab:blue"), ("plain", "tab:orange"))):
        figures = results[f"{arm} before"]
        xs = [i + (offset - 0.5) * 0.38 for i in range(len(measures))]
        bars = axis.bar(xs, [figures[key] for key in measures.values()], width=0.38, color=colour,
                        label=f"{'with' if arm == 'tools' else 'without'} the calculator ({figures['samples']} samples)")
        axis.bar_label(bars, fmt="%.3f", fontsize=8)
    axis.set_xticks(range(len(measures)), list(measures))
    axis.set_ylim(0, 1.05)
    axis.set_title("SmolLM2-135M SFT warm starts, GSM8K problems of 1-2 calculations")
    axis.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--data", type=Path, default=ROOT / "recipes" / "data" / "gsm8k_short_1shot" / "test.jsonl",
                        help="the eval split the runs scored (its rows' `answer` gives the reference steps)")
    options = parser.parse_args()
    answers = [json.loads(line)["answer"] for line in options.data.read_text().splitlines()]
    found = read_samples(options.folder)
    if not found:
        sys.exit(f"no eval_samples.jsonl or eval_completions.jsonl under {options.folder}/*/")
    results = {f"{arm} {stage}": summary(rows, answers) for (arm, stage), rows in sorted(found.items())}
    for stage in ("before", "after"):
        if ("tools", stage) in found and ("plain", stage) in found:
            results[f"paired {stage}"] = paired(found[("tools", stage)], found[("plain", stage)])
    for name, figures in results.items():
        print(f"{name:>14}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in figures.items()))
    out = ROOT / "benchmarks" / "results" / "tools_gsm8k_samples.json"
    out.write_text(json.dumps({"folder": str(options.folder), **results}, indent=1))
    print(f"wrote {out}")
    if "tools before" in results and "plain before" in results:
        plot(results, ROOT / "docs" / "recipes_gsm8k_tools_short.png")
        print("wrote docs/recipes_gsm8k_tools_short.png")


if __name__ == "__main__":
    main()
