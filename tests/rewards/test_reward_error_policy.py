"""A reward function that raises: the run stops (TRL's behaviour, the default) or, with
reward_error_policy="none", the completions it raised on are scored None and counted."""

import json
import logging
import math

import pytest
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.config_checks import ConfigError
from rloo.rewards.scoring import RewardError, RewardFunction, score_completions


def fails_on_sevens(completions, **kwargs):
    """1.0 per completion, but raises on any completion holding a '7'."""
    if any("7" in c for c in completions):
        raise ValueError("no sevens")
    return [1.0] * len(completions)


def test_none_policy_scores_the_raising_completions_none_and_counts_them():
    fn = RewardFunction.wrap(fails_on_sevens)
    arguments = {"prompts": ["a"] * 4, "completions": ["1", "7", "27", "3"], "completion_ids": [[1]] * 4}
    with pytest.raises(RewardError, match="raised ValueError: no sevens at step 5, on sample 1"):
        score_completions([fn], [1.0], arguments, 4, step=5)
    scored = score_completions([fn], [1.0], arguments, 4, step=5, error_policy="none")
    column = scored.per_function[:, 0].tolist()
    assert column[0] == 1.0 and math.isnan(column[1]) and math.isnan(column[2]) and column[3] == 1.0
    assert scored.errors == {"fails_on_sevens": 2} and scored.valid.tolist() == [True, False, False, True]


def test_the_policy_is_checked():
    with pytest.raises(ConfigError, match=r"reward_error_policy must be one of \('stop', 'none'\)"):
        RLOOConfig(reward_error_policy="skip")


def _trainer(tmp_path, model, tokenizer, reward, **overrides):
    args = RLOOConfig(**{**dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                                max_completion_length=3, max_steps=2, save_steps=0, report_to="none", beta=0.0,
                                logging_steps=1), **overrides})
    dataset = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
    return RLOOTrainer(model, reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_a_run_goes_on_and_logs_the_count(tmp_path, make_model, tokenizer):
    def raises_on_half(completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("batch too big")  # every completion alone works, so none is counted
        return [0.5]

    def always_raises(completions, **kwargs):
        raise RuntimeError("broken")

    trainer = _trainer(tmp_path, make_model(), tokenizer, [raises_on_half, always_raises],
                       reward_error_policy="none")
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [row for row in rows if "rewards/always_raises/errors" in row]
    assert logged and all(row["rewards/always_raises/errors"] == 4 for row in logged)
    assert all(row["rewards/raises_on_half/errors"] == 0 for row in logged)


def test_unscored_batches_are_warned_about_once(tmp_path, make_model, tokenizer, caplog):
    trainer = _trainer(tmp_path, make_model(), tokenizer, lambda completions, **kw: [None] * len(completions))
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert caplog.text.count("returned None for every one") == 1 and trainer.global_step == 2
