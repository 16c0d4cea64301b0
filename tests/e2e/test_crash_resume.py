"""A real `rloo train` subprocess killed (SIGKILL, inside and between saves) and stopped (SIGTERM),
then resumed with --resume_from_checkpoint latest, ends exactly where an uninterrupted run ends."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from rloo.toy import build_char_tokenizer, build_tiny_model

HERE = Path(__file__).resolve().parents[1] / "scripts"


def _setup(tmp_path):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rows = [{"prompt": f"{a}+{b}="} for a in range(8) for b in range(8)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _train(tmp_path, output_dir, kill=None, resume=False):
    flags = ["--model_name_or_path", str(tmp_path / "model"), "--dataset_name", str(tmp_path / "data.jsonl"),
             "--reward_funcs", f"{HERE / 'killable_train.py'}:digit_fraction", "--output_dir", str(output_dir),
             "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "6",
             "--learning_rate", "3e-3", "--beta", "0.1", "--max_steps", "8", "--save_steps", "2",
             "--save_total_limit", "2", "--logging_steps", "1", "--log_completions", "true", "--seed", "0",
             "--eval_split", "train", "--eval_steps", "3", "--max_eval_samples", "3", "--num_generations_eval", "2"]
    if resume:
        flags += ["--resume_from_checkpoint", "latest"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLOO_KILL": kill or "",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(HERE / "killable_train.py"), *flags], env=env, capture_output=True,
                          text=True, timeout=300)


def _rows(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("eps", "step_time")} for row in rows]  # timings


def test_kills_and_sigterm_then_resume_latest_equal_the_uninterrupted_run(tmp_path):
    _setup(tmp_path)
    straight = _train(tmp_path, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]

    run = tmp_path / "run"
    killed = _train(tmp_path, run, kill="save:2:KILL")  # SIGKILL inside the save of step 4, before the rename
    assert killed.returncode == -9
    assert (run / ".checkpoint-4.tmp" / "trainer_state.json").exists() and not (run / "checkpoint-4").exists()

    killed = _train(tmp_path, run, kill="step:3:KILL", resume=True)  # skips the half-written step 4; dies at 5
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "incomplete checkpoint" in killed.stderr

    stopped = _train(tmp_path, run, kill="step:1:TERM", resume=True)  # SIGTERM during step 5
    assert stopped.returncode == 143, stopped.stderr[-3000:]  # 128 + SIGTERM: saved, but not finished
    assert "--resume_from_checkpoint latest" in stopped.stdout + stopped.stderr
    assert json.loads((run / "checkpoint-5" / "trainer_state.json").read_text())["global_step"] == 5
    assert not (run / "model.safetensors").exists()  # no final model: the run is not finished

    killed = _train(tmp_path, run, kill="state:1:KILL", resume=True)  # SIGKILL inside accelerate's save at step 6
    assert killed.returncode == -9

    finished = _train(tmp_path, run, resume=True)
    assert finished.returncode == 0, finished.stderr[-3000:]

    expected, got = load_file(str(tmp_path / "straight" / "model.safetensors")), load_file(str(run / "model.safetensors"))
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    assert _rows(run / "metrics.jsonl") == _rows(tmp_path / "straight" / "metrics.jsonl")
    assert [r["step"] for r in _rows(run / "metrics.jsonl") if "eval/reward" not in r] == list(range(1, 9))
    assert (run / "completions.jsonl").read_text() == (tmp_path / "straight" / "completions.jsonl").read_text()
    evals = (run / "eval_completions.jsonl").read_text()  # steps 3 and 6 (cut back and redone on resume) and 8
    assert evals == (tmp_path / "straight" / "eval_completions.jsonl").read_text()
    assert [json.loads(line)["step"] for line in evals.splitlines()] == [3] * 6 + [6] * 6 + [8] * 6
    # Rotation kept this run's two newest complete checkpoints and no temporary directory.
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint-6", "checkpoint-8"]
