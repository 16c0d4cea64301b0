"""The vLLM sampler against fake engines that record what is called (vLLM does not install here).

The fakes stand in for `vllm` (LLM, SamplingParams) and TRL's `VLLMClient` at the import level,
so the sampler's real code paths run: sampling parameters, result parsing, weight pushes (LoRA
merged), sleep/wake order, and the engine's log-probs reaching the trainer.
"""

import importlib.machinery
import os
import sys
import threading
import types
from types import SimpleNamespace

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.config_checks import ConfigError
from rloo.generation.vllm import (
    VLLMSampler,
    check_vllm_version,
    engine_options,
    policy_weights,
)


def length_reward(completions, **kwargs):
    """Longer is better: the fake engine's completions differ in length, so advantages are not zero."""
    return [float(len(c)) for c in completions]


class FakeLLM:
    """Records calls; completion k of every prompt is `k + 1` copies of the token '1', then EOS
    (for k < 2), each token with log-prob -0.5 - 0.1 * k."""

    instances: list = []

    def __init__(self, eos_id, one_id, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], []
        self.eos_id, self.one_id = eos_id, one_id
        model = SimpleNamespace(load_weights=self._load)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))),
            engine_core=SimpleNamespace(shutdown=lambda: self.calls.append("shutdown")))
        FakeLLM.instances.append(self)

    def _load(self, weights):
        self.calls.append("load_weights")
        self.loaded.append({name: tensor.clone() for name, tensor in weights})

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append(("generate", len(prompts), sampling_params.kwargs))
        outputs = []
        for _ in prompts:
            completions = []
            for k in range(sampling_params.kwargs["n"]):
                ids = [self.one_id] * (k + 1) + ([self.eos_id] if k < 2 else [])
                logprobs = [{t: SimpleNamespace(logprob=-0.5 - 0.1 * k)} for t in ids]
                completions.append(SimpleNamespace(token_ids=ids, logprobs=logprobs))
            outputs.append(SimpleNamespace(outputs=completions))
        return outputs

    def sleep(self, level):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake_up")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


@pytest.fixture
def fake_vllm(monkeypatch, tokenizer):
    FakeLLM.instances.clear()
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.__version__ = "0.32.0"
    one_id = tokenizer("1", add_special_tokens=False)["input_ids"][0]
    module.LLM = lambda **kwargs: FakeLLM(tokenizer.eos_token_id, one_id, **kwargs)
    module.SamplingParams = lambda **kwargs: SimpleNamespace(kwargs=kwargs)
    platforms = types.ModuleType("vllm.platforms")  # the fake stands in for a GPU engine
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # the engine sets them:
        monkeypatch.setenv(name, "")  # recorded, so the teardown removes what the engine sets
        monkeypatch.delenv(name)
    return FakeLLM.instances


def _args(tmp_path, **overrides):
    defaults = dict(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, beta=0.0,
                    max_completion_length=6, max_steps=2, save_steps=0, logging_steps=1, sampler="vllm",
                    learning_rate=1e-2)
    return RLOOConfig(**{**defaults, **overrides})


def test_colocated_engine_sampling_params_parsing_and_logprobs(tmp_path, fake_vllm, make_model, tokenizer, digit_dataset):
    args = _args(tmp_path, vllm_gpu_memory_utilization=0.5, vllm_tensor_parallel_size=1, temperature=0.7, top_k=5)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert isinstance(trainer.sampler, VLLMSampler)
    rollout, samples = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    llm = fake_vllm[0]
    assert llm.kwargs["gpu_memory_utilization"] == 0.5 and llm.kwargs["tensor_parallel_size"] == 1
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs" and "max_model_len" not in llm.kwargs
    assert llm.kwargs["dtype"] == torch.float32  # the policy's
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"  # a plain `python` run is a world of one
    _, num_prompts, params = llm.calls[-1]
    assert num_prompts == 2
    assert params == dict(n=4, logprobs=0, temperature=0.7, top_p=1.0, top_k=5, min_p=0.0, max_tokens=6,
                          stop_token_ids=[tokenizer.eos_token_id])
    assert samples.completions[:4] == ["1", "11", "111", "1111"]
    assert rollout.has_eos.tolist() == [True, True, False, False] * 2  # EOS only where the engine gave one
    assert rollout.completion_mask.sum(1).tolist() == [2, 3, 3, 4] * 2
    # The engine's log-probs reached the rollout: the mismatch metric sees them.
    assert rollout.mismatch is not None and rollout.is_weights is not None


def test_weights_pushed_before_each_generation_after_a_step_with_sleep_between(tmp_path, fake_vllm, make_model,
                                                                                tokenizer, digit_dataset):
    args = _args(tmp_path, vllm_enable_sleep_mode=True)
    trainer = RLOOTrainer(make_model(), length_reward, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters(remove_duplicate=False)}
    end_training = trainer.accelerator.end_training
    trainer.accelerator.end_training = lambda: (fake_vllm[0].calls.append("end_training"), end_training())
    metrics = trainer.train()
    llm = fake_vllm[0]
    calls = [c if isinstance(c, str) else c[0] for c in llm.calls]
    # The engine is shut down before accelerate destroys the process group (else vLLM's exit-time teardown
    # of its own groups fails: "Invalid process group specified").
    assert calls == ["wake_up", "load_weights", "reset_prefix_cache", "generate", "sleep"] * 2 + ["shutdown",
                                                                                                   "end_training"]
    assert trainer.sampler.engine is None
    first, second = llm.loaded
    assert set(first) == {n for n, _ in trainer.model.named_parameters(remove_duplicate=False)}
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(first[name], before[name])  # the initial policy
    changed = [name for name in first if not torch.equal(first[name], second[name])]
    assert changed  # the second push carries the weights after step 1
    assert "sampler/mean_abs_log_ratio" in metrics


def _weights_sum(named) -> float:
    return sum(tensor.double().sum().item() for _, tensor in named)


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_async_rollouts_generate_from_the_sampling_weights_pushed_into_the_engine(
        tmp_path, fake_vllm, make_model, tokenizer, digit_dataset, max_staleness, monkeypatch):
    # async_rollouts with the vLLM sampler: the sampler thread computes pi_old on its snapshot, so the engine
    # must hold the snapshot's weights at every generation (pushed when the snapshot takes newer ones), also
    # after evaluation (every 2 steps) pushed the live policy's into the same engine.
    args = _args(tmp_path, async_rollouts=True, max_staleness=max_staleness, max_steps=4, eval_steps=2)
    trainer = RLOOTrainer(make_model(), length_reward, args=args, train_dataset=digit_dataset,
                          eval_dataset=digit_dataset.select(range(2)), processing_class=tokenizer)
    weights = [_weights_sum(policy_weights(trainer.model))]  # W0, then W_s after optimizer step s
    original_step = trainer.learner.step

    def step(mini_batch):
        stats = original_step(mini_batch)
        weights.append(_weights_sum(policy_weights(trainer.model)))
        return stats

    trainer.learner.step = step
    generations = []  # (engine's weights, the snapshot's or the live policy's weights) at each generate

    def generate(llm, prompts, sampling_params, use_tqdm):
        held = _weights_sum(llm.loaded[-1].items())
        running = trainer.rollouts.running  # async_rollouts' AsyncRollouts while train() runs
        sampler_thread = running is not None and threading.current_thread() is not threading.main_thread()
        source = running.snapshot if sampler_thread else trainer.model
        generations.append((sampler_thread, held, _weights_sum(policy_weights(source))))
        return original_generate(llm, prompts, sampling_params, use_tqdm)

    original_generate = FakeLLM.generate
    monkeypatch.setattr(FakeLLM, "generate", generate)
    trainer.train()
    assert len(fake_vllm) == 1  # one engine for the sampler thread and evaluation
    rollouts = [(held, source) for in_thread, held, source in generations if in_thread]
    evaluations = [(held, source) for in_thread, held, source in generations if not in_thread]
    assert len(rollouts) == 4 and len(evaluations) == 2
    for held, source in rollouts + evaluations:
        assert held == pytest.approx(source, rel=0, abs=1e-9)  # the engine held the weights pi_old is taken on
    if max_staleness == 1:  # rollout 0 from W0, rollout r >= 1 from W_{r-1}
        assert [held for held, _ in rollouts] == pytest.approx([weights[0], weights[0], weights[1], weights[2]],
                                                               rel=0, abs=1e-9)
    assert len({round(held, 6) for held, _ in rollouts}) >= 2  # the engine took newer weights


def test_a_forked_sampler_with_a_vllm_engine_is_refused(tmp_path, fake_vllm, make_model, tokenizer, digit_dataset):
    from rloo.rollout.async_rollouts import AsyncRollouts

    trainer = RLOOTrainer(make_model(), length_reward, args=_args(tmp_path, async_rollouts=True),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match="cannot be forked"):
        AsyncRollouts(trainer.collector, 60.0, worker="process")
    assert not fake_vllm  # refused before any engine was built


def test_the_learner_does_not_wait_for_a_generation_to_mark_the_engine_stale(make_model):
    # async_rollouts' thread holds the sampler's lock while the engine generates; the learner's
    # on_optimizer_step after every optimizer step must not queue behind it.
    live, snapshot = make_model(), make_model()
    engine = SimpleNamespace(load_weights=lambda weights: list(weights))
    sampler = VLLMSampler(0, [1], 4, engine=engine)
    sampler.push_weights(live)
    with sampler._lock:  # a generation in progress in another thread
        marker = threading.Thread(target=sampler.on_optimizer_step, args=(live,))
        marker.start()
        marker.join(timeout=30)
        assert not marker.is_alive()
    assert sampler._stale
    sampler.push_weights(snapshot)
    sampler.on_optimizer_step(live)  # the engine holds the snapshot's weights: nothing to redo for the live model
    assert not sampler._stale


def test_lora_is_merged_for_the_push_and_unmerged_after(make_model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_model(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))
    base_names = {n for n, _ in make_model().named_parameters(remove_duplicate=False)}
    engine = SimpleNamespace(loaded=None, load_weights=lambda w: setattr(engine, "loaded", {n: t.clone() for n, t in w}))
    sampler = VLLMSampler(0, [1], 4, engine=engine)
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    unmerged = q.base_layer.weight.detach().clone()
    merged = unmerged + q.lora_B["default"].weight @ q.lora_A["default"].weight * q.scaling["default"]
    sampler.push_weights(model)
    assert set(engine.loaded) == base_names  # base model names, no adapter matrices
    torch.testing.assert_close(engine.loaded["model.layers.0.self_attn.q_proj.weight"], merged)
    torch.testing.assert_close(q.base_layer.weight, unmerged)  # unmerged again for training
    assert list(policy_weights(make_model()))[0][0] == next(iter(make_model().state_dict()))


def test_colocate_without_vllm_is_a_config_error(monkeypatch):
    from rloo.config import ConfigError

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError, match=r"vllm>=0.32,<0.33.*pip install -e '\.\[vllm\]'"):
        RLOOConfig(sampler="vllm")


def test_max_model_length_reaches_the_engine(tmp_path, fake_vllm, make_model, tokenizer, digit_dataset):
    args = _args(tmp_path, vllm_max_model_length=128)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.collector.collect([digit_dataset[0]], trainer.global_step, trainer.episode)
    assert fake_vllm[0].kwargs["max_model_len"] == 128


@pytest.mark.parametrize("value", [0, -5, 1.5, "long"])
def test_max_model_length_must_be_a_positive_integer(value):
    with pytest.raises(ConfigError, match="vllm_max_model_length"):
        RLOOConfig(vllm_max_model_length=value)


@pytest.mark.parametrize("version,ok", [("0.32.0", True), ("0.32.4", True), ("0.31.1", False), ("0.33.0", False)])
def test_untested_vllm_versions_are_refused_by_name(version, ok, monkeypatch):
    monkeypatch.delenv("RLOO_ALLOW_UNTESTED_VLLM", raising=False)
    if ok:
        check_vllm_version(version)
        return
    with pytest.raises(ImportError, match=f"vLLM {version} is installed.*0.32.x.*RLOO_ALLOW_UNTESTED_VLLM=1"):
        check_vllm_version(version)
    monkeypatch.setenv("RLOO_ALLOW_UNTESTED_VLLM", "1")
    check_vllm_version(version)


def test_cpu_engine_refuses_sleep_mode_and_ignores_gpu_memory_with_a_warning():
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode=True needs vLLM on a GPU"):
        engine_options(RLOOConfig(vllm_enable_sleep_mode=True), torch.float32, on_cpu=True)
    with pytest.warns(UserWarning, match="vllm_gpu_memory_utilization=0.5 is ignored.*VLLM_CPU_KVCACHE_SPACE"):
        options = engine_options(RLOOConfig(vllm_gpu_memory_utilization=0.5), torch.bfloat16, on_cpu=True)
    assert "gpu_memory_utilization" not in options and options["dtype"] == torch.bfloat16
