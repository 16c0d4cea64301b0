"""A logging window averages each metric weighted by the units it is over, so uneven steps pool correctly."""

import pytest

from rloo.run.metrics import MetricsWindow, step_metrics


def test_token_metrics_are_weighted_by_tokens_over_uneven_steps():
    window = MetricsWindow()
    # Step A: 10 tokens at entropy 1.0; step B: 30 tokens at entropy 2.0. Pooled: (10 + 60) / 40 = 1.75
    # (an unweighted mean of the two steps would say 1.5).
    window.add({"policy/entropy_avg": 1.0, "train/completion_tokens": 10.0, "reward": 0.0})
    window.add({"policy/entropy_avg": 2.0, "train/completion_tokens": 30.0, "reward": 1.0})
    means = window.mean_and_reset()
    assert means["policy/entropy_avg"] == pytest.approx(1.75)
    assert means["reward"] == pytest.approx(0.5)  # per-rollout values: one vote per recording
    assert means["train/completion_tokens"] == pytest.approx(20.0)
    assert window.mean_and_reset() == {}


def test_window_of_step_metrics_equals_one_pooled_step():
    # Two token-mean steps with uneven tokens: the window's loss and clip fraction must equal those of
    # the two steps' sums taken as one step.
    def totals(loss, tokens, clipped, entropy):
        return {"loss": loss, "units": tokens, "clipped_low": clipped, "clipped_high": 0.0, "ratio": tokens,
                "ratio_sq": tokens, "approxkl": 0.0, "entropy": entropy, "tokens": tokens, "kl_loss": 0.0}

    first, second = totals(6.0, 12.0, 3.0, 6.0), totals(-2.0, 4.0, 0.0, 8.0)
    window = MetricsWindow()
    window.add(step_metrics(first, denominator=12.0, with_kl_loss=False))
    window.add(step_metrics(second, denominator=4.0, with_kl_loss=False))
    pooled = step_metrics({key: first[key] + second[key] for key in first}, denominator=16.0, with_kl_loss=False)
    means = window.mean_and_reset()
    for key in ("loss/policy_avg", "policy/clipfrac_avg", "policy/entropy_avg", "val/ratio"):
        assert means[key] == pytest.approx(pooled[key]), key
    assert means["loss/policy_avg"] == pytest.approx(4.0 / 16.0)  # not (0.5 + -0.5) / 2 = 0


def test_a_metric_with_zero_weight_everywhere_is_left_out():
    window = MetricsWindow()
    window.add({"policy/entropy_avg": 1.0, "train/completion_tokens": 0.0})
    assert window.mean_and_reset() == {"train/completion_tokens": 0.0}
