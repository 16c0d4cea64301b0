"""Asynchronous rollouts: one rollout of staleness exactly, pi_old from the sampling weights, timeouts."""

import json
import time

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.async_rollouts import RolloutTimeout
from rloo.config import ConfigError
from rloo.generation import FastSampler

from conftest import digit_fraction


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=6, learning_rate=3e-3, beta=0.0, max_steps=4, logging_steps=1,
                  save_steps=0, seed=0, async_rollouts=True)
    return RLOOConfig(**{**values, **overrides})


class RecordingSampler(FastSampler):
    """The fast sampler, noting a fingerprint of the weights it samples with."""

    def __init__(self, tokenizer, max_new_tokens):
        super().__init__(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=max_new_tokens)
        self.seen = []

    def sample(self, model, prompts, num_generations):
        self.seen.append(sum(p.double().sum().item() for p in model.parameters()))
        return super().sample(model, prompts, num_generations)


def _fingerprint(model):
    return sum(p.double().sum().item() for p in model.parameters())


def test_each_rollout_is_sampled_one_rollout_behind(tmp_path, make_model, tokenizer, digit_dataset):
    sampler = RecordingSampler(tokenizer, 6)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer, sampler=sampler)
    weights = [_fingerprint(trainer.model)]  # W0, then W_r after rollout r's step (one step per rollout)
    trained_on = []
    original_step = trainer.learner.step

    def step(mini_batch):
        trained_on.append(mini_batch.old_logps is not None)
        stats = original_step(mini_batch)
        weights.append(_fingerprint(trainer.model))
        return stats

    trainer.learner.step = step
    trainer.train()
    # Rollout 0 from W0 (on-policy), rollout r >= 1 from W_{r-1} while training from W_r: staleness one rollout.
    # The thread starts rollout 4 after rollout 3 too (max_steps cuts it), from W3.
    assert sampler.seen[:4] == pytest.approx([weights[0], weights[0], weights[1], weights[2]], rel=0, abs=1e-9)
    assert weights[1] != weights[0] and all(trained_on)  # pi_old is always kept (from the sampling weights)


def test_async_rollouts_learn(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, per_device_train_batch_size=32, max_steps=40, learning_rate=1e-2, logging_steps=5)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [line["reward"] for line in lines]
    assert lines[-1]["step"] == 40 and rewards[-1] > rewards[0] + 0.3, rewards
    assert any(line["val/ratio"] != 1.0 for line in lines)  # the stale batches are trained off-policy


def test_a_hung_rollout_raises_after_the_timeout(tmp_path, make_model, tokenizer, digit_dataset):
    def slow(completions, **kwargs):
        time.sleep(1.5)
        return [0.0] * len(completions)

    trainer = RLOOTrainer(make_model(), slow, args=_config(tmp_path, async_rollout_timeout=0.2),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    with pytest.raises(RolloutTimeout, match="waited 0 s .*rollout 0"):
        trainer.train()


@pytest.mark.parametrize("options", [dict(sampler="paged"), dict(dynamic_sampling=True), dict(async_rollout_timeout=0)])
def test_unsupported_combinations_are_refused(tmp_path, options):
    with pytest.raises(ConfigError, match="async_rollout"):
        _config(tmp_path, **options)


def test_sampler_weights_are_a_copy(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    snapshot = trainer.async_rollouts.snapshot
    assert all(not p.requires_grad for p in snapshot.parameters())
    with torch.no_grad():
        next(trainer.model.parameters()).add_(1.0)
    assert _fingerprint(snapshot) != _fingerprint(trainer.model)
    trainer.async_rollouts.sync_weights()
    assert _fingerprint(snapshot) == _fingerprint(trainer.model)
