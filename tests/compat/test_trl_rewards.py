"""TRL's reward contract: trainer_state as an object, log_extra / log_metric, TRL's built-in reward
names, and dotted module.function paths on the command line."""

import json

import pytest
from transformers import TrainerState

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.cli import resolve_reward_func
from rloo.rewards import (
    accuracy_reward,
    get_soft_overlong_punishment,
    math_accuracy,
    reasoning_accuracy_reward,
    think_format_reward,
)


def test_trainer_state_log_extra_and_log_metric_reach_the_logs(tmp_path, make_model, tokenizer, digit_dataset):
    seen = []

    def tracked(completions, trainer_state, log_extra, log_metric, **kwargs):
        seen.append((isinstance(trainer_state, TrainerState), trainer_state.global_step, trainer_state["episode"]))
        log_extra("length", [len(c) for c in completions])
        log_metric("custom/half", 0.5)
        return digit_fraction(completions)

    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=2, logging_steps=1, save_steps=0, beta=0.0,
                      log_completions=True, num_completions_to_print=3)
    trainer = RLOOTrainer(make_model(), tracked, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    assert seen == [(True, 0, 0), (True, 1, 8)]
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert all(row["length"] == len(row["completion"]) for row in rows) and len(rows) == 6
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["custom/half"] for m in logged] == [0.5, 0.5]


def test_trl_reward_names_match_trl_semantics():
    assert accuracy_reward([r"\boxed{\frac{1}{2}}", "3"], solution=["0.5", "4"]) == [1.0, 0.0]
    assert accuracy_reward(["4"], answer=["4"]) == math_accuracy(["4"], answer=["4"]) == [1.0]
    assert think_format_reward(["<think>x</think> 4", "4"]) == [1.0, 0.0]
    assert reasoning_accuracy_reward(["<think>maybe 3</think> 4", "<think>4", "4"], solution=["4"] * 3) == [1.0, 0.0, 0.0]
    punish = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    assert punish(completion_ids=[[0] * 6, [0] * 8, [0] * 10, [0] * 11]) == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="solution"):
        accuracy_reward(["4"])


def test_cli_resolves_trl_names_and_dotted_paths():
    assert resolve_reward_func("accuracy_reward") is accuracy_reward
    assert resolve_reward_func("think_format_reward") is think_format_reward
    assert resolve_reward_func("conftest.digit_fraction") is digit_fraction
    assert resolve_reward_func("conftest:digit_fraction") is digit_fraction
