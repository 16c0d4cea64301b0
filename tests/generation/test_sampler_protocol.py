"""The trainer receives its sampler: any object with sample() and on_optimizer_step() plugs in."""

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.generation import FastSampler, SampledBatch, Sampler


class RecordingSampler:
    """Wraps the fast sampler and records what the trainer asks of it."""

    def __init__(self, inner):
        self.inner, self.sample_calls, self.synced_models = inner, [], []

    def sample(self, model, prompts, num_generations):
        self.sample_calls.append((len(prompts), num_generations))
        return self.inner.sample(model, prompts, num_generations)

    def on_optimizer_step(self, model):
        # An engine with its own weights would copy them here; record a snapshot to check it is the updated policy.
        self.synced_models.append({name: p.detach().clone() for name, p in model.named_parameters()})


def _args(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, beta=0.0, max_steps=4, num_mini_batches=2, logging_steps=1, save_steps=0,
                  learning_rate=1e-2, seed=0)
    return RLOOConfig(**{**values, **overrides})


def test_an_injected_sampler_is_used_and_synced_after_every_optimizer_step(tmp_path, make_model, tokenizer,
                                                                          digit_dataset):
    sampler = RecordingSampler(FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4))
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_args(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer, sampler=sampler)
    assert trainer.sampler is sampler
    trainer.train()
    # 4 optimizer steps, 2 per rollout (num_mini_batches=2): 2 rollouts of 4 prompts x K=4.
    assert sampler.sample_calls == [(4, 4), (4, 4)]
    assert len(sampler.synced_models) == 4
    # Each sync sees the weights after that step: they change from one step to the next, and the
    # last one is the trained model.
    first, last = sampler.synced_models[0], sampler.synced_models[-1]
    assert any(not torch.equal(first[name], last[name]) for name in first)
    for name, parameter in trainer.model.named_parameters():
        torch.testing.assert_close(last[name], parameter.detach(), rtol=0, atol=0)


def test_the_built_in_samplers_follow_the_protocol(tokenizer):
    sampler = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4)
    assert isinstance(sampler, Sampler)


def test_an_object_that_cannot_sample_is_refused(tmp_path, make_model, tokenizer, digit_dataset):
    class OnlySamples:
        def sample(self, model, prompts, num_generations) -> SampledBatch: ...

    with pytest.raises(TypeError, match="on_optimizer_step"):
        RLOOTrainer(make_model(), digit_fraction, args=_args(tmp_path), train_dataset=digit_dataset,
                    processing_class=tokenizer, sampler=OnlySamples())


def test_a_call_s_length_limit_leaves_the_sampler_as_it_was(make_model, tokenizer):
    """A multi-turn turn needs fewer tokens than the sampler draws: `length_limit` gives the call's max_new_tokens
    (only below the configured length, only to a sampler whose `sample` takes it), and the sampler is not changed."""
    from rloo.generation.base import length_limit

    sampler = FastSampler(tokenizer.pad_token_id, [tokenizer.pad_token_id + 10_000], max_new_tokens=6)  # never ends
    assert length_limit(sampler, 2) == {"max_new_tokens": 2}
    assert length_limit(sampler, 6) == length_limit(sampler, 9) == length_limit(sampler, None) == {}
    assert length_limit(RecordingSampler(sampler), 2) == {}  # no max_new_tokens: it draws its own length
    model, prompts = make_model(), [tokenizer.encode("12+3=")]
    assert sampler.sample(model, prompts, 2, **length_limit(sampler, 2)).completion_ids.shape == (2, 2)
    assert sampler.max_new_tokens == 6 and sampler.sample(model, prompts, 2).completion_ids.shape == (2, 6)
