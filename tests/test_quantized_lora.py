"""QLoRA on CPU: a 4-bit (and an 8-bit) base loaded by bitsandbytes' CPU backend (bitsandbytes >= 0.49; the
`quantization` extra), trained through LoRA adapters by a TRL-style script (`model_init_kwargs={"load_in_4bit":
True}`, TRL's spelling, or a quantization_config). The reference is the quantised base with the adapters disabled:
its log-probs equal those of the same checkpoint loaded 4-bit alone. Skipped where bitsandbytes is not installed,
except in CI (CI=true), whose dev extra installs it."""

import importlib.util
import os

import pytest
import torch
import transformers

if importlib.util.find_spec("bitsandbytes") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("CI must install bitsandbytes (the dev extra: pip install -c constraints.txt -e '.[dev]')",
                    pytrace=False)
    pytest.skip("the quantization extra (bitsandbytes) is not installed", allow_module_level=True)

from conftest import digit_fraction  # noqa: E402
from rloo import RLOOConfig, RLOOTrainer  # noqa: E402
from rloo.model_loading import keep_4bit_layers_trainable_on_cpu  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path, make_model, tokenizer):
    folder = tmp_path / "base"
    make_model(hidden_size=64, intermediate_size=128).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("init_kwargs, layer", [
    ({"load_in_4bit": True}, "Linear4bit"),
    ({"quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "float32"}},
     "Linear4bit"),
    ({"load_in_8bit": True}, "Linear8bitLt"),
])
def test_a_quantised_base_trains_through_adapters_on_cpu(tmp_path, checkpoint, digit_dataset, init_kwargs, layer):
    from peft import LoraConfig

    args = RLOOConfig(output_dir=str(tmp_path / "out"), model_init_kwargs={**init_kwargs, "dtype": "float32"},
                      num_generations=4, per_device_train_batch_size=8, max_completion_length=6, max_steps=2,
                      learning_rate=5e-2, beta=0.04, logging_steps=1, save_strategy="no", report_to="none", seed=0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = RLOOTrainer(model=checkpoint, reward_funcs=digit_fraction, args=args, train_dataset=digit_dataset,
                          peft_config=lora)
    policy = trainer.model
    assert type(policy.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == layer
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer.train()
    moved = {n for n, p in policy.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and all("lora_" in n for n in moved)  # the adapters trained, the quantised base did not
    # The reference (beta > 0): the policy with its adapters disabled (no second model), i.e. the quantised base.
    assert trainer.collector.reference is None
    quantised = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, quantization_config=trainer_quantization(init_kwargs), dtype=torch.float32)
    keep_4bit_layers_trainable_on_cpu(quantised)  # the same kernel as the trainer's layers
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    policy.eval()
    with policy.disable_adapter():
        reference = logits_of(policy, ids)
    assert torch.allclose(reference, logits_of(quantised, ids), atol=1e-5)
    assert (logits_of(policy, ids) - reference).abs().max() > 1e-3  # the adapters moved the policy away from it


def trainer_quantization(init_kwargs):
    from rloo.model_loading import model_init_kwargs

    return model_init_kwargs(RLOOConfig(output_dir="unused", model_init_kwargs=init_kwargs))["quantization_config"]


def test_both_spellings_at_once_are_refused():
    from rloo.config import ConfigError
    from rloo.model_loading import model_init_kwargs

    with pytest.raises(ConfigError, match="both"):
        model_init_kwargs(RLOOConfig(output_dir="unused", model_init_kwargs={
            "load_in_4bit": True, "quantization_config": {"load_in_8bit": True}}))
