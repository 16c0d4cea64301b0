"""Which LoRA adapters go to vLLM alone and which fall back to the merged push (generation/vllm_lora.py), without
vLLM: the choice, its one logged line, the engine's max_lora_rank, and the atomic adapter folder."""

import json
import logging
import os
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rloo.generation.vllm_lora import (
    AdapterSlots,
    StaleAdapterError,
    adapter_config_json,
    adapter_tensors,
    choose_lora_sync,
    engine_lora_options,
    engine_max_lora_rank,
)
from rloo.toy import build_char_tokenizer, build_tiny_model

ARGS = SimpleNamespace(vllm_lora_sync="adapters", async_rollouts=False, max_staleness=1)


def policy(**options):
    base = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64)
    options = {"target_modules": ["q_proj", "v_proj"], **options}
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, **options))


def test_plain_lora_and_rslora_go_as_adapters(caplog):
    with caplog.at_level(logging.WARNING):
        assert choose_lora_sync(policy(), ARGS) == "adapters"
        assert choose_lora_sync(policy(use_rslora=True), ARGS) == "adapters"
    assert caplog.records == []
    assert choose_lora_sync(policy(), SimpleNamespace(vllm_lora_sync="merged")) == "merged"
    assert choose_lora_sync(build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=1, num_heads=2,
                                             num_kv_heads=1, intermediate_size=64), ARGS) is None


@pytest.mark.parametrize("options, reason", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": [], "target_parameters": ["mlp.down_proj.weight"]}, "lora_target_parameters"),
    ({"lora_bias": True}, "lora_bias"),
])
def test_adapters_vllm_does_not_serve_fall_back_to_merged_with_one_line(caplog, options, reason):
    with caplog.at_level(logging.WARNING):
        assert choose_lora_sync(policy(**options), ARGS) == "merged"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "falls back to the merged push" in lines[0] and reason in lines[0], lines


def test_engine_options_round_the_rank_up_and_hold_the_async_versions():
    assert [engine_max_lora_rank(r) for r in (1, 4, 8, 12, 64, 200)] == [1, 8, 8, 16, 64, 256]
    with pytest.raises(ValueError, match="merged"):
        engine_max_lora_rank(600)
    assert engine_lora_options(policy(), ARGS) == {"max_lora_rank": 8, "max_loras": 2}
    async_args = SimpleNamespace(vllm_lora_sync="adapters", async_rollouts=True, max_staleness=3)
    assert engine_lora_options(policy(), async_args)["max_loras"] == 5


def test_adapter_versions_are_written_whole_and_the_oldest_dropped(tmp_path):
    from safetensors.torch import load_file

    model = policy(use_rslora=True)
    tensors, config = adapter_tensors(model), adapter_config_json(model)
    assert all("lora_" in name and name.startswith("base_model.model.") for name in tensors)
    assert json.loads(config)["use_rslora"] is True and json.loads(config)["r"] == 4
    slots, registered, removed = AdapterSlots(str(tmp_path / "adapters"), keep=2), [], []
    for version in (1, 2, 3):
        slots.add(version, tensors, config, register=lambda v, path: registered.append((v, path)), remove=removed.append)
    assert slots.versions == [2, 3] and removed == [1] and [v for v, _ in registered] == [1, 2, 3]
    assert sorted(os.listdir(slots.root)) == ["v2", "v3"]  # no staging folder left, the dropped one deleted
    loaded = load_file(os.path.join(slots.root, "v3", "adapter_model.safetensors"))
    assert all(torch.equal(loaded[name], tensors[name]) for name in tensors)
    with pytest.raises(StaleAdapterError, match="version 1"):
        slots.check(1)
    slots.check(3)


def test_a_server_without_lora_or_with_a_smaller_rank_is_named():
    from rloo.generation.vllm_client import HTTPEngine

    engine = HTTPEngine("http://127.0.0.1:1", timeout=1)
    assert not engine.serves_lora(4) and "--enable_lora" in engine.lora_refusal
    engine._lora = {"max_lora_rank": 8, "max_loras": 2}
    assert engine.serves_lora(8)
    assert not engine.serves_lora(16) and "--max_lora_rank 8" in engine.lora_refusal


def test_a_rollout_sampled_by_another_adapter_version_than_its_weights_is_refused():
    """async_rollouts: every row's adapter version must be the one pushed from the weights pi_old was computed with."""
    from rloo.rollout.async_rollouts import check_sampler_versions

    rollout = SimpleNamespace(sampler_version=torch.tensor([3, 3, 3, 3]))
    check_sampler_versions(rollout, {2: None, 3: 4}, weights_step=4)
    with pytest.raises(StaleAdapterError, match="step 4"):
        check_sampler_versions(rollout, {3: 2}, weights_step=4)  # version 3 came from step 2's weights
    with pytest.raises(StaleAdapterError):
        check_sampler_versions(rollout, {3: None}, weights_step=4)  # version 3 is the live policy's (evaluation)
    check_sampler_versions(SimpleNamespace(sampler_version=None), {}, weights_step=4)


def test_a_quantised_base_is_never_pushed_merged():
    from rloo.config import ConfigError

    quantised = policy()
    quantised.get_base_model().is_loaded_in_4bit = True
    assert choose_lora_sync(quantised, ARGS) == "adapters"
    with pytest.raises(ConfigError, match="vllm_lora_sync='adapters'"):
        choose_lora_sync(quantised, SimpleNamespace(vllm_lora_sync="merged"))
    dora = policy(use_dora=True)
    dora.get_base_model().is_loaded_in_4bit = True
    with pytest.raises(ConfigError, match="DoRA"):
        choose_lora_sync(dora, ARGS)
