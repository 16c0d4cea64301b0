"""Truncated importance sampling and the sampler-mismatch metrics, against hand-computed values."""

import math

import pytest
import torch

from rloo.algo.importance import mismatch_metrics, mismatch_sums, truncated_importance_weights
from rloo.config import ConfigError, RLOOConfig


def test_weights_are_capped_ratios_and_one_at_padding():
    old = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.3), math.log(0.4)]])
    mask = torch.tensor([[1, 1, 0]])
    weights = truncated_importance_weights(old, sampler, mask, cap=2.0)
    # 0.5/0.25 = 2 (at the cap), 0.9/0.3 = 3 -> capped to 2, padding -> 1 (not 0.2/0.4 = 0.5).
    assert weights[0].tolist() == pytest.approx([2.0, 2.0, 1.0])
    uncapped = truncated_importance_weights(old, sampler, torch.ones(1, 3), cap=10.0)
    assert uncapped[0].tolist() == pytest.approx([2.0, 3.0, 0.5])


def test_weights_carry_no_gradient():
    old = torch.zeros(1, 2, requires_grad=True)
    weights = truncated_importance_weights(old, torch.full((1, 2), -0.1), torch.ones(1, 2), cap=2.0)
    assert not weights.requires_grad


def test_mismatch_metrics_by_hand():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2], [0.1, 0.1, 0.1]]))
    sampler = torch.log(torch.tensor([[0.25, 0.3, 0.4], [0.1, 0.05, 0.7]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    sums = mismatch_sums(old, sampler, mask, cap=2.0)
    # |log ratios| on real tokens: ln2, ln3, 0, ln2, ln7; capped (ratio > 2): only 3.
    assert sums.tolist() == pytest.approx([2 * math.log(2) + math.log(3) + math.log(7), 5.0, 1.0, math.log(7)], rel=1e-5)
    other = torch.tensor([1.0, 5.0, 4.0, 0.5])  # a second process
    metrics = mismatch_metrics(torch.stack([sums, other]))
    assert metrics["sampler/mean_abs_log_ratio"] == pytest.approx((sums[0].item() + 1.0) / 10)
    assert metrics["sampler/max_abs_log_ratio"] == pytest.approx(math.log(7), rel=1e-5)
    assert metrics["sampler/frac_capped"] == pytest.approx(5 / 10)


def test_cap_below_one_is_refused():
    with pytest.raises(ConfigError, match="vllm_importance_sampling_cap"):
        RLOOConfig(vllm_importance_sampling_cap=0.5)


class ShiftedLogprobSampler:
    """The fast sampler, reporting the policy's own log-probs shifted by `shift` as the sampler's:
    a stand-in for an engine whose numbers differ from the trainer's by a known amount."""

    def __init__(self, tokenizer, shift):
        from rloo.generation import FastSampler

        self.inner = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4)
        self.shift = shift

    def on_optimizer_step(self, model):
        pass

    @torch.no_grad()
    def sample(self, model, prompts, num_generations):
        from rloo.passes.logprobs import completion_logprobs

        batch = self.inner.sample(model, prompts, num_generations)
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
        logps, _ = completion_logprobs(model, ids, mask, batch.completion_ids.shape[1], 1.0)
        batch.logprobs = (logps + self.shift) * batch.completion_mask
        batch.logprobs_from_policy = False  # another engine's numbers, to be checked against the trainer's
        return batch


@pytest.mark.parametrize("shift,correction,expected_capped", [(0.0, True, 0.0), (-1.0, True, 1.0), (-1.0, False, 1.0)])
def test_trainer_measures_and_corrects_the_mismatch(tmp_path, make_model, tokenizer, digit_dataset, shift, correction,
                                                    expected_capped):
    from conftest import digit_fraction
    from rloo import RLOOTrainer

    args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, beta=0.0,
                      max_completion_length=4, max_steps=1, save_steps=0, logging_steps=1,
                      vllm_importance_sampling_correction=correction)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer, sampler=ShiftedLogprobSampler(tokenizer, shift))
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    mask = rollout.completion_mask.bool()
    if correction:  # exp(1) > cap 2: every real token's weight is the cap; no shift: weight 1
        assert rollout.is_weights[mask].tolist() == pytest.approx([2.0 if shift else 1.0] * int(mask.sum()), rel=1e-4)
    else:
        assert rollout.is_weights is None
    metrics = trainer.train()
    assert metrics["sampler/mean_abs_log_ratio"] == pytest.approx(abs(shift), abs=1e-4)
    assert metrics["sampler/frac_capped"] == pytest.approx(expected_capped)


def test_weights_scale_the_policy_gradient(tmp_path, make_model, tokenizer, digit_dataset):
    """With every weight at the cap 2, the gradient is exactly twice the uncorrected one."""
    from conftest import digit_fraction
    from rloo import RLOOTrainer

    grads = []
    for correction in (False, True):
        torch.manual_seed(0)
        args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, beta=0.0,
                          max_completion_length=4, max_steps=1, save_steps=0, loss_agg_mode="token-mean",
                          vllm_importance_sampling_correction=correction)
        trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                              processing_class=tokenizer, sampler=ShiftedLogprobSampler(tokenizer, -1.0))
        rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
        trainer.learner.accumulate_gradients(rollout)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], 2 * grads[0])
