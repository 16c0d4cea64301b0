"""Asynchronous rollouts: staleness of one rollout exactly, or at most max_staleness; pi_old from the sampling
weights; timeouts."""

import functools
import json
import time

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.generation import FastSampler
from rloo.rollout.async_rollouts import AsyncRollouts, RolloutTimeout


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=6, learning_rate=3e-3, beta=0.0, max_steps=4, logging_steps=1,
                  save_steps=0, seed=0, async_rollouts=True)
    return RLOOConfig(**{**values, **overrides})


class RecordingSampler(FastSampler):
    """The fast sampler, noting a fingerprint of the weights it samples with in a file (the sampler may run
    in a child process)."""

    def __init__(self, tokenizer, max_new_tokens, path, delay_s=0.0):
        super().__init__(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=max_new_tokens)
        self.path, self.delay_s = path, delay_s

    def sample(self, model, prompts, num_generations):
        with open(self.path, "a") as handle:
            handle.write(f"{_fingerprint(model)!r}\n")
        time.sleep(self.delay_s)  # the weights must not change under a sampler that is still at work
        return super().sample(model, prompts, num_generations)

    def seen(self):
        return [float(line) for line in open(self.path).read().splitlines()]


def _fingerprint(model):
    return sum(p.double().sum().item() for p in model.parameters())


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_each_rollout_is_sampled_one_rollout_behind(tmp_path, make_model, tokenizer, digit_dataset, worker,
                                                    monkeypatch):
    monkeypatch.setattr("rloo.rollout.async_rollouts.AsyncRollouts", functools.partial(AsyncRollouts, worker=worker))
    sampler = RecordingSampler(tokenizer, 6, tmp_path / "seen.txt")
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
    assert sampler.seen()[:4] == pytest.approx([weights[0], weights[0], weights[1], weights[2]], rel=0, abs=1e-9)
    assert weights[1] != weights[0] and all(trained_on)  # pi_old is always kept (from the sampling weights)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["async/staleness"] for line in lines if "async/staleness" in line] == [0, 1, 1, 1]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_max_staleness_bounds_how_far_the_sampler_runs_ahead(tmp_path, make_model, tokenizer, digit_dataset, worker,
                                                             monkeypatch):
    # A slow learner (0.3 s a step) and max_staleness 2: the sampler queues two rollouts ahead and each
    # starts from the newest weights, so rollout r is sampled from W_{r-2} (W0 for the first three).
    monkeypatch.setattr("rloo.rollout.async_rollouts.AsyncRollouts", functools.partial(AsyncRollouts, worker=worker))
    sampler = RecordingSampler(tokenizer, 6, tmp_path / "seen.txt")
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=6, max_staleness=2),
                          train_dataset=digit_dataset, processing_class=tokenizer, sampler=sampler)
    weights = [_fingerprint(trainer.model)]
    original_step = trainer.learner.step

    def slow_step(mini_batch):
        time.sleep(0.3)
        stats = original_step(mini_batch)
        weights.append(_fingerprint(trainer.model))
        return stats

    trainer.learner.step = slow_step
    trainer.train()
    assert sampler.seen()[:6] == pytest.approx([weights[0], weights[0], weights[0], weights[1], weights[2], weights[3]],
                                               rel=0, abs=1e-9)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["async/staleness"] for line in lines if "async/staleness" in line] == [0, 1, 2, 2, 2, 2]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_slow_sampler_keeps_its_weights_while_the_learner_publishes(tmp_path, make_model, tokenizer, digit_dataset,
                                                                       worker, monkeypatch):
    # A slow sampler (0.3 s a rollout) and max_staleness 2: the learner publishes new weights while the
    # sampler is still sampling. Each rollout is sampled from one whole published W_j, j >= r - 2.
    monkeypatch.setattr("rloo.rollout.async_rollouts.AsyncRollouts", functools.partial(AsyncRollouts, worker=worker))
    sampler = RecordingSampler(tokenizer, 6, tmp_path / "seen.txt", delay_s=0.3)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=6, max_staleness=2),
                          train_dataset=digit_dataset, processing_class=tokenizer, sampler=sampler)
    weights = [_fingerprint(trainer.model)]
    original_step = trainer.learner.step

    def step(mini_batch):
        stats = original_step(mini_batch)
        weights.append(_fingerprint(trainer.model))
        return stats

    trainer.learner.step = step
    trainer.train()
    for rollout_index, seen in enumerate(sampler.seen()[:6]):
        sources = [j for j, w in enumerate(weights) if abs(w - seen) < 1e-9]
        assert sources and rollout_index - 2 <= sources[0] <= max(0, rollout_index - 1), (rollout_index, sources)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= line["async/staleness"] <= 2 for line in lines if "async/staleness" in line)


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


@pytest.mark.parametrize("options", [dict(sampler="paged"), dict(dynamic_sampling=True), dict(async_rollout_timeout=0),
                                     dict(max_staleness=0), dict(max_staleness=1.5),
                                     dict(max_staleness=2, async_rollouts=False)])
def test_unsupported_combinations_are_refused(tmp_path, options):
    with pytest.raises(ConfigError, match="async_rollout|max_staleness"):
        _config(tmp_path, **options)


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_sampler_weights_are_a_copy(tmp_path, make_model, tokenizer, digit_dataset, worker):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    rollouts = AsyncRollouts(trainer.collector, 60.0, worker=worker)
    try:
        snapshot = rollouts.snapshot
        assert all(not p.requires_grad for p in snapshot.parameters())
        with torch.no_grad():
            next(trainer.model.parameters()).add_(1.0)
        assert _fingerprint(snapshot) != _fingerprint(trainer.model)
        rollouts.sync_weights()
        assert _fingerprint(snapshot) == _fingerprint(trainer.model)
        rollout, samples, metrics = rollouts.next(0, trainer._rows, 0, 0, num_rollouts=1)
        assert metrics == {"async/staleness": 0.0} and rollout.old_logps is not None
        assert len(samples.completions) == rollout.scores.numel() == 8
    finally:
        rollouts.close()


def test_the_forked_sampler_at_max_staleness_2_leaves_no_unused_copy_in_the_parent(tmp_path, make_model, tokenizer,
                                                                                    digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_staleness=2),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    rollouts = AsyncRollouts(trainer.collector, 60.0, max_staleness=2, worker="process")
    try:
        assert all(p.numel() == 0 for p in rollouts.snapshot.parameters())  # only the child reads its copy
        rollout, samples, _ = rollouts.next(0, trainer._rows, 0, 0, num_rollouts=1)
        assert rollout.old_logps is not None and len(samples.completions) == 8
    finally:
        rollouts.close()
