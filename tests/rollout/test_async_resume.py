"""Exact resume with async_rollouts (and LoRA): the checkpoint holds what the sampler was sampling the next rollout
with (the weights published for it, the optimizer step they are from, the sampler's random state), so 2 steps +
resume 2 give the weights and losses of 4 straight steps, bit for bit."""

import json

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer


def _config(output_dir, **overrides):
    values = dict(output_dir=str(output_dir), per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                  learning_rate=3e-2, beta=0.0, max_steps=4, logging_steps=1, save_steps=2, seed=0,
                  async_rollouts=True, report_to=[])
    return RLOOConfig(**{**values, **overrides})


def _trainer(output_dir, make_model, tokenizer, digit_dataset, lora):
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return RLOOTrainer(make_model(), digit_fraction, args=_config(output_dir), train_dataset=digit_dataset,
                       processing_class=tokenizer, peft_config=peft_config)


def _losses(output_dir):
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [(line["step"], line["loss"], line["async/staleness"]) for line in lines if "loss" in line]


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_async_rollouts_resume_exactly(tmp_path, make_model, tokenizer, digit_dataset, lora):
    straight = _trainer(tmp_path / "a", make_model, tokenizer, digit_dataset, lora)
    straight.train()  # 4 steps, checkpoint-2 on the way
    saved = torch.load(tmp_path / "a" / "checkpoint-2" / "async_sampler.pt", weights_only=True)
    assert saved["weights_step"] == 1  # rollout 2 (step 3) was being sampled from the weights of step 1
    if lora:  # LoRA: only the adapters (what the policy trains) are saved, not the base
        assert saved["weights"] and all("lora_" in name for name in saved["weights"])
    resumed = _trainer(tmp_path / "b", make_model, tokenizer, digit_dataset, lora)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.global_step == 4
    assert [step for step, _, _ in _losses(tmp_path / "a")] == [1, 2, 3, 4]
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")[2:]  # steps 3 and 4: loss and staleness
    for name, p in straight.model.named_parameters():
        assert torch.equal(p, resumed.model.get_parameter(name)), name
