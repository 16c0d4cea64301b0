"""Trackers through accelerate: report_to, naming, and the metrics and completions table read back
from TensorBoard event files, an offline W&B run and a local trackio project."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import digit_fraction
from rloo import ConfigError, RLOOConfig
from rloo.run.trackers import TRACKER_MODULES, init_kwargs, markdown_table, resolve_report_to, tracker_config

RUN = Path(__file__).parents[1] / "scripts" / "tracker_run.py"


def test_report_to_none_all_one_and_list():
    assert resolve_report_to("none") == []
    assert resolve_report_to(None) == []
    importable = {name for name in TRACKER_MODULES if importlib.util.find_spec(TRACKER_MODULES[name])}
    assert set(resolve_report_to("all")) == importable  # tensorboardX would also count; it is not installed here
    if importlib.util.find_spec("tensorboard"):
        assert resolve_report_to("tensorboard") == ["tensorboard"]
        assert resolve_report_to(["tensorboard", "tensorboard"]) == ["tensorboard"]


def test_a_tracker_that_is_not_installed_is_named_with_the_package_to_install():
    missing = next((name for name in TRACKER_MODULES if not importlib.util.find_spec(TRACKER_MODULES[name])), None)
    if missing is None:
        pytest.skip("every tracker accelerate supports is installed here")
    with pytest.raises(ValueError, match=f"pip install {TRACKER_MODULES[missing]}"):
        resolve_report_to(["tensorboard", missing])


@pytest.mark.parametrize("report_to", ["neptune", ["tensorboard", "nope"], ["none", "wandb"], 3])
def test_config_refuses_unknown_report_to_naming_the_field(report_to):
    with pytest.raises(ConfigError, match="report_to"):
        RLOOConfig(report_to=report_to)


def test_config_takes_every_tracker_accelerate_supports_and_lists():
    for name in TRACKER_MODULES:
        assert RLOOConfig(report_to=name).report_to == name  # installed or not: checked when training starts
    assert RLOOConfig(report_to=["wandb", "trackio"]).report_to == ["wandb", "trackio"]
    assert RLOOConfig(report_to="all").report_to == "all"


def test_run_name_goes_to_each_trackers_own_keyword():
    kwargs = init_kwargs(["wandb", "trackio", "mlflow", "tensorboard", "swanlab"], "exp-1")
    assert kwargs == {"wandb": {"name": "exp-1"}, "trackio": {"name": "exp-1"}, "mlflow": {"run_name": "exp-1"},
                      "swanlab": {"experiment_name": "exp-1"}}
    assert init_kwargs(["wandb"], None) == {}


def test_tracker_config_keeps_scalars_and_serialises_the_rest():
    assert tracker_config({"a": 1, "b": None, "c": [1, 2], "d": {"x": 1}, "e": "s"}) == {
        "a": 1, "b": None, "c": "[1, 2]", "d": '{"x": 1}', "e": "s"}


def test_tensorboard_goes_where_transformers_puts_it_and_honours_its_environment_variable(tmp_path, monkeypatch):
    from rloo.run.trackers import accelerate_log_with, tensorboard_dir

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    default = tensorboard_dir(tmp_path / "out")
    assert default.parent == tmp_path / "out" / "runs" and default.name.endswith("_" + socket.gethostname())
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    assert tensorboard_dir(tmp_path / "out") == tmp_path / "tb"
    if importlib.util.find_spec("tensorboard"):
        (tracker,) = accelerate_log_with("tensorboard", tmp_path / "out")
        assert Path(tracker.logging_dir_param) / tracker.run_name == tmp_path / "tb"
    assert accelerate_log_with("none", tmp_path / "out") == []


def test_markdown_table_escapes_pipes_and_newlines():
    text = markdown_table(["prompt", "score"], [["a|b\nc", 0.5]])
    assert text.splitlines() == ["| prompt | score |", "|---|---|", "| a\\|b<br>c | 0.5 |"]


def test_tensorboard_receives_metrics_and_the_completions_text(tmp_path, make_model, tokenizer, digit_dataset,
                                                               monkeypatch):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rloo import RLOOTrainer

    monkeypatch.setenv("WANDB_PROJECT", "proj")
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    args = RLOOConfig(output_dir=str(tmp_path / "run"), report_to=["tensorboard"], per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=6, max_steps=2, logging_steps=1, save_steps=0,
                      log_completions=True, num_completions_to_print=3)
    RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer).train()
    (run_dir,) = (tmp_path / "run" / "runs").iterdir()  # TRL's place: output_dir/runs/<Mon DD_HH-MM-SS>_<host>
    assert run_dir.name.endswith("_" + socket.gethostname()) and not (tmp_path / "run" / "proj").exists()
    event_dirs = {p.parent for p in run_dir.rglob("events.out.tfevents.*")}
    assert event_dirs
    scalars, texts = set(), {}
    for directory in event_dirs:
        events = EventAccumulator(str(directory), size_guidance={"tensors": 0}).Reload()
        scalars |= set(events.Tags()["scalars"])
        for tag in events.Tags()["tensors"]:
            texts[tag] = [e.tensor_proto.string_val[0].decode() for e in events.Tensors(tag)]
    # TRL's layout: every training figure once, under "train/" and TRL 1.16's name.
    assert {"train/reward", "train/kl", "train/loss", "train/learning_rate", "train/rewards/digit_fraction/mean",
            "train/completions/mean_terminated_length", "train/clip_ratio/high_max", "train/step_time"} <= scalars
    assert not {"reward", "kl", "objective/kl", "train/objective/kl", "train/lr", "train/loss/policy_avg",
                "train/policy/clipfrac_avg", "train/objective/entropy", "train/policy/entropy_avg"} & scalars
    table = texts["completions/text_summary"]
    assert len(table) == 2  # one per logging step
    header = table[0].splitlines()[0]
    assert header == "| step | prompt | completion | digit_fraction | score | advantage |"
    assert len(table[0].splitlines()) == 2 + 3  # header, rule, num_completions_to_print rows


def _run(tmp_path, env, *trackers):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1", **env}
    result = subprocess.run([sys.executable, str(RUN), str(tmp_path / "run"), "my-run", *trackers],
                            env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_wandb_offline_receives_metrics_table_project_and_name(tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    # WANDB_DATA_DIR: where an offline run stages its table artifacts (else under the home directory)
    _run(tmp_path, {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_DATA_DIR": str(tmp_path / "data"),
                    "WANDB_PROJECT": "my-proj", "WANDB_SILENT": "true"}, "wandb")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    files = runs[0] / "files"
    tables = sorted((files / "media" / "table").glob("completions_*.table.json"))
    assert len(tables) == 2  # one per logging step
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["step", "prompt", "completion", "digit_fraction", "score", "advantage"]
    assert len(table["data"]) == 3
    # This wandb has no public reader for the offline record (its protobuf stream); the names must be in it.
    record = next(runs[0].glob("run-*.wandb")).read_bytes()
    for name in (b"my-proj", b"my-run", b"train/kl", b"train/loss", b"train/rewards/digit_fraction/mean"):
        assert name in record, name


def test_trackio_local_receives_metrics_and_table(tmp_path):
    pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio)")
    trackio_dir = tmp_path / "trackio"
    _run(tmp_path, {"TRACKIO_DIR": str(trackio_dir), "WANDB_PROJECT": "my-proj"}, "trackio")
    script = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
              "print(json.dumps({'runs': S.get_runs('my-proj'), 'logs': S.get_logs('my-proj', 'my-run')}, default=str))")
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["runs"] == ["my-run"]
    keys = set().union(*(log.keys() for log in found["logs"]))
    assert {"train/reward", "train/kl", "completions"} <= keys
    table = next(log["completions"] for log in found["logs"] if "completions" in log)
    assert "digit_fraction" in json.dumps(table) and "advantage" in json.dumps(table)


COLUMNS = ["step", "prompt", "completion", "digit_fraction", "score", "advantage"]


def test_mlflow_local_receives_metrics_and_the_completions_table(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
    store = tmp_path / "mlruns"
    _run(tmp_path, {"MLFLOW_TRACKING_URI": store.as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
                    "WANDB_PROJECT": "my-proj"}, "mlflow")
    (run,) = [p.parent for p in store.glob("*/*/meta.yaml")]
    assert "name: my-proj" in (run.parent / "meta.yaml").read_text()
    assert (run / "tags" / "mlflow.runName").read_text() == "my-run"
    assert (run / "metrics" / "train" / "reward").exists() and (run / "metrics" / "train" / "kl").exists()
    # One table artifact for the run; each logging step appends its rows.
    table = json.loads((run / "artifacts" / "completions.json").read_text())
    assert table["columns"] == COLUMNS
    assert [row[0] for row in table["data"]] == [1, 1, 1, 2, 2, 2]


def test_comet_offline_receives_metrics_and_a_completions_table_per_step(tmp_path):
    pytest.importorskip("comet_ml", reason="comet_ml is not installed (pip install comet_ml)")
    import csv
    import io
    import zipfile

    _run(tmp_path, {"COMET_START_ONLINE": "false", "COMET_OFFLINE_DIRECTORY": str(tmp_path / "comet"),
                    "WANDB_PROJECT": "my-proj"}, "comet_ml")
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as zipped:
        messages = [json.loads(line) for line in zipped.read("messages.json").decode().splitlines()]
        uploads = {m["payload"]["additional_params"]["fileName"]: zipped.read(m["payload"]["file_path"]).decode()
                   for m in messages if m["type"] == "file_upload"
                   and m["payload"]["additional_params"]["fileName"].startswith("completions_")}
    assert sorted(uploads) == ["completions_step0000001.csv", "completions_step0000002.csv"]
    rows = list(csv.reader(io.StringIO(uploads["completions_step0000002.csv"])))
    assert rows[0] == COLUMNS and [row[0] for row in rows[1:]] == ["2", "2", "2"]
    assert '"train/reward"' in json.dumps(messages) and "train/kl" in json.dumps(messages)


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, method):
        return lambda *args, **kwargs: self.calls.append((method, args, kwargs))


def test_log_table_calls_each_trackers_table_api(monkeypatch):
    """Without the packages: the calls mlflow, Comet and ClearML get (their signatures are checked by the
    tests above where the packages are installed)."""
    import types

    from rloo.run.trackers import log_table

    columns, rows = ["step", "prompt"], [[3, "a"], [3, "b"]]
    mlflow = _Recorder()
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))
    log_table(types.SimpleNamespace(name="mlflow", tracker=run), "completions", columns, rows, 3)
    assert mlflow.calls == [("log_table", (), {"data": {"step": [3, 3], "prompt": ["a", "b"]},
                                               "artifact_file": "completions.json", "run_id": "r1"})]
    comet = _Recorder()
    log_table(types.SimpleNamespace(name="comet_ml", tracker=comet), "completions", columns, rows, 3)
    assert comet.calls == [("log_table", ("completions_step0000003.csv",), {"tabular_data": rows, "headers": columns})]
    clearml = _Recorder()
    clearml.name = "clearml"
    log_table(clearml, "completions", columns, rows, 3)
    assert clearml.calls == [("log_table", ("completions",), {"columns": columns, "data": rows, "step": 3})]
