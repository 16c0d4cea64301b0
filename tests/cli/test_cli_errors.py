"""`rloo` prints a user's mistake as one line, `rloo: error: ...`, exits 2, and keeps the traceback for
--debug; the same mistake through the Python API raises the same sentence."""

import json
import os
import signal
import subprocess
import sys

import pytest
import transformers

from rloo.cli import main, parse_train_args
from rloo.config_checks import ConfigError


@pytest.fixture
def model_dir(tmp_path, make_model, tokenizer):
    directory = tmp_path / "model"
    make_model().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{a}="}) + "\n" for a in range(8)))
    return path


def _fails(argv, capsys, debug=False):
    """The message `rloo` printed for `argv` (and checks: exit status 2, one line, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *argv, *(["--debug"] if debug else [])])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    if not debug:  # progress bars may come before it; the error is one line, the last
        lines = err.strip().splitlines()
        assert "Traceback" not in err and lines[-1].startswith("rloo: error: "), err
        assert sum("rloo: error: " in line for line in lines) == 1, err
    return err


def test_a_model_path_that_does_not_exist(tmp_path, data_file, capsys):
    err = _fails(["--model_name_or_path", str(tmp_path / "no" / "such" / "model"), "--dataset_name", str(data_file),
                  "--reward_funcs", "exact_match", "--output_dir", str(tmp_path / "out")], capsys)
    assert "does not exist; give a local model directory" in err


def test_a_reward_module_that_cannot_be_imported(tmp_path, model_dir, data_file, capsys):
    err = _fails(["--model_name_or_path", str(model_dir), "--dataset_name", str(data_file),
                  "--reward_funcs", "no_such_module_here:fn", "--output_dir", str(tmp_path / "out")], capsys)
    assert "cannot import module 'no_such_module_here'" in err


def test_a_reward_needing_a_missing_column_is_one_line(tmp_path, model_dir, data_file, capsys):
    err = _fails(["--model_name_or_path", str(model_dir), "--dataset_name", str(data_file), "--reward_funcs",
                  "exact_match", "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "4",
                  "--num_generations", "2", "--max_steps", "1"], capsys)
    assert "answer" in err


def test_debug_keeps_the_traceback(tmp_path, data_file, capsys):
    err = _fails(["--model_name_or_path", str(tmp_path / "nope" / "x" / "y"), "--dataset_name", str(data_file),
                  "--reward_funcs", "exact_match"], capsys, debug=True)
    assert "Traceback" in err and "rloo: error: " in err


def test_yaml_syntax_errors_name_the_line(tmp_path, capsys):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("learning_rate: 0.001\nbeta: 0.1: 2\nseed: 3\n")
    err = _fails(["--config", str(config_file)], capsys)
    assert f"{config_file} line 2" in err and "column" in err


@pytest.mark.parametrize("text, field", [("bf16: 'false'", "bf16"), ("use_peft: 'no'", "use_peft"),
                                         ("per_device_train_batch_size: '8'", "per_device_train_batch_size")])
def test_quoted_yaml_values_are_refused_like_the_python_api(tmp_path, text, field):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(text + "\n")
    with pytest.raises(ConfigError, match=rf"{field} must be of type .*got '.*' \(str\)"):
        parse_train_args(["--config", str(config_file)])


def test_plain_yaml_numbers_and_booleans_are_read(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("learning_rate: 1e-5\nbf16: false\nuse_peft: no\nmax_steps: 3\nreward_funcs: my_rewards.py:f\n")
    script, config, _ = parse_train_args(["--config", str(config_file)])
    assert config.learning_rate == 1e-5 and config.bf16 is False and script.use_peft is False
    assert config.max_steps == 3 and script.reward_funcs == ["my_rewards.py:f"]  # one string is one entry


def test_a_split_the_data_does_not_have_is_refused(tmp_path, model_dir, data_file, capsys):
    err = _fails(["--model_name_or_path", str(model_dir), "--dataset_name", str(data_file), "--reward_funcs",
                  "exact_match", "--eval_split", "test", "--output_dir", str(tmp_path / "out")], capsys)
    assert "only split is 'train', not 'test'" in err


def test_a_hub_id_while_offline_says_so(tmp_path, data_file):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-m", "rloo.cli", "train", "--model_name_or_path", "nobody-here/no-model",
                             "--dataset_name", str(data_file), "--reward_funcs", "exact_match",
                             "--output_dir", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot be loaded offline" in result.stderr and "local" in result.stderr


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_model_loads_stops_cleanly(tmp_path, model_dir, data_file, capsys, monkeypatch, signum,
                                                      status):
    def signalled_load(*args, **kwargs):
        os.kill(os.getpid(), signum)
        raise AssertionError("the signal should have stopped the load")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", signalled_load)
    # A shell starts background jobs with SIGINT ignored, and Python keeps that: give this test the
    # interactive default (KeyboardInterrupt) whatever started pytest.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["train", "--model_name_or_path", str(model_dir), "--dataset_name", str(data_file),
                  "--reward_funcs", "exact_match", "--output_dir", str(tmp_path / "out")])
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert exit_info.value.code == status and "Traceback" not in err
    assert f"stopped by {signal.Signals(signum).name} before training began; nothing was saved" in err
    # nothing but the run's lock (run/run_lock.py), taken before anything loaded; it holds no data
    assert [p.name for p in (tmp_path / "out").iterdir()] == [".rloo.lock"]


def test_a_used_output_dir_is_refused_before_loading(tmp_path, data_file, capsys, monkeypatch):
    used = tmp_path / "out"
    used.mkdir()
    (used / "metrics.jsonl").write_text("{}\n")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    err = _fails(["--model_name_or_path", "some-org/some-model", "--dataset_name", str(data_file),
                  "--reward_funcs", "exact_match", "--output_dir", str(used)], capsys)
    assert "holds another run's files (metrics.jsonl)" in err


def test_rloo_eval_names_a_missing_model_and_a_missing_split(tmp_path, data_file, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--model", str(tmp_path / "no" / "such" / "model"), "--dataset_name", str(data_file),
              "--reward_funcs", "exact_match"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and "does not exist" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--model", str(tmp_path), "--dataset_name", str(data_file), "--dataset_split", "validation",
              "--reward_funcs", "exact_match"])
    assert exit_info.value.code == 2 and "only split is 'train', not 'validation'" in capsys.readouterr().err


def test_the_python_api_gives_the_same_offline_sentence(tmp_path):
    script = ("from datasets import Dataset\n"
              "from rloo import RLOOConfig, RLOOTrainer\n"
              "from rloo.config_checks import ConfigError\n"
              "try:\n"
              f"    RLOOTrainer('nobody-here/no-model', lambda completions, **kw: [0.0] * len(completions),\n"
              f"                args=RLOOConfig(output_dir={str(tmp_path / 'out')!r}, report_to='none'),\n"
              "                train_dataset=Dataset.from_list([{'prompt': 'a'}]))\n"
              "except ConfigError as error:\n"
              "    print(error)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "model 'nobody-here/no-model' is not a local path and cannot be loaded offline" in result.stdout, \
        result.stderr[-2000:]
