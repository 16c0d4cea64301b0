"""Bad inputs end in one clear message naming the input and the fix (docs/errors.md lists them)."""

import json
import logging
import re

import pytest

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.cli import main, parse_train_args
from rloo.config import ConfigError
from rloo.data.loading import load_prompt_dataset
from rloo.rewards.scoring import RewardError
from rloo.run.checkpoint import CheckpointError

CONFIG_CASES = [
    (dict(bf16="false"), "bf16 must be of type bool | None, got 'false'"),
    (dict(normalize_rewards="no"), "normalize_rewards must be of type bool"),
    (dict(learning_rate="1e-5"), "learning_rate must be of type float, got '1e-5'"),
    (dict(per_device_train_batch_size="8"), "per_device_train_batch_size must be of type int"),
    (dict(per_device_train_batch_size=True), "per_device_train_batch_size must be of type int"),
    (dict(seed=1.5), "seed must be of type int"),
    (dict(output_dir=3), "output_dir must be of type str"),
    (dict(learning_rate=float("inf")), "learning_rate must be a finite number"),
    (dict(learning_rate=float("nan")), "learning_rate must be a finite number"),
    (dict(beta=float("nan")), "beta must be a finite number"),
    (dict(max_grad_norm=float("inf")), "max_grad_norm must be a finite number"),
    (dict(reward_weights=[float("nan")]), "reward_weights must be a finite number"),
    (dict(reward_weights=[1.0, float("inf")]), "reward_weights must be a finite number"),
    (dict(missing_eos_penalty=float("inf")), "missing_eos_penalty must be a finite number"),
    (dict(output_dir=""), "output_dir must be a non-empty directory path"),
    (dict(output_dir="   "), "output_dir must be a non-empty directory path"),
    (dict(nan_policy="ignore"), "nan_policy must be one of"),
    (dict(overwrite_output_dir="yes"), "overwrite_output_dir must be of type bool"),
]


@pytest.mark.parametrize("values,message", CONFIG_CASES, ids=[next(iter(c[0])) + str(i) for i, c in enumerate(CONFIG_CASES)])
def test_config_values_of_the_wrong_type_or_not_finite(tmp_path, values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RLOOConfig(**{"output_dir": str(tmp_path / "run"), **values})


def test_yaml_and_flag_text_is_parsed_to_the_field_type(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("learning_rate: 1e-5\nbf16: false\nnormalize_rewards: no\nuse_peft: no\nmax_steps: 3\n")
    script, config, _ = parse_train_args(["--config", str(config_file)])
    assert config.learning_rate == 1e-5 and config.bf16 is False and config.normalize_rewards is False
    assert script.use_peft is False and config.max_steps == 3
    # Quoted text is refused as the Python API refuses it (bf16="false" in Python).
    for text, message in [("bf16: 'maybe'", "bf16 must be of type bool | None, got 'maybe'"),
                          ("learning_rate: fast", "learning_rate must be of type float, got 'fast'"),
                          ("lora_r: 'four'", "lora_r must be of type int"),
                          ("max_steps: '3'", "max_steps must be of type int, got '3'")]:
        config_file.write_text(text + "\n")
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_train_args(["--config", str(config_file)])
    _, config, _ = parse_train_args(["--bf16", "false", "--learning_rate", "1e-5"])  # flags are text: parsed
    assert config.bf16 is False and config.learning_rate == 1e-5


@pytest.mark.parametrize("argv,message", [
    (["--learning_rate", "inf"], "learning_rate must be a finite number"),
    (["--output_dir", ""], "output_dir must be a non-empty"),
    (["--nan_policy", "maybe"], "nan_policy must be one of"),
])
def test_cli_prints_config_errors_without_a_traceback(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err


def test_cli_reports_a_missing_model_path_and_an_empty_dataset(tmp_path, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model_name_or_path", str(tmp_path / "nope"), "--dataset_name", str(data),
              "--reward_funcs", "exact_match", "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "does not exist" in capsys.readouterr().err  # checked before the data
    with pytest.raises(ConfigError, match="is empty"):
        load_prompt_dataset(str(data))


def _trainer(tmp_path, model, tokenizer, dataset, reward=digit_fraction, **overrides):
    args = RLOOConfig(**{**dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                                max_completion_length=4, max_steps=1, logging_steps=1, save_steps=0, beta=0.0),
                         **overrides})
    return RLOOTrainer(model, reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_trainer_inputs(tmp_path, make_model, tokenizer, digit_dataset):
    with pytest.raises(ConfigError, match="needs reward_funcs"):
        _trainer(tmp_path, make_model(), tokenizer, digit_dataset, reward=[])
    with pytest.raises(ConfigError, match="model path .* does not exist"):
        _trainer(tmp_path, str(tmp_path / "no" / "such" / "model"), tokenizer, digit_dataset)
    with pytest.raises(ConfigError, match="without config.json"):
        _trainer(tmp_path, str(tmp_path), tokenizer, digit_dataset)


def test_a_reward_model_given_as_the_policy_is_refused(tmp_path, make_model, tokenizer, digit_dataset):
    from transformers import AutoModelForSequenceClassification

    model = make_model()
    model.save_pretrained(tmp_path / "lm")
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=1)
    classifier.save_pretrained(tmp_path / "rm")
    with pytest.raises(ConfigError, match="sequence-classification model.*causal LM"):
        _trainer(tmp_path, str(tmp_path / "rm"), tokenizer, digit_dataset)
    with pytest.raises(ConfigError, match="sequence-classification model"):
        _trainer(tmp_path, classifier, tokenizer, digit_dataset)


def test_rewards_overflowing_float32_and_all_unscored_batches(tmp_path, make_model, tokenizer, digit_dataset, caplog):
    huge = _trainer(tmp_path, make_model(), tokenizer, digit_dataset, reward=lambda completions, **kw: [1e39] * len(completions))
    with pytest.raises(RewardError, match="not finite in float32"):
        huge.train()
    weighted = _trainer(tmp_path, make_model(), tokenizer, digit_dataset, reward_weights=[1e38],
                        reward=lambda completions, **kw: [10.0] * len(completions), overwrite_output_dir=True)
    with pytest.raises(RewardError, match="times weight 1e\\+38 is not finite"):
        weighted.train()
    unscored = _trainer(tmp_path, make_model(), tokenizer, digit_dataset, overwrite_output_dir=True,
                        reward=lambda completions, **kw: [None] * len(completions))
    with caplog.at_level(logging.WARNING):
        unscored.train()
    assert "returned None for every one" in caplog.text


def test_a_corrupt_checkpoint_is_named(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = _trainer(tmp_path, make_model(), tokenizer, digit_dataset, save_steps=1)
    trainer.train()
    state_file = tmp_path / "run" / "checkpoint-1" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    (tmp_path / "run" / "checkpoint-1" / "model.safetensors").write_bytes(b"garbage")
    again = _trainer(tmp_path / "b", make_model(), tokenizer, digit_dataset)
    with pytest.raises(CheckpointError, match="damaged: model.safetensors differs"):
        again.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    state_file.write_text("{not json")
    with pytest.raises(CheckpointError, match="not an rloo checkpoint"):
        again.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    del state["manifest"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="no file manifest"):
        again.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
