"""`rloo train`: YAML plus flags, --help from docstrings, unknown keys rejected, a real run."""

import json
import subprocess
import sys
import textwrap

import pytest

from rloo.cli import main, parse_train_args, resolve_reward_func
from rloo.config import ConfigError


def test_flags_override_yaml_and_aliases_work(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("learning_rate: 0.001\nkl_coef: 0.2\nnum_generations: 4\nper_device_train_batch_size: 8\n"
                           "model_name_or_path: some/model\nreward_funcs: [exact_match]\n")
    script, config, resume = parse_train_args(["--config", str(config_file), "--learning_rate", "0.01", "--bf16",
                                               "--top_k", "5", "--reward_weights", "1.0"])
    assert config.learning_rate == 0.01 and config.beta == 0.2 and config.bf16 is True and config.top_k == 5
    assert config.reward_weights == [1.0] and script.reward_funcs == ["exact_match"]
    assert script.model_name_or_path == "some/model" and resume is None
    _, config, _ = parse_train_args(["--config", str(config_file), "--beta", "0.3"])
    assert config.beta == 0.3  # a flag beats the file even when the file used the alias


def test_algorithm_flags(tmp_path):
    _, config, _ = parse_train_args([
        "--advantage_estimator", "grpo", "--kl_penalty", "loss", "--kl_estimator", "k3", "--loss_agg_mode",
        "token-mean", "--epsilon_high", "0.28", "--num_mini_batches", "2", "--stop_strings", "###", "</answer>",
        "--stop_token_ids", "5", "7", "--normalize_advantages", "--mask_truncated_completions", "true",
        "--missing_eos_penalty", "1.0", "--entropy_coef", "0.001", "--reward_clip_range", "5", "--save_steps", "0"])
    assert (config.advantage_estimator, config.kl_penalty, config.kl_estimator) == ("grpo", "loss", "k3")
    assert config.loss_agg_mode == "token-mean" and config.epsilon_high == 0.28 and config.num_mini_batches == 2
    assert config.stop_strings == ["###", "</answer>"] and config.stop_token_ids == [5, 7]
    assert config.normalize_advantages is True and config.mask_truncated_completions is True
    assert (config.missing_eos_penalty, config.entropy_coef, config.reward_clip_range) == (1.0, 0.001, 5.0)
    with pytest.raises(ConfigError, match="loss_agg_mode must be one of"):
        parse_train_args(["--loss_agg_mode", "sum"])


def test_unknown_keys_are_errors(tmp_path):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text("learning_rat: 0.001\n")
    with pytest.raises(ConfigError, match="unknown key `learning_rat`.*learning_rate"):
        parse_train_args(["--config", str(config_file)])
    with pytest.raises(SystemExit):
        parse_train_args(["--learning_rat", "0.1"])


def test_invalid_values_exit_with_a_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--num_generations", "1"])
    assert exit_info.value.code == 2
    assert "num_generations" in capsys.readouterr().err


def test_help_shows_field_docstrings(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "KL coefficient" in out and "--num_generations" in out and "Alias of --beta" in out


def test_reward_func_resolution(tmp_path):
    module = tmp_path / "my_rewards.py"
    module.write_text("def count_sevens(completions, **kw):\n    return [c.count('7') for c in completions]\n")
    assert resolve_reward_func(f"{module}:count_sevens")(["77"]) == [2]
    assert resolve_reward_func("rloo.rewards:exact_match")(["4"], answer=["4"]) == [1.0]
    with pytest.raises(ConfigError, match="neither a built-in"):
        resolve_reward_func("nope")
    with pytest.raises(ConfigError, match="has no function"):
        resolve_reward_func("rloo.rewards:nope")


def test_cli_smoke_run(tmp_path, make_model, tokenizer):
    model_dir = tmp_path / "model"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) for a in range(16)))
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent(f"""\
        model_name_or_path: {model_dir}
        dataset_name: {data}
        reward_funcs: [exact_match]
        output_dir: {tmp_path / "out"}
        per_device_train_batch_size: 8
        num_generations: 4
        max_completion_length: 4
        max_steps: 2
        logging_steps: 1
        save_steps: 0
        beta: 0.0
        """))
    algorithm_flags = ["--advantage_estimator", "grpo", "--loss_agg_mode", "token-mean", "--epsilon_high", "0.3",
                       "--num_mini_batches", "2", "--stop_strings", "9", "--missing_eos_penalty", "0.5"]
    result = subprocess.run([sys.executable, "-m", "rloo.cli", "train", "--config", str(config), "--learning_rate", "1e-4",
                             *algorithm_flags], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    saved = json.loads((tmp_path / "out" / "rloo_config.json").read_text())
    assert saved["learning_rate"] == 1e-4 and saved["advantage_estimator"] == "grpo" and saved["stop_strings"] == ["9"]
    assert saved["num_mini_batches"] == 2 and saved["loss_agg_mode"] == "token-mean"
    assert "clip_ratio/high_mean" in json.loads(lines[0])
