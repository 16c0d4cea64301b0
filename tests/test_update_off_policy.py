"""The importance-ratio level and off-policy sequence masking inside the learner's loss, by hand."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.update import Learner

LN = math.log


def _loss(tmp_path, advantage=1.0, sampler_logps=None, **options):
    args = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, epsilon=0.2,
                      max_completion_length=2, **options)
    learner = Learner(args, None, None, None, None)
    # One completion of two tokens: token ratios pi / pi_old = 2 and 0.5; their log-mean is 0 (GSPO ratio 1).
    logps = torch.tensor([[LN(0.5), LN(0.2)]], requires_grad=True)
    old = torch.tensor([[LN(0.25), LN(0.4)]])
    micro = SimpleNamespace(advantages=torch.tensor([advantage]), token_advantages=None, is_weights=None,
                            trained=torch.tensor([True]), sampler_logps=sampler_logps)
    out, numerators, units, masked = learner.policy_loss(logps, old, micro, torch.ones(1, 2))
    return numerators.item(), masked


def test_ratio_levels_by_hand(tmp_path):
    # Whole-completion ratio 2 * 0.5 = 1 (default): -A * 1 = -1.
    assert _loss(tmp_path)[0] == pytest.approx(-1.0)
    # Token ratios, A = 1 > 0: token 1 max(-2, -1.2) = -1.2, token 2 max(-0.5, -0.8) = -0.5; summed -1.7.
    assert _loss(tmp_path, importance_sampling_level="token")[0] == pytest.approx(-1.7)
    assert _loss(tmp_path, importance_sampling_level="token", loss_agg_mode="seq-mean-token-mean")[0] == \
        pytest.approx(-0.85)
    # GSPO: both tokens get the geometric-mean ratio 1, so no clip; token mean of -1, -1 = -1.
    assert _loss(tmp_path, importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean")[0] == \
        pytest.approx(-1.0)
    # The same two-token completion, A = -1: tokens max(2, 1.2) = 2 and max(0.5, 0.8) = 0.8; mean 1.4.
    assert _loss(tmp_path, advantage=-1.0, importance_sampling_level="token",
                 loss_agg_mode="seq-mean-token-mean")[0] == pytest.approx(1.4)


def test_off_policy_mask_in_the_loss(tmp_path):
    # Drift from the sampler: mean(log pi_s - log pi) = mean(ln(0.9/0.5), ln(0.9/0.2)) = 1.05 > 0.5.
    drifted = torch.tensor([[LN(0.9), LN(0.9)]])
    assert _loss(tmp_path, advantage=-1.0, sampler_logps=drifted, off_policy_mask_threshold=0.5) == (0.0, 1.0)
    # A positive advantage is kept, and so is a negative one within the band (pi_old as the sampler:
    # drift mean(ln(.25/.5), ln(.4/.2)) = 0).
    assert _loss(tmp_path, advantage=1.0, sampler_logps=drifted, off_policy_mask_threshold=0.5) == \
        pytest.approx((-1.0, 0.0))
    assert _loss(tmp_path, advantage=-1.0, off_policy_mask_threshold=0.5) == pytest.approx((1.0, 0.0))


def test_gspo_with_masking_trains_and_logs(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, learning_rate=3e-3, max_steps=4, logging_steps=1, save_steps=0,
                      num_iterations=2, importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean",
                      off_policy_mask_threshold=0.01)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(0.0 <= line["policy/off_policy_masked_frac"] <= 1.0 for line in lines)
    assert lines[0]["policy/off_policy_masked_frac"] == 0.0  # the first pass is on-policy
    assert all(math.isfinite(line["loss/policy_avg"]) for line in lines)


@pytest.mark.parametrize("mode,clip_min,expected", [
    ("token_truncate", None, [2.0, 2.0, 1.0]),  # ratios 2, 3 capped at 2; padding 1
    ("token_mask", None, [2.0, 0.0, 1.0]),
    ("sequence_truncate", None, [2.0, 2.0, 1.0]),  # sequence ratio 6, capped at 2
    ("sequence_mask", 0.5, [0.0, 0.0, 1.0]),  # 6 is outside [0.5, 2]
])
def test_engine_correction_modes_reach_the_rollout(tmp_path, mode, clip_min, expected):
    from rloo.rollout import RolloutCollector

    args = RLOOConfig(output_dir=str(tmp_path), vllm_importance_sampling_mode=mode,
                      vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_cap=2.0)
    collector = RolloutCollector(args, None, None, None, None, None, [], [])
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    sampled = SimpleNamespace(logprobs=torch.log(torch.tensor([[0.25, 0.3, 0.4]])),
                              completion_mask=torch.tensor([[1, 1, 0]]))
    rollout = SimpleNamespace(mismatch=None, is_weights=None)
    collector.correct_engine_mismatch(rollout, old, sampled)
    assert rollout.is_weights[0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("options", [dict(vllm_importance_sampling_mode="mask"),
                                     dict(vllm_importance_sampling_clip_min=1.5)])
def test_bad_engine_correction_settings_are_refused(tmp_path, options):
    from rloo.config import ConfigError

    with pytest.raises(ConfigError, match="vllm_importance_sampling"):
        RLOOConfig(output_dir=str(tmp_path), **options)


class TruncatedEngineSampler:
    """The fast sampler with top_k=3, reporting the log-probs of the truncated distribution it drew from
    (what vLLM returns with processed_logprobs): a stand-in for an engine that filters."""

    def __init__(self, tokenizer, top_k):
        from rloo.generation import FastSampler

        self.inner = FastSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=4, top_k=top_k)
        self.top_k = top_k

    def on_optimizer_step(self, model):
        pass

    @torch.no_grad()
    def sample(self, model, prompts, num_generations):
        from rloo.algo.off_policy import truncated_logprobs

        batch = self.inner.sample(model, prompts, num_generations)
        self.full = batch.logprobs.clone()  # the unfiltered log-probs the fast sampler reports
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
        length = batch.completion_ids.shape[1]
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        processed = truncated_logprobs(logits[:, -length - 1 : -1], batch.completion_ids, top_k=self.top_k)
        batch.logprobs = self.processed = processed * batch.completion_mask
        batch.logprobs_from_policy = False
        return batch


def test_a_filtering_engine_is_compared_on_its_own_support(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, beta=0.0,
                      max_completion_length=4, max_steps=1, save_steps=0, top_k=3)
    sampler = TruncatedEngineSampler(tokenizer, top_k=3)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer, sampler=sampler)
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    tokens = rollout.completion_mask.sum()
    # Same weights, so once both sides are on the kept set the ratio is 1 up to float error ...
    assert rollout.mismatch[0] / rollout.mismatch[1] < 1e-4
    assert rollout.is_weights[rollout.completion_mask.bool()].tolist() == pytest.approx([1.0] * int(tokens), abs=1e-4)
    # ... where the unfiltered pi_old would have been off by the kept mass at every token (log S < 0).
    mask = rollout.completion_mask.bool()
    log_kept_mass = (sampler.full - sampler.processed)[mask]  # log pi(y) - log(pi(y) / S) = log S
    assert (log_kept_mass < -0.01).all() and log_kept_mass.mean() < -0.1


class ShiftedEngineSampler(TruncatedEngineSampler):
    """The fast sampler reporting the policy's own log-probs + `shift` as an engine's."""

    def __init__(self, tokenizer, shift):
        super().__init__(tokenizer, top_k=0)
        self.shift = shift

    @torch.no_grad()
    def sample(self, model, prompts, num_generations):
        batch = super().sample(model, prompts, num_generations)
        batch.logprobs = (self.full + self.shift) * batch.completion_mask
        return batch


def test_engine_drift_masks_the_negative_samples(tmp_path, make_model, tokenizer, digit_dataset):
    # The engine's log-probs sit 1 nat above the policy's: a drift of 1 > delta 0.5 on every completion,
    # so exactly the completions with a negative advantage are masked.
    args = RLOOConfig(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8, beta=0.0,
                      max_completion_length=4, max_steps=1, save_steps=0, logging_steps=1, off_policy_mask_threshold=0.5,
                      vllm_importance_sampling_correction=False)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer, sampler=ShiftedEngineSampler(tokenizer, 1.0))
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    negative = float(((rollout.advantages < 0) & rollout.trained).sum()) / float(rollout.trained.sum())
    assert rollout.sampler_logps is not None and negative > 0
    stats = trainer.learner.step(rollout)
    assert stats["policy/off_policy_masked_frac"] == pytest.approx(negative)
