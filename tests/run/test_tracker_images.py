"""log_multimodal's images in the trackers' completions table, read back from what each tracker wrote: W&B
offline (a list of images per row, as TRL logs them), trackio local, MLflow's file store, TensorBoard's event
files (image summaries beside the text table). A text-only table gets none. The W&B, trackio and MLflow tests
skip where the package is not installed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

RUN = Path(__file__).parents[1] / "scripts" / "tracker_images_run.py"
RED, BLUE = (20, 10), (8, 12)  # the script's two images, (width, height)


def _run(tmp_path, env, tracker, mode="both"):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1", "WANDB_PROJECT": "my-proj",
           **env}
    result = subprocess.run([sys.executable, str(RUN), str(tmp_path / "run"), "my-run", tracker, mode],
                            env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def _size(path):
    with Image.open(path) as image:
        return image.size


@pytest.mark.parametrize("mode", ["both", "text-only"])
def test_tensorboard_gets_each_rows_images_beside_the_text_table(tmp_path, mode):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    import io

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(tmp_path, {"TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb")}, "tensorboard", mode)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "tensors": 0}).Reload()
    assert "completions/text_summary" in events.Tags()["tensors"]
    images = {tag: events.Images(tag) for tag in events.Tags()["images"]}
    if mode == "text-only":
        assert images == {}
        return
    assert sorted(images) == ["completions/row0/image0", "completions/row1/image0", "completions/row2/image0",
                              "completions/row2/image1"]
    sizes = {tag: [(e.step, e.width, e.height, _size(io.BytesIO(e.encoded_image_string))) for e in logged]
             for tag, logged in images.items()}
    assert sizes == {"completions/row0/image0": [(1, *RED, RED)], "completions/row1/image0": [(1, *RED, RED)],
                     "completions/row2/image0": [(1, *RED, RED)], "completions/row2/image1": [(1, *BLUE, BLUE)]}


@pytest.mark.parametrize("mode", ["both", "text-only"])
def test_wandb_offline_table_has_an_image_column_of_wandb_images(tmp_path, mode):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    data_dir = tmp_path / "data"  # where an offline run stages its artifacts: a table with media is one
    _run(tmp_path, {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_DATA_DIR": str(data_dir),
                    "WANDB_SILENT": "true"}, "wandb", mode)
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    (table,) = (run / "files" / "media" / "table").glob("completions_1_*.table.json")
    history = json.loads(table.read_text())  # the run's own copy names each cell's media type
    if mode == "text-only":
        assert history["columns"] == ["step", "prompt", "completion", "score", "advantage"]
        assert not data_dir.exists() or not any(data_dir.rglob("*.png"))
        return
    assert history["columns"][-1] == "image"
    assert [row[-1] for row in history["data"]] == [["Image"], ["Image"], ["Image", "Image"]]
    # The table artifact: the files the offline record lists, staged under WANDB_DATA_DIR.
    record = next(run.glob("run-*.wandb")).read_bytes()
    staged = [path for path in (data_dir / "artifacts" / "staging").iterdir() if str(path).encode() in record]
    tables = [json.loads(path.read_text()) for path in staged if path.read_bytes()[:1] == b"{"]
    assert tables and all(t["columns"] == history["columns"] for t in tables)
    cells = [row[-1] for row in tables[0]["data"]]
    assert [[(c["_type"], c["width"], c["height"]) for c in cell] for cell in cells] == [
        [("image-file", *RED)], [("image-file", *RED)], [("image-file", *RED), ("image-file", *BLUE)]]
    assert sorted(_size(path) for path in staged if path.read_bytes()[:4] == b"\x89PNG") == sorted([RED, BLUE])


@pytest.mark.parametrize("mode", ["both", "text-only"])
def test_trackio_table_has_an_image_column_of_trackio_images(tmp_path, mode):
    pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio)")
    trackio_dir = tmp_path / "trackio"
    _run(tmp_path, {"TRACKIO_DIR": str(trackio_dir)}, "trackio", mode)
    script = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
              "print(json.dumps(S.get_logs('my-proj', 'my-run'), default=str))")
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    (table,) = [log["completions"]["_value"] for log in json.loads(out.stdout.strip().splitlines()[-1])
                if "completions" in log]
    if mode == "text-only":
        assert "image" not in table[0]
        return
    cells = [row["image"] for row in table]
    assert [[(c["_type"], _size(trackio_dir / "media" / c["file_path"])) for c in cell] for cell in cells] == [
        [("trackio.image", RED)], [("trackio.image", RED)], [("trackio.image", RED), ("trackio.image", BLUE)]]


@pytest.mark.parametrize("mode", ["one-each", "both"])
def test_mlflow_table_takes_one_image_per_row_and_keeps_the_names_otherwise(tmp_path, mode):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
    store = tmp_path / "mlruns"
    _run(tmp_path, {"MLFLOW_TRACKING_URI": store.as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}, "mlflow", mode)
    (run,) = [p.parent for p in store.glob("*/*/meta.yaml")]
    table = json.loads((run / "artifacts" / "completions.json").read_text())
    cells = [row[table["columns"].index("image")] for row in table["data"]]
    if mode == "both":  # row 2 has two images: mlflow takes one per cell, so the column stays the file names
        assert all(isinstance(c, str) for c in cells) and cells[2].count("images/") == 2
        assert not (run / "artifacts" / "table_images").exists()
        return
    assert [(c["type"], _size(run / "artifacts" / c["filepath"])) for c in cells] == [("image", RED), ("image", RED),
                                                                                      ("image", BLUE)]
