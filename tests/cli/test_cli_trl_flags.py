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
