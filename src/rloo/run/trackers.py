"""Experiment trackers, all through accelerate: which ones a run uses, how they name it, and how
the completions table reaches each.

`report_to` is "none", "all" (every tracker accelerate supports that is installed), one name, or a
list of names. The project is `WANDB_PROJECT` (default "rloo") for every tracker; `run_name` names
the run where the tracker has runs (W&B, trackio, MLflow, ClearML, SwanLab, Aim). TensorBoard
writes where transformers' TensorBoardCallback (and so TRL) does: `$TENSORBOARD_LOGGING_DIR` when set,
else `output_dir/runs/<Mon DD_HH-MM-SS>_<host>`, so `tensorboard --logdir output_dir/runs` finds it.

log_multimodal's "image" column (the PNG files `data.images.save_images` wrote) reaches each tracker as
its own image type where it has one: as TRL does, a list of `wandb.Image` / `trackio.Image` per row in
W&B's and trackio's tables; `mlflow.log_table` takes one PIL image per cell (rows with exactly one image);
TensorBoard, which has no tables, gets each row's images as image summaries beside its text table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from rloo.config_checks import TRACKER_MODULES, check_report_to

DEFAULT_PROJECT = "rloo"


def is_installed(tracker: str) -> bool:
    module = TRACKER_MODULES[tracker]
    if tracker == "tensorboard":  # accelerate writes through torch.utils.tensorboard or tensorboardX
        return importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX") is not None
    return importlib.util.find_spec(module) is not None


def resolve_report_to(report_to: str | Sequence[str] | None) -> list[str]:
    """The trackers a run logs to: [] for "none"; every installed one for "all"; the named ones,
    each of which must be installed (a missing one raises, naming the package to install)."""
    if report_to is None:
        return []
    check_report_to(report_to)
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    if names == ["none"] or not names:
        return []
    if "all" in names:
        return [name for name in TRACKER_MODULES if is_installed(name)]
    missing = [name for name in names if not is_installed(name)]
    if missing:
        raise ValueError(f"report_to={report_to!r} asks for {missing}, which is not installed: "
                         f"pip install {' '.join(TRACKER_MODULES[m] for m in missing)}, or drop it from report_to.")
    return list(dict.fromkeys(names))  # in order, once each


def tensorboard_dir(output_dir: str | Path) -> Path:
    """Where a run's TensorBoard events go, as transformers 5's TensorBoardCallback picks it:
    $TENSORBOARD_LOGGING_DIR, else output_dir/runs/<Mon DD_HH-MM-SS>_<host> (a new one per run)."""
    given = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if given:
        return Path(given).expanduser()
    return Path(output_dir) / "runs" / f"{datetime.now().strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}"


def accelerate_log_with(report_to: str | Sequence[str] | None, output_dir: str | Path) -> list[Any]:
    """accelerate's `log_with` for `report_to`: the tracker names, TensorBoard's given as a tracker that
    writes to `tensorboard_dir` (accelerate's own would write to output_dir/<project>)."""
    names = resolve_report_to(report_to)
    if "tensorboard" not in names:
        return names
    from accelerate.tracking import TensorBoardTracker

    directory = tensorboard_dir(output_dir)
    return [TensorBoardTracker(directory.name, directory.parent) if name == "tensorboard" else name for name in names]


def project_name() -> str:
    return os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


def init_kwargs(trackers: Sequence[str], run_name: str | None) -> dict[str, dict[str, Any]]:
    """accelerate's `init_trackers(init_kwargs=)`: the run's name in each tracker's own keyword."""
    if not run_name:
        return {}
    keyword = {"wandb": "name", "trackio": "name", "mlflow": "run_name", "clearml": "task_name",
               "swanlab": "experiment_name"}
    return {name: {keyword[name]: run_name} for name in trackers if name in keyword}


def tracker_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run's config with values every tracker accepts (TensorBoard's hparams take only scalars)."""
    return {key: value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value, default=str)
            for key, value in config.items()}


# ------------------------------------------------------------------ the completions table


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (TensorBoard renders text summaries as Markdown); pipes and newlines escaped."""
    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# log_multimodal's files (`data.images.save_images`), as the "image" column names them: relative to output_dir.
IMAGE_FILE = re.compile(r"images/[0-9a-f]{16}\.png")


def image_files(value: Any, output_dir: str | Path) -> list[Path] | None:
    """A completions row's "image" value as the files it names under output_dir, when it is log_multimodal's
    list of `IMAGE_FILE` names; None for any other value (a reward function's own "image" column stays text)."""
    if not isinstance(value, list) or not all(isinstance(v, str) and IMAGE_FILE.fullmatch(v) for v in value):
        return None
    return [Path(output_dir) / v for v in value]


def _load_image(path: Path) -> Any:
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")  # read now: the file is closed on leaving


def _with_images(columns: list[str], rows: list[list[Any]], images: list[list[Path] | None], media: Any
                 ) -> list[list[Any]]:
    """`rows` with each "image" cell that names files replaced by `media(file)` for each of them (a list per row)."""
    at = columns.index("image")
    return [[[media(str(f)) for f in files] if i == at and files is not None else cell for i, cell in enumerate(row)]
            for row, files in zip(rows, images)]


def log_table(tracker: Any, name: str, columns: list[str], rows: list[list[Any]], step: int,
              images: list[list[Path] | None] | None = None) -> None:
    """Log a table to one accelerate tracker: a table where the tracker has tables (W&B, trackio,
    MLflow, Comet, ClearML), Markdown text for TensorBoard; Aim, DVCLive and SwanLab get none (their
    metrics still arrive). `images`: each row's image files (`image_files` of its "image" cell), shown
    as images by the trackers that have them (module docstring); the others keep the names as text."""
    kind = getattr(tracker, "name", "")
    if images is None or "image" not in columns or not any(images):
        images = None
    if kind == "mlflow":
        import mlflow

        data = {column: [row[i] for row in rows] for i, column in enumerate(columns)}
        if images is not None and all(files is not None and len(files) == 1 for files in images):
            data["image"] = [_load_image(files[0]) for files in images]  # mlflow takes whole columns of single images
        # One artifact per run: mlflow appends each call's rows to it, and the step column tells them
        # apart (one file per step would grow the run's list of logged tables without bound).
        mlflow.log_table(data=data, artifact_file=f"{name}.json", run_id=tracker.tracker.info.run_id)
    elif kind == "comet_ml":  # Comet's tables are files; one per step, the experiment's step is set by accelerate
        tracker.tracker.log_table(f"{name}_step{step:07d}.csv", tabular_data=rows, headers=columns)
    elif kind == "clearml":
        tracker.log_table(name, columns=columns, data=rows, step=step)
    elif kind == "wandb":
        import wandb

        rows = rows if images is None else _with_images(columns, rows, images, wandb.Image)
        tracker.tracker.log({name: wandb.Table(columns=columns, data=rows)}, step=step)
    elif kind == "trackio":
        import trackio

        rows = rows if images is None else _with_images(columns, rows, images, trackio.Image)
        tracker.tracker.log({name: trackio.Table(columns=columns, data=rows)}, step=step)
    elif kind == "tensorboard":
        import numpy as np

        tracker.tracker.add_text(name, markdown_table(columns, rows), global_step=step)
        # No tables in TensorBoard: row r's images under "<name>/row<r>/image<i>", r counting the text table's rows.
        for r, files in enumerate(images or []):
            for i, file in enumerate(files or []):
                tracker.tracker.add_image(f"{name}/row{r}/image{i}", np.asarray(_load_image(file)), global_step=step,
                                          dataformats="HWC")
        tracker.tracker.flush()
