"""Rewards inside the trainer: seed 000's thinking reward, None and the valid mask, per-function logs, errors."""

import json

import pytest
import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation import SampledBatch, completion_mask_from_eos, left_pad
from rloo.rewards import exact_match, thinking_answer_reward
from rloo.rewards.scoring import RewardError


class ScriptedSampler:
    """Returns fixed completion texts (one list of K per prompt, in order), so rewards are known in advance."""

    def __init__(self, tokenizer, groups):
        self.tokenizer, self.groups = tokenizer, groups

    def sample(self, model, prompts, num_generations):
        texts = [text for group in self.groups[: len(prompts)] for text in group]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id] for t in texts]
        width = max(map(len, ids))
        completion_ids = torch.tensor([seq + [self.tokenizer.pad_token_id] * (width - len(seq)) for seq in ids])
        completion_mask, has_eos = completion_mask_from_eos(completion_ids, [self.tokenizer.eos_token_id])
        prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(num_generations)], self.tokenizer.pad_token_id)
        return SampledBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, has_eos)

    def on_optimizer_step(self, model):
        pass


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=12, beta=0.0, max_steps=1, logging_steps=1, save_steps=0, seed=0,
                  shuffle_dataset=False)  # the scripted completions follow the dataset order
    return RLOOConfig(**{**values, **overrides})


DATASET = Dataset.from_list([{"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}])


def test_thinking_reward_through_the_trainer(tmp_path, make_model, tokenizer):
    reward = thinking_answer_reward(tokenizer)  # finds </think> by the tokenizer's id, as seed 000 did with 151668
    trainer = RLOOTrainer(make_model(), [reward, exact_match], args=_config(tmp_path), train_dataset=DATASET,
                          processing_class=tokenizer,
                          sampler=ScriptedSampler(tokenizer, [
        ["<think>2+2 is 4</think>4", "<think>hmm</think>5", "4", "<think>4 never closed"],
        ["<think>a</think>x</think>6", "<think>3+3</think>6", "<think>no</think>7", "<think>6"],
    ]))
    rollout, samples = trainer.collector.collect([DATASET[0], DATASET[1]], trainer.global_step, trainer.episode)
    # The decoded text has no think tags (they are special tokens), which is why the reward reads ids:
    # exact_match on text also credits "4", which has no reasoning block at all.
    assert samples.completions[:4] == ["2+2 is 44", "hmm5", "4", "4 never closed"]
    assert rollout.reward_columns[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert rollout.reward_columns[:, 1].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # Summed scores of group 1 are [1, 0, 1, 0]: A_i = r_i - mean of the other three.
    torch.testing.assert_close(rollout.advantages[:4], torch.tensor([2 / 3, -2 / 3, 2 / 3, -2 / 3]))
    trainer.train()
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert logged["rewards/thinking_answer/mean"] == pytest.approx(3 / 8)
    assert logged["rewards/thinking_answer/std"] == pytest.approx((3 / 8 * 5 / 8) ** 0.5)
    assert logged["rewards/exact_match/mean"] == pytest.approx(2 / 8)


def test_unscored_completions_get_zero_advantage_and_leave_the_baseline(tmp_path, make_model, tokenizer):
    def scores_digits(completions, **kwargs):  # "does not apply" to completions without a digit
        return [float(c.count("1")) if any(ch.isdigit() for ch in c) else None for c in completions]

    trainer = RLOOTrainer(make_model(), scores_digits, args=_config(tmp_path), train_dataset=DATASET,
                          processing_class=tokenizer,
                          sampler=ScriptedSampler(tokenizer, [["1", "11", "111", "abc"], ["x", "y", "1", "z"]]))
    rollout, _ = trainer.collector.collect([DATASET[0], DATASET[1]], trainer.global_step, trainer.episode)
    # Group 1: baselines over the other *scored* completions: 1-2, 2-(1+3)/2, 3-1.5; "abc" sits out with 0.
    # Group 2: a single scored completion has nobody to compare with: all 0.
    torch.testing.assert_close(rollout.advantages, torch.tensor([-1.5, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0]))
    trainer.train()
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert all(value == value for value in logged.values())  # no NaN anywhere
    assert logged["rewards/unscored_frac"] == pytest.approx(4 / 8)


def test_a_failing_reward_stops_training_naming_function_step_and_sample(tmp_path, make_model, tokenizer):
    def picky(completions, trainer_state, **kwargs):
        return [float("nan") if trainer_state["global_step"] == 1 and i == 5 else 1.0 for i in range(len(completions))]

    trainer = RLOOTrainer(make_model(), picky, args=_config(tmp_path, max_steps=3), train_dataset=DATASET,
                          processing_class=tokenizer,
                          sampler=ScriptedSampler(tokenizer, [["1", "2", "3", "4"], ["5", "6", "7", "8"]]))
    with pytest.raises(RewardError, match=r"`picky` returned nan for sample 5 at step 1[^\n]*\n *prompt: +3\+3=\n"
                                          r" *completion: 6"):
        trainer.train()
    assert trainer.global_step == 1  # step 0 trained, step 1 stopped before its update


def test_unscored_completions_carry_no_loss_weight(tmp_path, make_model, tokenizer, digit_dataset):
    def first_of_group_unscored(completions, **kwargs):
        return [None if i % 4 == 0 else float(len(c)) for i, c in enumerate(completions)]

    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, max_steps=1, save_steps=0, beta=0.0)
    trainer = RLOOTrainer(make_model(), first_of_group_unscored, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    assert rollout.trained.tolist() == [False, True, True, True] * 2
    assert rollout.advantages[[0, 4]].tolist() == [0.0, 0.0]
