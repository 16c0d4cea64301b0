"""`rloo train` flags as `trl rloo` users type them: --no_<flag>, --push_to_hub true, and a one-line
"did you mean" for a misspelt flag."""

import json

import pytest

from rloo.cli import main, parse_train_args


@pytest.mark.parametrize("flag, field", [("--no_gradient_checkpointing", "gradient_checkpointing"),
                                         ("--no_shuffle_dataset", "shuffle_dataset"),
                                         ("--no_bf16", "bf16")])
def test_no_form_of_every_boolean(flag, field):
    _, config, _ = parse_train_args([f"--{field}", "true", flag])
    assert getattr(config, field) is False
    _, config, _ = parse_train_args([flag, f"--{field}"])  # the later flag wins
    assert getattr(config, field) is True


def test_no_form_of_trl_only_booleans():
    script, config, _ = parse_train_args(["--push_to_hub", "--no_push_to_hub"])
    assert config.push_to_hub is False
    script, _, _ = parse_train_args(["--use_peft", "--no_use_peft"])
    assert script.use_peft is False


def test_misspelt_flag_is_one_line_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--learnin_rate", "0.1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.strip().splitlines() == [err.strip()]  # one line, no usage dump
    assert "--learnin_rate" in err and "did you mean --learning_rate?" in err


@pytest.fixture
def model_dir(tmp_path, make_model, tokenizer):
    directory = tmp_path / "model"
    make_model().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_push_to_hub_true_pushes_after_training(tmp_path, model_dir, monkeypatch, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(8)))
    pushed = []
    monkeypatch.setattr("rloo.run.trainer_api.push_to_hub",
                        lambda output_dir, repo_id, *args, **kwargs: pushed.append((output_dir, repo_id)) or "url")
    out = tmp_path / "out"
    main(["train", "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--reward_funcs",
          "exact_match", "--output_dir", str(out), "--max_steps", "1", "--per_device_train_batch_size", "8",
          "--num_generations", "4", "--max_completion_length", "4", "--push_to_hub", "true",
          "--hub_model_id", "me/tiny"])
    assert pushed == [(str(out), "me/tiny")] and (out / "README.md").exists()
    assert "Pushed" in capsys.readouterr().out


# ------------------------------------------------------------------ GRPOConfig's own fields (issue #47)


def test_grpo_fields_are_flags_and_yaml_keys_answered_as_in_python(tmp_path, caplog, monkeypatch):
    """`rloo train --loss_type ... --scale_rewards ...` (and the same keys in YAML) are mapped, accepted or refused
    as `RLOOConfig(loss_type=...)` answers them in Python, never "unknown flag"; every GRPOConfig field is a flag."""
    import logging

    from rloo.cli.parser import build_train_parser
    from rloo.compat import grpo_fields
    from rloo.config import ConfigError

    flags = build_train_parser()._option_string_actions
    assert [name for name in grpo_fields.GRPO_FIELDS if f"--{name}" not in flags] == []
    yaml_file = tmp_path / "grpo.yaml"
    yaml_file.write_text("loss_type: grpo\nvllm_importance_sampling_clip_max: 2.5\n"
                         "multi_objective_aggregation: sum_then_normalize\n")
    monkeypatch.setattr(grpo_fields, "_announced", set())
    with caplog.at_level(logging.WARNING, logger="rloo.compat.grpo_fields"):
        _, config, _ = parse_train_args(["--config", str(yaml_file), "--scale_rewards", "none"])
    assert (config.loss_agg_mode, config.advantage_estimator, config.vllm_importance_sampling_cap) == (
        "seq-mean-token-mean", "drgrpo", 2.5)
    assert config.loss_type == "grpo"
    [announced] = [r.getMessage() for r in caplog.records]  # a ported GRPO config: the defaults that differ, once
    assert "GRPOConfig fields (loss_type, multi_objective_aggregation, scale_rewards" in announced
    assert "beta: 0.05 (GRPOConfig: 0.0)" in announced
    for argv, message in [(["--delta", "1.5"], r"`delta=1.5` is a field of TRL's GRPOConfig: .* Instead: epsilon"),
                          (["--scale_rewards", "batch"], r"`scale_rewards='batch'` is a field of TRL's GRPOConfig"),
                          (["--top_entropy_quantile", "0.2"], r"is a field of TRL's GRPOConfig: training only")]:
        with pytest.raises(ConfigError, match=message):
            parse_train_args(argv)


def test_a_plain_rloo_config_from_the_cli_announces_nothing(tmp_path, caplog, monkeypatch):
    import logging

    from rloo.compat import grpo_fields

    monkeypatch.setattr(grpo_fields, "_announced", set())
    yaml_file = tmp_path / "rloo.yaml"
    yaml_file.write_text("beta: 0.0\nnum_generations: 4\nloss_agg_mode: token-mean\n")
    with caplog.at_level(logging.WARNING, logger="rloo.compat.grpo_fields"):
        parse_train_args(["--config", str(yaml_file), "--learning_rate", "1e-5", "--push_to_hub", "false"])
    assert caplog.records == []
