"""Statistics over the global batch, reward shaping forms (TRL v0 and v1), by hand."""

import math

import pytest
import torch

from rloo import RLOOConfig
from rloo.algo.advantages import compute_advantages, whiten
from rloo.algo.shaping import shape_scores


def fake_gather(*others):
    """Stands in for accelerator.gather on process 0: each call appends the next other-process tensor."""
    queue = list(others)
    return lambda tensor: torch.cat([tensor, queue.pop(0)])


def test_reward_clip_range_takes_a_float_or_a_pair():
    scores, ended = torch.tensor([-3.0, -0.5, 0.5, 3.0]), torch.ones(4, dtype=torch.bool)
    assert shape_scores(scores, ended, clip_range=1.0).tolist() == [-1.0, -0.5, 0.5, 1.0]  # TRL v0
    assert shape_scores(scores, ended, clip_range=(-2.0, 0.75)).tolist() == [-2.0, -0.5, 0.5, 0.75]  # TRL v1
    assert shape_scores(scores, ended, clip_range=[-0.25, 1]).tolist() == [-0.25, -0.25, 0.5, 1.0]  # from YAML
    assert RLOOConfig(reward_clip_range=(-1.0, 2.0)).reward_clip_range == (-1.0, 2.0)
    assert RLOOConfig(reward_clip_range=0.5).reward_clip_range == 0.5
    for bad in [(2.0, 1.0), (1.0,), -1.0, ("a", 1.0)]:
        with pytest.raises(ValueError, match="reward_clip_range must be a number > 0, a pair"):
            RLOOConfig(reward_clip_range=bad)


def test_normalize_rewards_with_one_scored_sample_centres_without_scaling():
    scores, ended = torch.tensor([5.0, 7.0, 9.0]), torch.ones(3, dtype=torch.bool)
    valid = torch.tensor([False, True, False])
    assert shape_scores(scores, ended, normalize=True, valid=valid).tolist() == [0.0, 0.0, 0.0]
    assert shape_scores(torch.tensor([4.0]), torch.ones(1, dtype=torch.bool), normalize=True).tolist() == [0.0]
    none_valid = shape_scores(scores, ended, normalize=True, valid=torch.zeros(3, dtype=torch.bool))
    assert none_valid.tolist() == [0.0, 0.0, 0.0]


def test_normalize_rewards_uses_the_global_mean_and_std():
    local, other = torch.tensor([1.0, 3.0]), torch.tensor([5.0, 7.0])
    # Global: mean 4, unbiased std sqrt(((-3)^2 + (-1)^2 + 1 + 9) / 3) = sqrt(20/3).
    std = math.sqrt(20 / 3)
    shaped = shape_scores(local, torch.ones(2, dtype=torch.bool), normalize=True,
                          gather=fake_gather(other, torch.ones(2)))
    torch.testing.assert_close(shaped, torch.tensor([-3 / (std + 1e-8), -1 / (std + 1e-8)]))


def test_whiten_uses_the_global_mean_and_std():
    local, other = torch.tensor([1.0, 3.0], dtype=torch.float64), torch.tensor([5.0, 7.0], dtype=torch.float64)
    # Global: mean 4, population std sqrt(20/4) = sqrt(5).
    whitened = whiten(local, gather=fake_gather(other, torch.ones(2, dtype=torch.float64)))
    torch.testing.assert_close(whitened, torch.tensor([-3.0, -1.0], dtype=torch.float64) / (math.sqrt(5) + 1e-8))
    # Invalid entries of the other process stay out of the statistics.
    masked = whiten(local, gather=fake_gather(torch.tensor([5.0, 100.0], dtype=torch.float64),
                                              torch.tensor([1.0, 0.0], dtype=torch.float64)))
    mean, std = 3.0, math.sqrt(((1 - 3) ** 2 + 0 + (5 - 3) ** 2) / 3)
    torch.testing.assert_close(masked, (local - mean) / (std + 1e-8))


def test_reinforce_pp_whitens_over_the_global_batch():
    local = torch.tensor([[1.0, 3.0]])  # the other process's group is [0, 10]
    # Centred per group: [-1, 1] here, [-5, 5] there; global mean 0, population std sqrt(52/4) = sqrt(13).
    advantages = compute_advantages(local, "reinforce_pp", gather=fake_gather(torch.tensor([[-5.0, 5.0]]),
                                                                             torch.ones(1, 2)))
    torch.testing.assert_close(advantages, torch.tensor([[-1.0, 1.0]]) / (math.sqrt(13) + 1e-8))


def test_top_p_and_top_k_warn_that_log_probs_are_unfiltered(caplog):
    import logging
    with caplog.at_level(logging.WARNING, logger="rloo.config"):
        RLOOConfig(top_p=0.9)
        RLOOConfig()
    messages = [r.getMessage() for r in caplog.records if "unfiltered distribution" in r.getMessage()]
    assert len(messages) == 1 and "top_p=0.9" in messages[0]


def test_cli_takes_the_clip_range_as_a_yaml_pair_or_a_float_flag(tmp_path):
    from rloo.cli import parse_train_args
    path = tmp_path / "config.yaml"
    path.write_text("reward_clip_range: [-1.0, 2.0]\nmodel_name_or_path: m\ndataset_name: d\n")
    assert parse_train_args(["--config", str(path)])[1].reward_clip_range == [-1.0, 2.0]
    assert parse_train_args(["--config", str(path), "--reward_clip_range", "0.5"])[1].reward_clip_range == 0.5
