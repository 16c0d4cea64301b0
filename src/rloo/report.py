"""`rloo report RUN_DIR`: one self-contained HTML page of a run, to look at rather than read.

It reads what a run writes (metrics.jsonl, completions.jsonl, rloo_config.json) and draws, against
episodes: reward with its within-group spread, KL, entropy, completion length, clip fractions,
learning rate, grad norm and every eval metric; then the config and the sample completions by step.
The plots are PNGs inlined as base64, so the page is one file that opens anywhere, offline.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def _panel(plt: Any, title: str, records: list[dict[str, Any]], series: list[tuple[str, str]],
           band: tuple[str, str] | None = None, legend_size: int | None = None) -> str:
    """One plot of `series` (metric, label) against episodes, as base64 PNG; a legend when
    `legend_size` is given."""
    figure, axis = plt.subplots(figsize=(6, 3.2))
    for index, (key, label) in enumerate(series):
        rows = [r for r in records if key in r]
        x, y = [r["episode"] for r in rows], [r[key] for r in rows]
        axis.plot(x, y, marker="o", markersize=2, label=label)
        low_high = _band(rows, y, band) if index == 0 else None
        if low_high:
            axis.fill_between(x, *low_high, alpha=0.25)
    axis.set(title=title, xlabel="episodes")
    axis.grid(alpha=0.3)
    if legend_size:
        axis.legend(fontsize=legend_size)
    png = figure_png(figure)
    plt.close(figure)
    return png


def draw_panels(train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) of every panel that has data; eval metrics are one panel per family."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("rloo report draws with matplotlib: pip install 'rloo[plots]' (or matplotlib).") from None
    matplotlib.use("Agg")  # no display: draw to memory
    import matplotlib.pyplot as plt

    panels = []
    for title, series, band in PANELS:
        series = [(key, label) for key, label in series if any(key in r for r in train)]
        if series:
            panels.append((title, _panel(plt, title, train, series, band, 9 if len(series) > 1 else None)))
    families: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in sorted({k for r in evals for k in r if k.startswith("eval/") and not k.endswith("/std")}):
        family = "eval pass@k" if "pass@" in key else "eval length" if "length" in key else "eval reward and rates"
        families[family].append((key, key))
    for family, series in families.items():
        panels.append((family, _panel(plt, family, evals, series, legend_size=7)))
    return panels


def completions_html(rows: list[dict[str, Any]], per_step: int = 8) -> str:
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_step[row.get("step", 0)].append(row)
    parts = []
    for step in sorted(by_step):
        columns = list(by_step[step][0])
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns if c != "step")
        body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns if c != "step") + "</tr>"
                       for r in by_step[step][:per_step])
        parts.append(f"<h3>step {step}</h3><table><tr>{head}</tr>{body}</table>")
    return "".join(parts) or "<p>No completions were logged (log_completions=False).</p>"


def _cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"<pre>{html.escape(text)}</pre>"


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 1em; }}
.plots figure {{ margin: 0; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }}
pre {{ margin: 0; white-space: pre-wrap; max-width: 40em; }}
</style></head><body>
<h1>{title}</h1>
<p>{summary}</p>
<h2>Training</h2><div class="plots">{plots}</div>
<h2>Config</h2><table>{config}</table>
<h2>Sample completions</h2>{completions}
</body></html>
"""


def build_report(run_dir: str | Path) -> Path:
    """Write `run_dir/report.html` from the run's files and return its path."""
    run_dir = Path(run_dir)
    records = read_jsonl(run_dir / "metrics.jsonl")
    if not records:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: is {run_dir} an rloo output_dir?")
    train, evals = split_records(records)
    config_path = run_dir / "rloo_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    last = train[-1] if train else {}
    summary = (f"{len(train)} training logs, last at step {last.get('step', '-')} after "
               f"{int(last.get('episode', 0))} episodes; {len(evals)} evals.")
    plots = "".join(f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{png}"></figure>'
                    for title, png in draw_panels(train, evals))
    config_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v, default=str))}</td></tr>"
                          for k, v in config.items())
    page = PAGE.format(title=html.escape(f"RLOO run: {run_dir.resolve().name}"), summary=html.escape(summary),
                       plots=plots, config=config_rows or "<tr><td>rloo_config.json not found</td></tr>",
                       completions=completions_html(read_jsonl(run_dir / "completions.jsonl")))
    out = run_dir / "report.html"
    out.write_text(page)
    return out
