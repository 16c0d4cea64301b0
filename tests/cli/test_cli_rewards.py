"""`--reward_funcs` forms (built-ins, factories with arguments, reward models) and the new config flags."""

import pytest

from rloo.cli import parse_train_args, resolve_reward_func
from rloo.config import ConfigError, RLOOConfig
from rloo.rewards import math_accuracy


def test_builtins_and_factories_with_arguments(tokenizer):
    assert resolve_reward_func("math_accuracy") is math_accuracy
    penalty = resolve_reward_func("length_penalty:target_length=4,scale=2")
    assert penalty(completion_ids=[[1, 2]]) == [-1.0]
    thinking = resolve_reward_func("thinking_answer_reward", tokenizer)  # the policy's tokenizer is passed in
    assert thinking.think_end_id == tokenizer.convert_tokens_to_ids("</think>")
    with pytest.raises(ConfigError, match="length_penalty: .*target_length"):
        resolve_reward_func("length_penalty")
    with pytest.raises(ConfigError, match="expected key=value"):
        resolve_reward_func("length_penalty:4")


def test_reward_model_specs(tmp_path):
    assert resolve_reward_func("model:org/reward-model") == "org/reward-model"
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "config.json").write_text("{}")
    assert resolve_reward_func(str(tmp_path / "rm")) == str(tmp_path / "rm")  # a model directory needs no prefix
    with pytest.raises(ConfigError, match="reward model"):
        resolve_reward_func(str(tmp_path))  # a directory without config.json is not a model


def test_prompt_flags_parse_and_validate():
    _, config, _ = parse_train_args(["--chat_template_kwargs", '{"enable_thinking": false}',
                                     "--truncate_prompts", "error"])
    assert config.chat_template_kwargs == {"enable_thinking": False} and config.truncate_prompts == "error"
    with pytest.raises(ConfigError, match="truncate_prompts must be one of"):
        RLOOConfig(truncate_prompts="right")
    with pytest.raises(ConfigError, match="chat_template_kwargs must be a mapping"):
        RLOOConfig(chat_template_kwargs=["enable_thinking"])


def test_cli_trains_with_a_builtin_and_a_reward_model(tmp_path, make_model, tokenizer):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rewards"))
    from test_reward_models import _classifier

    for directory, model in [(tmp_path / "policy", make_model()), (tmp_path / "rm", _classifier(tokenizer))]:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)})
                              for a in range(8)))
    result = subprocess.run(
        [sys.executable, "-m", "rloo.cli", "train", "--model_name_or_path", str(tmp_path / "policy"),
         "--dataset_name", str(data), "--reward_funcs", "exact_match", f"model:{tmp_path / 'rm'}",
         "--reward_weights", "1.0", "0.5", "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "8",
         "--num_generations", "4", "--max_completion_length", "4", "--max_steps", "1", "--save_steps", "0",
         "--beta", "0.0", "--chat_template_kwargs", "{enable_thinking: false}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    logged = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"rewards/exact_match/mean", "rewards/rm/mean"} <= logged.keys()
