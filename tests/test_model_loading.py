"""Models given by name load with model_init_kwargs; QLoRA plumbing; bf16 auto; checkpointing with LoRA."""

import pytest
import torch
import transformers

from rloo import RLOOConfig, builders, model_loading
from rloo.passes.logprobs import completion_logprobs
from rloo.rewards.scoring import build_reward_functions


def config(**overrides):
    return RLOOConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=2, **overrides)


@pytest.fixture
def saved_model(make_model, tokenizer, tmp_path):
    def save(dtype=torch.float32):
        path = tmp_path / str(dtype)
        make_model().to(dtype).save_pretrained(path)
        tokenizer.save_pretrained(path)
        return str(path)

    return save


def test_policy_loads_in_the_requested_dtype(saved_model):
    path = saved_model(torch.float32)
    assert next(builders.load_policy(path, None, config()).parameters()).dtype == torch.float32
    policy = builders.load_policy(path, None, config(model_init_kwargs={"dtype": "bfloat16"}))
    assert next(policy.parameters()).dtype == torch.bfloat16
    # "auto" (the default) keeps the checkpoint's dtype instead of model_loading it as fp32.
    assert next(builders.load_policy(saved_model(torch.bfloat16), None, config()).parameters()).dtype == torch.bfloat16


def test_init_kwargs_reach_from_pretrained(monkeypatch, make_model):
    seen = {}

    def fake_from_pretrained(name, **kwargs):
        seen.update(kwargs, name=name)
        return make_model()

    monkeypatch.setattr(builders.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    builders.load_policy("org/model", None, config(model_init_kwargs={"attn_implementation": "sdpa", "revision": "v2"}))
    assert seen == {"name": "org/model", "dtype": "auto", "trust_remote_code": False, "attn_implementation": "sdpa",
                    "revision": "v2"}


def test_bad_dtype_is_refused():
    with pytest.raises(ValueError, match="model_init_kwargs\\['dtype'\\]"):
        config(model_init_kwargs={"dtype": "bf16"})


def test_quantized_policy_is_prepared_for_qlora(monkeypatch, make_model):
    """bitsandbytes needs a GPU: the quantized load is faked, the plumbing around it is real."""
    import peft

    seen, prepared = {}, []

    def fake_from_pretrained(name, **kwargs):
        seen.update(kwargs)
        model = make_model()
        model.is_quantized = True
        return model

    monkeypatch.setattr(builders.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(peft, "prepare_model_for_kbit_training", lambda model, **kw: prepared.append(kw) or model)
    args = config(model_init_kwargs={"quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}},
                  gradient_checkpointing=True)
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    policy = builders.load_policy("org/model", lora, args)
    assert isinstance(seen["quantization_config"], transformers.BitsAndBytesConfig)
    assert seen["quantization_config"].load_in_4bit
    assert prepared == [{"use_gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}]
    assert builders.is_peft_model(policy)
    with pytest.raises(ValueError, match="peft_config"):
        builders.load_policy("org/model", None, args)

    # With shared_prefix_forward, peft must not turn on whole-layer checkpointing (it drops the KV cache the
    # completions run on): rloo checkpoints the layers itself.
    from rloo.model_loading import CheckpointedLayer

    prepared.clear()
    args = config(model_init_kwargs={"quantization_config": {"load_in_4bit": True}}, gradient_checkpointing=True,
                  shared_prefix_forward=True)
    policy = builders.load_policy("org/model", lora, args)
    assert prepared[0]["use_gradient_checkpointing"] is False
    assert any(isinstance(module, CheckpointedLayer) for module in policy.modules())


def test_reward_model_by_name_loads_with_init_kwargs(tmp_path, tokenizer):
    model = transformers.Qwen2ForSequenceClassification(transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, num_labels=1, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    kwargs = model_loading.model_init_kwargs(config(model_init_kwargs={"dtype": "bfloat16"}))
    [reward] = build_reward_functions([str(tmp_path)], tokenizer, "cpu", kwargs)
    reward_model = reward.func if hasattr(reward, "func") else reward
    dtypes = {p.dtype for m in [reward_model] for p in getattr(m, "model", m).parameters()}
    assert dtypes == {torch.bfloat16}


def test_bf16_is_auto_on_cuda_with_bf16_only(monkeypatch):
    args = config()
    assert args.bf16 is None and builders.use_bf16(args) is False  # this machine: CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert builders.use_bf16(args) is True and args.bf16 is None  # resolved, never written back
    assert builders.use_bf16(config(bf16=False)) is False
    assert builders.use_bf16(config(fp16=True)) is False


def test_gradient_checkpointing_with_lora_and_tiled_head(make_model):
    from peft import LoraConfig

    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 20, (2, 8), generator=gen)
    mask = torch.ones_like(input_ids)
    grads = []
    for checkpointing in (False, True):
        args = config(gradient_checkpointing=checkpointing)
        policy = builders.load_policy(make_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                             init_lora_weights=False), args).train()
        torch.manual_seed(1)  # the same LoRA init in both runs
        for name, param in policy.named_parameters():
            if "lora" in name:
                torch.nn.init.normal_(param, std=0.1)
        assert policy.is_gradient_checkpointing == checkpointing
        logps, _ = completion_logprobs(policy, input_ids, mask, 4, temperature=0.9)
        logps.sum().backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)


# --- tokenizers come back as they were saved ----------------------------------------------------------------------

TEXT_WITH_SPACES = "user: 12 + 34 =\nassistant: 46\n"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_saved_custom_tokenizer_loads_as_saved_beside_a_model_of_a_known_type(tokenizer, tmp_path, arch):
    """transformers 5's AutoTokenizer gives a folder holding a qwen2 model config Qwen2Tokenizer even when its
    tokenizer_config.json names the generic class, and that class rebuilt the toy's character-level tokenizer into
    one that drops spaces and newlines. Every place rloo loads a tokenizer by path reads it as it was saved."""
    from rloo.toy import build_tiny_model

    build_tiny_model(tokenizer, arch=arch, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=32).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    messages = [{"role": "user", "content": "12 + 34 ="}]
    loaders = {"model_loading.load_tokenizer": lambda: model_loading.load_tokenizer(str(tmp_path)),
               "builders.load_tokenizer": lambda: builders.load_tokenizer(None, str(tmp_path))}
    for where, load in loaders.items():
        loaded = load()
        assert loaded(TEXT_WITH_SPACES).input_ids == tokenizer(TEXT_WITH_SPACES).input_ids, where
        assert loaded.decode(loaded(TEXT_WITH_SPACES).input_ids) == TEXT_WITH_SPACES, where
        assert (loaded.apply_chat_template(messages, add_generation_prompt=True)
                == tokenizer.apply_chat_template(messages, add_generation_prompt=True)), where
        assert loaded.padding_side == "left" and loaded.pad_token_id == tokenizer.pad_token_id, where


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_a_real_tokenizer_saved_and_loaded_encodes_as_before(tmp_path, family):
    """Real vocabularies (llama.cpp's GGUF files), saved with save_pretrained beside a model of their family's
    type where there is one, come back encoding as the tokenizer that was saved; a folder naming a class of its
    own keeps the class AutoTokenizer gives it."""
    import json

    from rloo.assets.vocabularies import load_vocab_tokenizer, vocabularies_available

    if not vocabularies_available():
        pytest.skip("the llama.cpp vocabularies are not here")
    real = load_vocab_tokenizer(family)
    real.save_pretrained(tmp_path)
    if family == "qwen2":  # a fine-tuned model's folder: the tokenizer beside its model's config
        transformers.Qwen2Config(vocab_size=len(real), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1).save_pretrained(tmp_path)
    loaded = model_loading.load_tokenizer(str(tmp_path))
    text = TEXT_WITH_SPACES + "  indented\tand tabbed, ünïcödé"
    assert loaded(text).input_ids == real(text).input_ids
    assert loaded.decode(loaded(text).input_ids, skip_special_tokens=True) == real.decode(real(text).input_ids,
                                                                                         skip_special_tokens=True)
    declared = json.loads((tmp_path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    if declared not in model_loading.GENERIC_TOKENIZER_CLASSES:
        assert type(loaded) is type(transformers.AutoTokenizer.from_pretrained(tmp_path))
