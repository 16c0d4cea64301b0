"""LoRA: the policy trains adapters, the reference is the same model with adapters disabled."""

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer

peft = pytest.importorskip("peft")


def test_lora_reference_is_the_base_model_with_adapters_disabled(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "lora"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, learning_rate=5e-2, beta=0.5, max_steps=3, logging_steps=1, save_steps=0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    base = make_model()
    base_weights = {n: p.detach().clone() for n, p in base.named_parameters()}
    trainer = RLOOTrainer(base, digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer, peft_config=config)
    assert trainer.reference is None  # no second copy of the weights
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)

    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    # LoRA B starts at zero: policy == reference, so the KL is exactly zero at first.
    # (to float32 precision: a sum of per-token log-prob differences, each computed in its own forward)
    torch.testing.assert_close(rollout.seq_kl, torch.zeros(8), atol=1e-5, rtol=0)
    trainer.train()
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    assert rollout.seq_kl.abs().max() > 1e-4  # adapters moved the policy away from the frozen base

    for name, param in trainer.model.named_parameters():  # the base weights never change
        if "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            torch.testing.assert_close(param, base_weights[key], rtol=0, atol=0)
    assert (tmp_path / "lora" / "adapter_model.safetensors").exists()
    assert (tmp_path / "lora" / "adapter_config.json").exists()
