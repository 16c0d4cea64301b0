"""LoRA adapters alone to vLLM's real engine (the CPU build), colocated: vllm_lora_sync="adapters".

After each optimizer step the engine gets the adapter tensors alone, as a new version, and its log-probs must equal
the training pass's within the merged push's tolerance (1e-4, test_vllm_engine.py); the base weights never go to it
after start-up. Break-tests: without the sync, with the previous version's tensors, and with rsLoRA's adapter
loaded at alpha / r, the gap grows past 1e-3. Run by scripts/test_vllm.sh.
"""

import os

import pytest
import torch

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from rloo import RLOOConfig  # noqa: E402
from rloo.generation import vllm_lora  # noqa: E402
from rloo.generation.vllm import VLLMSampler  # noqa: E402
from rloo.generation.vllm_lora import StaleAdapterError  # noqa: E402
from rloo.toy import build_char_tokenizer, build_tiny_model  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
PROMPTS = ["12+3=", "7*8="]
K = 4
TOLERANCE = 1e-4  # what the merged push meets (test_vllm_engine.py)


def tiny_model():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=256, max_position_embeddings=512, seed=0)
    return model, tokenizer


def lora_policy(folder, **options):
    from peft import LoraConfig, get_peft_model

    base, _ = tiny_model()
    base.config._name_or_path = str(folder)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                        init_lora_weights=False, **options)
    torch.manual_seed(1)
    return get_peft_model(base, config)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    args = RLOOConfig(output_dir=str(folder / "out"), sampler="vllm", max_completion_length=12, temperature=1.0,
                      vllm_lora_sync="adapters")
    sampler = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=12, args=args)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    policy = lora_policy(folder)
    base_pushes = []
    yield folder, policy, sampler, prompts, base_pushes
    sampler.close()


def count_base_pushes(sampler, log):
    """Record every call of the engine's load_weights (a base-weight push)."""
    engine = sampler.engine
    if getattr(engine, "_counted", False):
        return
    original = engine.load_weights

    def counted(weights):
        weights = list(weights)
        log.append(sum(t.numel() * t.element_size() for _, t in weights))
        return original(iter(weights))

    engine.load_weights, engine._counted = counted, True


@torch.no_grad()
def policy_logprobs(model, batch):
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits.float()
    width = batch.completion_ids.shape[1]
    logps = logits[:, -width - 1:-1].log_softmax(-1)
    return logps.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) * batch.completion_mask


def gap(model, batch):
    return (policy_logprobs(model, batch) - batch.logprobs).abs().max().item()


def optimizer_step(model, batch, lr=0.05):
    """One AdamW step on the adapters: raise the sampled completions' log-probs (large enough to move them)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    width = batch.completion_ids.shape[1]
    logps = logits[:, -width - 1:-1].log_softmax(-1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    (-(logps * batch.completion_mask).sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_adapters_alone_follow_two_optimizer_steps(setup):
    folder, policy, sampler, prompts, base_pushes = setup
    batch = sampler.sample(policy, prompts, K)
    count_base_pushes(sampler, base_pushes)
    assert sampler.lora_sync == "adapters"
    adapter_bytes = vllm_lora.tensor_bytes(vllm_lora.adapter_tensors(policy))
    base_bytes = sum(p.numel() * p.element_size() for n, p in policy.named_parameters() if "lora_" not in n)
    gaps = [gap(policy, batch)]
    for _ in range(2):
        before = sampler.synced_bytes
        optimizer_step(policy, batch)
        sampler.on_optimizer_step(policy)
        batch = sampler.sample(policy, prompts, K)
        gaps.append(gap(policy, batch))
        assert sampler.synced_bytes - before == adapter_bytes  # one adapter version per step, nothing else
    print(f"adapters alone: |engine - trainer| log-prob gap per version {gaps}; {adapter_bytes} bytes per sync "
          f"against {base_bytes} bytes of base weights; engine versions {sampler.engine.adapters.versions}")
    assert max(gaps) < TOLERANCE
    assert base_pushes == []  # the engine never saw a base weight after start-up
    assert sampler.synced_bytes == 3 * adapter_bytes
    assert batch.adapter_version == sampler._version == 3


def test_skipping_the_sync_leaves_the_engine_behind(setup):
    """Break-test: an optimizer step without on_optimizer_step: the engine samples with the old version."""
    folder, policy, sampler, prompts, _ = setup
    batch = sampler.sample(policy, prompts, K)
    optimizer_step(policy, batch)
    stale = sampler.sample(policy, prompts, K)  # no on_optimizer_step
    print(f"sync skipped: gap {gap(policy, stale):.2e}")
    assert gap(policy, stale) > 1e-3
    sampler.on_optimizer_step(policy)
    assert gap(policy, sampler.sample(policy, prompts, K)) < TOLERANCE


def test_sending_the_previous_version_is_caught(setup, monkeypatch):
    """Break-test: the push sends the tensors of the version before the step."""
    folder, policy, sampler, prompts, _ = setup
    batch = sampler.sample(policy, prompts, K)
    previous = vllm_lora.adapter_tensors(policy)
    optimizer_step(policy, batch)
    monkeypatch.setattr("rloo.generation.vllm_lora.adapter_tensors", lambda model: previous)
    sampler.on_optimizer_step(policy)
    wrong = sampler.sample(policy, prompts, K)
    print(f"previous version sent: gap {gap(policy, wrong):.2e}")
    assert gap(policy, wrong) > 1e-3
    monkeypatch.undo()
    sampler.on_optimizer_step(policy)
    assert gap(policy, sampler.sample(policy, prompts, K)) < TOLERANCE


def test_rslora_scaling_reaches_the_engine(setup, monkeypatch):
    """rsLoRA scales by alpha / sqrt(r) (16 / 2 = 8), plain LoRA by alpha / r (4): the engine must read use_rslora.
    Break-test: the adapter's config written without use_rslora widens the gap past 1e-3."""
    folder, _, sampler, prompts, _ = setup
    rslora = lora_policy(folder, use_rslora=True)
    sampler.on_optimizer_step(rslora)
    right = gap(rslora, sampler.sample(rslora, prompts, K))
    plain_config = vllm_lora.adapter_config_json

    def without_rslora(model):
        return plain_config(model).replace('"use_rslora": true', '"use_rslora": false')

    monkeypatch.setattr("rloo.generation.vllm_lora.adapter_config_json", without_rslora)
    sampler.on_optimizer_step(rslora)
    wrong = gap(rslora, sampler.sample(rslora, prompts, K))
    print(f"rsLoRA: gap {right:.2e} with alpha / sqrt(r), {wrong:.2e} when loaded with alpha / r")
    assert right < TOLERANCE
    assert wrong > 1e-3


def test_a_stale_adapter_version_is_refused(setup):
    """The engine holds the newest max_loras versions; sampling with an older one (or one never pushed) raises."""
    folder, policy, sampler, prompts, _ = setup
    sampler.on_optimizer_step(policy)
    sampler.sample(policy, prompts, 1)
    held = sampler.engine.adapters.versions
    assert held[-1] == sampler._version and len(held) <= 2
    params = dict(max_tokens=2, temperature=1.0)
    for version in (held[0] - 1, sampler._version + 1):
        with pytest.raises(StaleAdapterError, match=f"adapter version {version}"):
            sampler.engine.generate(prompts, 1, params, adapter=version)


ASYNC_LORA_SCRIPT = """
import json, sys
from datasets import Dataset
from peft import LoraConfig
from rloo import RLOOConfig, RLOOTrainer

def reward_digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

if __name__ == "__main__":
    folder, out, use_async, steps = sys.argv[1], sys.argv[2], sys.argv[3] == "async", int(sys.argv[4])
    data = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)])
    staleness = {"async_rollouts": True, "max_staleness": 2} if use_async else {}
    args = RLOOConfig(output_dir=out, use_vllm=True, **staleness, num_generations=4,
                      per_device_train_batch_size=8, max_completion_length=8, max_steps=steps, learning_rate=3e-2,
                      beta=0.0, logging_steps=1, save_steps=0, report_to=[], seed=0, eval_steps=2)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    trainer = RLOOTrainer(model=folder, reward_funcs=reward_digits, args=args, train_dataset=data,
                          eval_dataset=data.select(range(2)), peft_config=lora)
    trainer.train()
    sampler = trainer.sampler
    print("SYNC", json.dumps({"kind": sampler.last_sync["kind"], "versions": sampler._version,
                              "bytes": sampler.synced_bytes,
                              "tags": {str(k): v for k, v in sampler.version_tags.items()}}))
"""


def test_a_trl_lora_script_with_use_vllm_syncs_adapters_alone(setup, tmp_path):
    """TRL's script shape (use_vllm=True, peft_config): unchanged, it trains and every push is adapters alone."""
    from conftest import run_plain_python

    script = tmp_path / "train_lora.py"
    script.write_text(ASYNC_LORA_SCRIPT)
    result = run_plain_python(str(script), str(setup[0]), str(tmp_path / "out"), "sync", "2")  # 2 steps: CI's time
    assert result.returncode == 0, result.stderr[-4000:]
    import json

    sync = json.loads(result.stdout.split("SYNC ", 1)[1].splitlines()[0])
    print(f"TRL-style LoRA script: {sync}")
    assert sync["kind"] == "adapters" and sync["versions"] >= 2  # one version per optimizer step (and evaluation)
    assert sync["bytes"] < sync["versions"] * 100_000  # adapters (34,816 bytes each), never the base's 1.2 MB


def test_async_rollouts_sample_with_the_adapter_version_of_their_weights(setup, tmp_path):
    """async_rollouts with LoRA and adapters alone: the sampler thread's snapshot goes to the engine as its own
    adapter version (tagged with the optimizer step of its weights; evaluation's live policy is another version),
    every rollout's rows name that version (check_sampler_versions), and the engine's log-probs stay pi_old's."""
    from conftest import run_plain_python

    folder = setup[0]
    script = tmp_path / "train_async_lora.py"
    script.write_text(ASYNC_LORA_SCRIPT)
    result = run_plain_python(str(script), str(folder), str(tmp_path / "out"), "async", "4")
    assert result.returncode == 0, result.stderr[-4000:]
    import json

    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "sampler/max_abs_log_ratio" in line]
    gaps, staleness = [line["sampler/max_abs_log_ratio"] for line in steps], [line["async/staleness"] for line in steps]
    sync = json.loads(result.stdout.split("SYNC ", 1)[1].splitlines()[0])
    print(f"async LoRA: gaps {gaps}, staleness {staleness}, pushes {sync}")
    assert len(steps) == 4 and max(gaps) < TOLERANCE
    assert max(staleness) >= 1 and max(staleness) <= 2
    assert sync["kind"] == "adapters"
    assert None in sync["tags"].values() and 0 in sync["tags"].values()  # evaluation's version and the snapshot's
