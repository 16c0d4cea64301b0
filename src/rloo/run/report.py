"""`rloo report RUN_DIR`: one self-contained HTML page of a run, to look at rather than read.

It reads what a run writes (run.json, metrics.jsonl, completions.jsonl, rloo_config.json, and `rloo eval`'s
eval_results.json and eval_samples.jsonl when present). At the
top: the model, dataset and reward functions (from run.json, written when training starts). Then,
against episodes: reward with its within-group spread, each reward function's mean when there are
several, KL, entropy, completion length, clip fractions, learning rate, grad norm, and the eval
metrics grouped by scale (reward, each reward function, 0-1 rates, lengths, pass@k), so that a rate
never flattens the reward's axis. A panel whose every value is the same (KL at beta 0, clip
fractions with one pass per batch) is left out and named in one line. Then the sample completions
by step and the evaluation samples (`report_samples`: a multi-turn trajectory as collapsible turns, its tool calls
and results marked), and the settings that differ from the defaults. The plots are PNGs inlined as base64, so the
page is one file that opens anywhere, offline.

Every file it reads may be damaged or tampered with, and every text in them is untrusted: a line
that is not a JSON object is left out, a record whose step is not an integer is left out, a metric
value that is not a finite number is dropped (the page says how many), and every text field is
shown through `safe_text` (control characters visible, HTML-escaped; `$` escaped for matplotlib,
which would read it as math).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from rloo.run.report_samples import SAMPLES_STYLE, completions_html, eval_samples_html
from rloo.safe_text import html_text, visible

# (title, [(metric, label)], band): band is (metric of the spread, "std") or (low, high) metrics.
PANELS: list[tuple[str, list[tuple[str, str]], tuple[str, str] | None]] = [
    ("Reward (band: mean within-group std)", [("reward", "reward")], ("reward_std", "std")),
    ("KL to the reference", [("objective/kl", "sequence KL")], None),
    ("Entropy", [("objective/entropy", "entropy per token")], None),
    ("Completion length (band: min to max)", [("completions/mean_length", "mean length")],
     ("completions/min_length", "completions/max_length")),
    ("Clip fractions", [("policy/clipfrac_avg", "total"), ("clip_ratio/low_mean", "low"),
                        ("clip_ratio/high_mean", "high")], None),
    ("Learning rate", [("lr", "lr")], None),
    ("Grad norm (before clipping)", [("grad_norm", "grad norm")], None),
]


# Settings shown whatever their value: what a reader compares runs by.
CORE_SETTINGS = ("learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "max_completion_length", "beta", "temperature", "num_iterations", "max_steps", "seed")
# Settings that only matter when another one is on: (prefix, setting, values that use them).
USED_WHEN = [("vllm_", "sampler", ("vllm",)), ("hub_", "push_to_hub", (True,))]


def run_card(model: Any, dataset: Any, reward_names: list[str], reward_weights: list[float], config: dict) -> dict:
    """What a run trains, for run.json: the model, the dataset, the reward functions and the config."""
    model_config = getattr(model, "config", None)
    info = getattr(dataset, "info", None)
    source = next((v for v in (getattr(info, "dataset_name", None), getattr(info, "builder_name", None)) if v), None)
    rows = len(dataset) if hasattr(dataset, "__len__") else None
    split = str(getattr(dataset, "split", None) or "") or None
    return {
        "model": {"name_or_path": getattr(model_config, "_name_or_path", "") or None, "class": type(model).__name__,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "dataset": {"name": source, "config": getattr(info, "config_name", None), "split": split, "rows": rows,
                    "columns": list(getattr(dataset, "column_names", None) or [])},
        "reward_functions": [{"name": n, "weight": w} for n, w in zip(reward_names, reward_weights)],
        "config": config,
    }


def write_run_card(output_dir: str | Path, card: dict) -> None:
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / "run.json").write_text(json.dumps(card, indent=2, default=str))


def _number(value: Any) -> bool:
    """A finite int or float (not a bool, not a string): what a tampered file cannot pass off as one."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def describe_run(card: dict) -> list[str]:
    """Lines naming the model, dataset and reward functions of a run.json (empty without one); a
    field of the wrong type (a damaged or tampered file) reads as unknown."""
    card = _dict(card)
    if not card:
        return []
    model, data = _dict(card.get("model")), _dict(card.get("dataset"))
    name = model.get("name_or_path") or "a model built in memory"
    parameters = f"{model['parameters']:,}" if _number(model.get("parameters")) else "?"
    lines = [f"Model: {name} ({model.get('class')}, {parameters} parameters)"]
    where = ", ".join(f"{k} {data[k]}" for k in ("config", "split") if data.get(k))
    lines.append(f"Dataset: {data.get('name') or 'an in-memory dataset'}{f' ({where})' if where else ''}, "
                 f"{data.get('rows')} rows, columns {', '.join(map(str, _list(data.get('columns'))))}")
    functions = [_dict(r) for r in _list(card.get("reward_functions"))]
    rewards = [f"{r.get('name', '?')}" + (f" (weight {r['weight']:g})" if _number(r.get("weight")) and r["weight"] != 1.0
                                          else "") for r in functions]
    lines.append(f"Reward functions: {', '.join(rewards) or '-'}")
    return lines


def used_settings(config: dict, defaults: dict) -> dict:
    """The settings a reader needs: the core ones, and every other one that differs from its default,
    less those of a feature the run left off (vllm_* without the vLLM sampler, hub_* without pushing)."""
    unused = [prefix for prefix, key, values in USED_WHEN if config.get(key) not in values]
    return {k: v for k, v in config.items()
            if k in CORE_SETTINGS or (k in defaults and v != defaults[k] and not any(k.startswith(p) for p in unused))}


def config_defaults() -> dict:
    """RLOOConfig's defaults as rloo_config.json spells them (JSON values)."""
    from rloo.config import RLOOConfig

    return json.loads(json.dumps(RLOOConfig(output_dir="unused").to_dict(), default=str))


def read_jsonl(path: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one a line; a line that is not one (cut by a kill, damaged) is
    left out and, given `skipped`, counted there by the file's name."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            row = False
        if isinstance(row, dict):
            rows.append(row)
        elif row is not None and skipped is not None:
            skipped.append(path.name)
    return rows


def metric_records(rows: list[dict[str, Any]], skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """metrics.jsonl rows as records the plots can take: the step an int, every other value a finite
    number (others are dropped; a row without an int step is left out and counted in `skipped`)."""
    records = []
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            if skipped is not None:
                skipped.append("metrics.jsonl")
            continue
        records.append({"step": step, **{str(k): v for k, v in row.items() if k != "step" and _number(v)}})
    return records


def split_records(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training records (they carry `episode`) and eval records (`eval/...`), each eval record given
    the episode count of the last training record at or before its step."""
    train = [r for r in records if "episode" in r]
    evals = [dict(r) for r in records if "episode" not in r and any(k.startswith("eval/") for k in r)]
    for record in evals:
        before = [t["episode"] for t in train if t["step"] <= record["step"]]
        record["episode"] = before[-1] if before else 0.0
    return train, evals


def figure_png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _band(rows: list[dict[str, Any]], y: list[float], band: tuple[str, str] | None) -> tuple[list, list] | None:
    """The (low, high) of a panel's shaded band: mean +- std, or a min and a max metric."""
    if band is None or not all(band[0] in r for r in rows):
        return None
    if band[1] == "std":
        return [v - r[band[0]] for v, r in zip(y, rows)], [v + r[band[0]] for v, r in zip(y, rows)]
    if all(band[1] in r for r in rows):
        return [r[band[0]] for r in rows], [r[band[1]] for r in rows]
    return None


def plot_text(text: str) -> str:
    """A title or label for matplotlib: control characters visible, `$` escaped (unescaped, matplotlib
    reads the text between two of them as math, and a malformed formula stops the drawing)."""
    return visible(text).replace("$", r"\$")


def _panel(plt: Any, title: str, records: list[dict[str, Any]], series: list[tuple[str, str]],
           band: tuple[str, str] | None = None, legend_size: int | None = None) -> str:
    """One plot of `series` (metric, label) against episodes, as base64 PNG; a legend when
    `legend_size` is given."""
    figure, axis = plt.subplots(figsize=(6, 3.2))
    for index, (key, label) in enumerate(series):
        rows = [r for r in records if key in r]
        x, y = [r["episode"] for r in rows], [r[key] for r in rows]
        axis.plot(x, y, marker="o", markersize=2, label=plot_text(label))
        low_high = _band(rows, y, band) if index == 0 else None
        if low_high:
            axis.fill_between(x, *low_high, alpha=0.25)
    axis.set(title=plot_text(title), xlabel="episodes")
    axis.grid(alpha=0.3)
    if legend_size:
        axis.legend(fontsize=legend_size)
    png = figure_png(figure)
    plt.close(figure)
    return png


def is_flat(records: list[dict[str, Any]], series: list[tuple[str, str]]) -> bool:
    """Every value of every series is the same (a panel with nothing to show)."""
    values = {r[key] for key, _ in series for r in records if key in r}
    return len(values) <= 1


def reward_function_names(records: list[dict[str, Any]], prefix: str = "") -> list[str]:
    """Names of the reward functions logged as `<prefix>rewards/<name>/mean`."""
    start = f"{prefix}rewards/"
    return sorted({k[len(start):-len("/mean")] for r in records for k in r if k.startswith(start) and k.endswith("/mean")})


def eval_family(key: str) -> str:
    """The panel an eval metric goes to: metrics on one scale share an axis."""
    if "pass@" in key:
        return "eval pass@k"
    if key.startswith("eval/rewards/"):
        return f"eval reward: {key[len('eval/rewards/'):].rsplit('/', 1)[0]}"
    if key in ("eval/reward", "eval_reward"):
        return "eval reward"
    if "length" in key:
        return "eval length"
    if any(word in key for word in ("ratio", "frac", "rate")):
        return "eval rates (0 to 1)"
    return "eval other"


def panel_specs(train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> list[tuple[str, list, Any, list]]:
    """(title, series, band, records) of every panel with data, before the flat ones are left out."""
    specs = [(title, [(k, label) for k, label in series if any(k in r for r in train)], band, train)
             for title, series, band in PANELS]
    names = reward_function_names(train)
    if len(names) > 1:  # with one function its curve is the reward's
        specs[1:1] = [(f"Reward function: {n} (band: std)", [(f"rewards/{n}/mean", n)], (f"rewards/{n}/std", "std"), train)
                      for n in names]
    families: dict[str, list[tuple[str, str]]] = defaultdict(list)
    keys = {k for r in evals for k in r if k.startswith("eval/") and not k.endswith(("/std", "_std"))}  # std: bands
    if len(reward_function_names(evals, "eval/")) <= 1:
        keys = {k for k in keys if not k.startswith("eval/rewards/")}
    for key in sorted(keys):
        families[eval_family(key)].append((key, key))
    specs += [(family, series, ("eval/reward_std", "std") if family == "eval reward" else None, evals)
              for family, series in families.items()]
    return [spec for spec in specs if spec[1]]


def draw_panels(train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> tuple[list[tuple[str, str]], list[str]]:
    """(title, base64 PNG) of every panel with something to show, and a line per panel left out as
    flat (every value the same)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("rloo report draws with matplotlib: pip install matplotlib (from a clone of the repository: "
                          "pip install -e '.[plots]').") from None
    matplotlib.use("Agg")  # no display: draw to memory
    import matplotlib.pyplot as plt

    panels, flat = [], []
    for title, series, band, records in panel_specs(train, evals):
        if is_flat(records, series):
            value = next(r[series[0][0]] for r in records if series[0][0] in r)
            flat.append(f"{title} ({value:.4g})")
            continue
        legend = 9 if len(series) > 1 else None
        panels.append((title, _panel(plt, title, records, series, band, legend)))
    return panels, flat


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 1em; }}
.plots figure {{ margin: 0; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }}
pre {{ margin: 0; white-space: pre-wrap; max-width: 40em; }}
{samples_style}</style></head><body>
<h1>{title}</h1>
{run}
<p>{summary}</p>
<h2>Training</h2><div class="plots">{plots}</div>
{flat}
{standalone}
<h2>Sample completions</h2>{completions}
{eval_samples}
<h2>Config</h2><p>{config_note}</p><table>{config}</table>
</body></html>
"""


def build_report(run_dir: str | Path) -> Path:
    """Write `run_dir/report.html` from the run's files and return its path."""
    run_dir = Path(run_dir)
    skipped: list[str] = []  # a name per line or file left out as damaged
    records = metric_records(read_jsonl(run_dir / "metrics.jsonl", skipped), skipped)
    if not records:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: is {run_dir} an rloo output_dir?")
    train, evals = split_records(records)
    card = read_json(run_dir / "run.json", skipped)
    config = read_json(run_dir / "rloo_config.json", skipped) or _dict(card.get("config"))
    completions = read_jsonl(run_dir / "completions.jsonl", skipped)
    eval_samples = read_jsonl(run_dir / "eval_samples.jsonl", skipped)  # written by `rloo eval`
    last = train[-1] if train else {}
    standalone = read_json(run_dir / "eval_results.json", skipped)  # written by `rloo eval`
    summary = (f"{len(train)} training logs, last at step {last.get('step', '-')} after "
               f"{int(last.get('episode', 0))} episodes; {eval_count(len(evals), standalone)}.")
    if skipped:
        counts = ", ".join(f"{skipped.count(name)} from {name}" for name in dict.fromkeys(skipped))
        summary += f" Left out as damaged (not a JSON object, or a step that is not an integer): {counts}."
    panels, flat = draw_panels(train, evals)
    plots = "".join(f'<figure><img alt="{html_text(title)}" src="data:image/png;base64,{png}"></figure>'
                    for title, png in panels)
    shown = used_settings(config, config_defaults())
    config_rows = "".join(f"<tr><th>{html_text(k)}</th><td>{html_text(json.dumps(v, default=str))}</td></tr>"
                          for k, v in shown.items())
    run_lines = describe_run(card) or ["run.json not found: model, dataset and reward functions unknown."]
    page = PAGE.format(title=html_text(f"RLOO run: {run_dir.resolve().name}"),
                       run="".join(f'<p class="run">{html_text(line)}</p>' for line in run_lines),
                       summary=html_text(summary), plots=plots,
                       flat=(f"<p>Left out, the same at every log: {html_text('; '.join(flat))}.</p>" if flat else ""),
                       config_note=html.escape(f"The core settings and those that differ from the defaults "
                                               f"({len(config) - len(shown)} more in rloo_config.json)."),
                       config=config_rows or "<tr><td>rloo_config.json not found</td></tr>",
                       standalone=standalone_eval_html(standalone),
                       completions=completions_html(completions), samples_style=SAMPLES_STYLE,
                       eval_samples=eval_samples_html(eval_samples))
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out


def eval_count(during_training: int, standalone: dict) -> str:
    """How many evals a run holds: those logged while training, and `rloo eval`'s eval_results.json."""
    text = f"{during_training} eval{'' if during_training == 1 else 's'} during training"
    return text + (", and 1 by rloo eval (eval_results.json)" if standalone else "")


def standalone_eval_html(results: dict) -> str:
    """`rloo eval`'s eval_results.json as a table: what was scored, then each figure."""
    if not results:
        return ""
    what = ", ".join(f"{key} {results[key]}" for key in ("model", "dataset", "split", "prompts", "num_generations")
                     if key in results)
    rows = "".join(f"<tr><th>{html_text(k)}</th><td>{html_text(f'{v:.4g}' if isinstance(v, float) else str(v))}"
                   f"</td></tr>" for k, v in results.items() if k.startswith("eval"))
    return f"<h2>rloo eval</h2><p>{html_text(what)}</p><table>{rows}</table>"


def read_json(path: Path, skipped: list[str] | None = None) -> dict:
    """A JSON object file's content; {} when it is missing, and (counted in `skipped`) when it is not one."""
    if not path.exists():
        return {}
    try:
        content = json.loads(path.read_text(errors="replace"))
    except ValueError:
        content = None
    if not isinstance(content, dict) and skipped is not None:
        skipped.append(path.name)
    return _dict(content)
