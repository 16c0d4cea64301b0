"""A rollout_func that samples (rollout/rollout_func.py): it generates through `trainer.vllm_generation`, TRL's
attribute, which rloo backs with the run's sampler on the current weights; the trainer corrects its log-probs as
another engine's (hand values); extra fields that are single values reach every trajectory."""

import math

import pytest
import torch
from datasets import Dataset
from tool_chat import tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy import build_tiny_model


def _dataset(n=2):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{a}+1?"}]} for a in range(n)])


def sampling_rollout_func(shifts=None, extra=None):
    """TRL's usual rollout_func: render the prompts, generate with trainer.vllm_generation, return TRL's keys (the
    log-probs taken from generate's (B, C, 1) lists). `shifts[i]` is subtracted from row i's log-probs."""
    calls = []

    def rollout_func(prompts, trainer):
        tokenizer = trainer.processing_class
        prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
                      for p in prompts]
        prompt_ids, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=prompt_ids, images=None, num_generations=trainer.num_generations)
        calls.append([[lp[0] for lp in row] for row in logprobs])
        rows = [[lp[0] - (shifts[i] if shifts else 0.0) for lp in row] for i, row in enumerate(logprobs)]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": rows, **(extra or {})}

    return rollout_func, calls


def _trainer(tmp_path, rollout_func, reward=None, **overrides):
    tokenizer = tool_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=8, learning_rate=5e-2, beta=0.0, max_steps=2, logging_steps=1, save_steps=0,
                  seed=0, overwrite_output_dir=True)
    reward = reward or (lambda completion_ids, **kw: [float(sum(ids) % 7) for ids in completion_ids])
    return RLOOTrainer(model=model, reward_funcs=[reward], args=RLOOConfig(**{**values, **overrides}),
                       train_dataset=_dataset(), processing_class=tokenizer, rollout_func=rollout_func)


def test_a_rollout_func_that_generates_trains_two_steps_on_the_current_weights(tmp_path):
    rollout_func, calls = sampling_rollout_func(extra={"source": "mine"})
    seen = []

    def reward(completion_ids, source, **kwargs):
        seen.append(source)
        return [float(sum(ids) % 7) for ids in completion_ids]  # spread within groups: something to learn

    trainer = _trainer(tmp_path, rollout_func, reward)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.global_step == 2 and len(calls) == 2
    assert seen == [["mine"] * 4] * 2  # a single value reaches every trajectory, as in TRL
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    # After training, generate samples with the trained weights: the trainer's own pass over the same tokens gives
    # the same log-probs, so every importance weight is 1 (the initial weights would give others).
    rollout, _ = trainer.collector.collect(trainer.train_dataset.to_list())
    mask = rollout.completion_mask.bool()
    assert torch.allclose(rollout.is_weights[mask], torch.ones(int(mask.sum())), atol=1e-4)


def test_the_importance_correction_of_a_rollout_func_s_log_probs_against_hand_values(tmp_path):
    """Row i's log-probs lowered by shift_i: pi_old / pi_s = exp(shift_i) at every token; token_truncate caps it at
    vllm_importance_sampling_cap = 2: exp(0.1) = 1.10517, exp(-1) = 0.36788, exp(1) = 2.718 -> 2, exp(0) = 1."""
    shifts = [0.1, -1.0, 1.0, 0.0]
    rollout_func, _ = sampling_rollout_func(shifts=shifts)
    trainer = _trainer(tmp_path, rollout_func)
    rollout, _ = trainer.collector.collect(trainer.train_dataset.to_list())
    expected = [math.exp(0.1), math.exp(-1.0), 2.0, 1.0]
    for row, weight in enumerate(expected):
        mask = rollout.completion_mask[row].bool()
        assert torch.allclose(rollout.is_weights[row][mask], torch.full((int(mask.sum()),), weight), atol=1e-4), row
    assert rollout.mismatch is not None


def test_extra_fields_of_the_wrong_length_and_bad_generate_calls_are_refused(tmp_path):
    rollout_func, _ = sampling_rollout_func(extra={"trace": ["a", "b", "c"]})
    trainer = _trainer(tmp_path, rollout_func)
    with pytest.raises(ValueError, match=r"3 values for the extra field 'trace' and 4 trajectories"):
        trainer.collector.collect(trainer.train_dataset.to_list())
    with pytest.raises(ValueError, match="each prompt num_generations times in a row"):
        trainer.vllm_generation.generate([[1, 2], [3, 4]], None, num_generations=2)
    with pytest.raises(ValueError, match="3 prompts for num_generations=2"):
        trainer.vllm_generation.generate([[1, 2]] * 3, None, num_generations=2)
