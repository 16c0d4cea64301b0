"""`rloo train` takes the flags of TRL's `trl rloo` script: honoured, or refused with what to use instead."""

import pytest

from rloo.cli import main, parse_train_args
from rloo.config import ConfigError


def test_trl_script_flags_are_mapped():
    script, config, _ = parse_train_args([
        "--model_name_or_path", "m", "--dataset_name", "d", "--reward_funcs", "accuracy_reward",
        "--dataset_train_split", "tr", "--dataset_test_split", "te", "--eval_strategy", "steps", "--eval_steps", "5",
        "--reward_model_name_or_path", "rm", "--dtype", "bfloat16", "--model_revision", "v1",
        "--steps_per_generation", "2", "--use_peft", "--use_rslora", "--lora_modules_to_save", "lm_head",
        "--trust_remote_code", "--optim", "adamw_torch_fused", "--push_to_hub", "--hub_model_id", "me/x"])
    assert (script.dataset_split, script.eval_split) == ("tr", "te")
    assert script.reward_funcs == ["model:rm", "accuracy_reward"]
    assert config.model_init_kwargs == {"dtype": "bfloat16", "revision": "v1"} and config.trust_remote_code
    assert (config.num_mini_batches, config.eval_steps, config.optim) == (2, 5, "adamw_torch")
    assert (config.push_to_hub, config.hub_model_id) == (True, "me/x")
    assert script.trainer_kwargs == {"quantization_config": None}


def test_test_split_is_used_only_when_evaluating():
    script, _, _ = parse_train_args(["--dataset_test_split", "te"])
    assert script.eval_split is None  # TRL's script ignores it when eval_strategy is "no"


@pytest.mark.parametrize("argv, words", [
    (["--use_vllm"], ["sampler='vllm'", "pip install -e '.[vllm]'"]),  # use_vllm maps to sampler="vllm"; none here
    (["--vllm_model_impl", "transformers"], ["vllm_model_impl", "vLLM"]),
    (["--load_in_4bit"], ["load_in_4bit", "--use_peft"]),
    (["--dataset_streaming"], ["dataset_streaming", "IterableDataset"]),
    (["--datasets", "a", "b"], ["datasets", "--dataset_name"]),
    (["--lora_task_type", "SEQ_CLS"], ["lora_task_type", "CAUSAL_LM"]),
    (["--eval_strategy", "epoch"], ["eval_strategy", "eval_steps"]),
])
def test_refused_flags_say_what_to_use(argv, words):
    with pytest.raises(ConfigError) as error:
        parse_train_args(argv)
    for word in words:
        assert word in str(error.value)


def test_version_and_top_level_help(capsys):
    import rloo

    main(["--version"])
    assert capsys.readouterr().out.strip() == f"rloo {rloo.__version__}"
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    commands = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert commands == ["train", "eval", "report", "demo", "vllm-serve"]


def test_train_help_lists_trl_flags(capsys):
    with pytest.raises(SystemExit):
        parse_train_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--dataset_train_split", "--reward_model_name_or_path", "--load_in_4bit", "--steps_per_generation",
                 "--use_vllm"):
        assert flag in out
