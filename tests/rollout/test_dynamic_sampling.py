"""Dynamic sampling: only informative groups train, refilled up to a cap; the zero-spread console line."""

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.rollout import Rollout
from rloo.rollout.dynamic_sampling import DynamicSampler, concat_rollouts, select_rows_of


def _rollout(prompt_width, completion_width, start):
    """Two rows whose values are start, start + 1 (so their order is visible)."""
    rows = torch.tensor([start, start + 1.0])

    def block(width, fill=None):
        return (rows[:, None] if fill is None else torch.full((2, 1), fill)).expand(2, width).clone()

    return Rollout(prompt_ids=block(prompt_width).long(), prompt_mask=torch.ones(2, prompt_width, dtype=torch.long),
                   completion_ids=block(completion_width).long(),
                   completion_mask=torch.ones(2, completion_width, dtype=torch.long),
                   old_logps=None, ref_logps=None, raw_scores=rows, reward_columns=rows[:, None], scores=rows,
                   seq_kl=rows, rewards=rows, advantages=rows, token_advantages=None,
                   has_eos=torch.tensor([True, False]), trained=torch.tensor([True, True]),
                   is_weights=block(completion_width, 2.0), mismatch=torch.tensor([1.0, 2.0, 0.0, 0.5]))


def test_concat_pads_prompts_left_and_completions_right():
    joined = concat_rollouts([_rollout(1, 3, 0.0), _rollout(2, 1, 10.0)], pad_token_id=9)
    assert joined.prompt_ids.tolist() == [[9, 0], [9, 1], [10, 10], [11, 11]]
    assert joined.prompt_mask.tolist() == [[0, 1], [0, 1], [1, 1], [1, 1]]
    assert joined.completion_ids.tolist() == [[0, 0, 0], [1, 1, 1], [10, 9, 9], [11, 9, 9]]
    assert joined.completion_mask.tolist() == [[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert joined.is_weights[2].tolist() == [2.0, 1.0, 1.0]  # padding weighs 1
    assert joined.advantages.tolist() == [0.0, 1.0, 10.0, 11.0] and joined.old_logps is None
    assert joined.mismatch.tolist() == [2.0, 4.0, 0.0, 0.5]  # sums, and the max of the max
    picked = select_rows_of(joined, torch.tensor([3, 0]))
    assert picked.scores.tolist() == [11.0, 0.0] and picked.completion_ids[0].tolist() == [11, 9, 9]


def test_extra_prompts_depend_only_on_seed_rollout_round_and_process(tmp_path):
    args = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, dynamic_sampling=True)
    dataset = [{"prompt": str(i)} for i in range(100)]

    def rows(process, rollout, round_index):
        sampler = DynamicSampler(args, SimpleNamespace(process_index=process), None, dataset, 0)
        return [row["prompt"] for row in sampler.extra_rows(rollout, round_index)]

    assert rows(0, 3, 1) == rows(0, 3, 1) and len(rows(0, 3, 1)) == args.prompts_per_rollout
    assert rows(0, 3, 1) != rows(0, 3, 2) and rows(0, 3, 1) != rows(1, 3, 1) and rows(0, 3, 1) != rows(0, 4, 1)


def half_constant(prompts, completions, **kwargs):
    """Prompts starting with 0-3 get the same reward for every completion (zero spread); the rest digit_fraction."""
    varied = digit_fraction(completions)
    return [1.0 if prompt[0] in "0123" else value for prompt, value in zip(prompts, varied)]


def _metrics(tmp_path, make_model, tokenizer, digit_dataset, reward, **options):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, learning_rate=3e-3, max_steps=6, logging_steps=1, save_steps=0,
                      temperature=1.5, **options)
    trainer = RLOOTrainer(make_model(), reward, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_dynamic_sampling_trains_on_informative_groups(tmp_path, make_model, tokenizer, digit_dataset):
    lines = _metrics(tmp_path, make_model, tokenizer, digit_dataset, half_constant, dynamic_sampling=True,
                     dynamic_sampling_max_rounds=4)
    assert len(lines) == 6
    for line in lines:
        assert 1 <= line["dynamic_sampling/rounds"] <= 4
        assert line["dynamic_sampling/extra_prompts"] == 2 * (line["dynamic_sampling/rounds"] - 1)
        if line["dynamic_sampling/zero_spread_kept"] == 0:  # the rollout was filled with informative groups
            assert line["frac_reward_zero_std"] == 0.0
        else:
            assert line["frac_reward_zero_std"] == pytest.approx(line["dynamic_sampling/zero_spread_kept"] / 2)
    assert sum(line["dynamic_sampling/dropped_frac"] for line in lines) > 0  # half the prompts have zero spread


def test_every_group_zero_spread_is_reported_once(tmp_path, make_model, tokenizer, digit_dataset, capsys):
    def constant(completions, **kwargs):
        return [1.0] * len(completions)

    lines = _metrics(tmp_path, make_model, tokenizer, digit_dataset, constant, dynamic_sampling=True,
                     dynamic_sampling_max_rounds=2)
    out = capsys.readouterr().out
    assert out.count("got the same reward") == 1 and "dynamic_sampling" in out
    assert all(line["dynamic_sampling/zero_spread_kept"] == 2 and line["dynamic_sampling/dropped_frac"] == 1.0
               for line in lines)


@pytest.mark.parametrize("options", [dict(num_iterations=2), dict(num_mini_batches=2, beta=0.1, kl_penalty="token"),
                                     dict(beta=0.1, kl_penalty="loss", loss_agg_mode="token-mean")])
def test_dynamic_sampling_with_reuse_and_kl(tmp_path, make_model, tokenizer, digit_dataset, options):
    lines = _metrics(tmp_path, make_model, tokenizer, digit_dataset, half_constant, dynamic_sampling=True,
                     dynamic_sampling_max_rounds=4, **options)
    assert len(lines) == 6 and all(line["loss/policy_avg"] == line["loss/policy_avg"] for line in lines)  # no NaN
    for line in lines:
        if line["dynamic_sampling/zero_spread_kept"] == 0:
            assert line["frac_reward_zero_std"] == 0.0
