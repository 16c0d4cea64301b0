"""TRL's metrics rloo logs under TRL's names: terminated lengths, clip-ratio extremes, step_time, and the
learning rate of the step that used it. Hand-computed values; TRL 1.16's rloo_trainer defines each."""

import json
import math

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.run.metrics import clip_extremes, completion_clip_extremes, length_metrics


def test_terminated_lengths_are_over_the_completions_that_ended():
    lengths = torch.tensor([3, 8, 5, 8])
    truncated = torch.tensor([False, True, False, True])  # 8-token ones hit max_completion_length
    m = length_metrics(lengths, truncated)
    assert (m["completions/mean_length"], m["completions/min_length"], m["completions/max_length"]) == (6.0, 3.0, 8.0)
    assert m["completions/clipped_ratio"] == 0.5
    assert (m["completions/mean_terminated_length"], m["completions/min_terminated_length"],
            m["completions/max_terminated_length"]) == (4.0, 3.0, 5.0)


def test_terminated_lengths_are_zero_when_no_completion_ended_as_in_trl():
    m = length_metrics(torch.tensor([8, 8]), torch.tensor([True, True]))
    assert (m["completions/mean_terminated_length"], m["completions/min_terminated_length"],
            m["completions/max_terminated_length"]) == (0.0, 0.0, 0.0)
    assert m["completions/clipped_ratio"] == 1.0


def test_clip_extremes_of_one_ratio_per_completion():
    # 4 completions, the last not trained (no units): it is left out of the min and the max.
    low, high = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.0, 1.0])
    units = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert completion_clip_extremes(low, high, units) == (0.0, 0.0)
    assert completion_clip_extremes(low, high, torch.tensor([1.0, 1.0, 0.0, 0.0])) == (1.0, 0.0)
    assert all(math.isnan(v) for v in completion_clip_extremes(low, high, torch.zeros(4)))


def test_clip_extremes_of_per_token_ratios_are_fractions_of_each_completions_tokens():
    low = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    high = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # the second completion has 2 tokens
    low_min, high_max = completion_clip_extremes(low, high, mask)
    assert low_min == pytest.approx(min(2 / 4, 1 / 2)) and high_max == pytest.approx(max(1 / 4, 1 / 2))


def test_step_clip_extremes_take_min_and_max_over_processes_then_mean_over_micro_batches():
    nan = float("nan")
    per = torch.tensor([  # (P=2, M=3, 2)
        [[0.5, 0.0], [0.0, 1.0], [nan, nan]],
        [[0.25, 0.5], [1.0, 0.0], [nan, nan]],
    ])
    m = clip_extremes(per)
    # micro-batch 0: min(0.5, 0.25), max(0, 0.5); 1: min(0, 1), max(1, 0); 2: nothing trained anywhere.
    assert m["clip_ratio/low_min"] == pytest.approx((0.25 + 0.0) / 2)
    assert m["clip_ratio/high_max"] == pytest.approx((0.5 + 1.0) / 2)
    per[1, 2] = torch.tensor([1.0, 1.0])  # one process trained in micro-batch 2
    m = clip_extremes(per)
    assert m["clip_ratio/low_min"] == pytest.approx((0.25 + 0.0 + 1.0) / 3)
    assert clip_extremes(torch.full((2, 1, 2), nan)) == {}


def test_logged_learning_rate_is_the_one_each_step_used(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, learning_rate=1e-5, lr_scheduler_type="linear", max_steps=3,
                      logging_steps=1, save_steps=0, seed=0)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Linear decay to 0 over 3 steps: steps 1, 2, 3 use 1e-5, 2/3e-5 and 1/3e-5 (TRL logs the same).
    assert [r["learning_rate"] for r in rows] == pytest.approx([1e-5, 1e-5 * 2 / 3, 1e-5 / 3])
    assert [r["lr"] for r in rows] == [r["learning_rate"] for r in rows]
    for row in rows:
        assert row["step_time"] > 0
        assert row["completions/min_terminated_length"] <= row["completions/mean_terminated_length"] <= \
            row["completions/max_terminated_length"] <= args.max_completion_length
        assert 0.0 <= row["clip_ratio/low_min"] <= row["clip_ratio/low_mean"]
        assert row["clip_ratio/high_mean"] <= row["clip_ratio/high_max"] <= 1.0


def test_step_time_counts_the_rollouts_sampling_in_its_first_step(tmp_path, make_model, tokenizer, digit_dataset,
                                                                 monkeypatch):
    import itertools
    import types

    from rloo import update

    ticks = itertools.count(1.0)  # a clock that moves one second per reading, read only by update.py
    monkeypatch.setattr(update, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, num_iterations=2, max_steps=4, logging_steps=1, save_steps=0, seed=0)
    RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Each rollout: sampling 1 s, then two steps of 1 s each; the first step also carries the sampling.
    assert [r["step_time"] for r in rows] == [2.0, 1.0, 2.0, 1.0]
