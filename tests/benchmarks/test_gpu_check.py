"""benchmarks/gpu/gpu_check.py: its dry run (--cpu-tiny) runs every section of the GPU check on CPU at tiny sizes, so
the script cannot rot between GPU leases; its checks can fail; its FLOP count by hand."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import gpu_check  # noqa: E402  (benchmarks/gpu/gpu_check.py)

CORRECTNESS = [f"{check}_{precision}" for precision in ("fp32", "bf16")
               for check in ("tiled_head", "lean_activations", "shared_prefix")] + ["sampler_same_draws",
                                                                                    "rloo_step_cuda_vs_cpu"]
SPEED = ["speed_rloo_512", "speed_trl_ours_512", "speed_trl_defaults_512", "speed_rloo_4096", "speed_rloo_lean_off_512",
         "speed_trl_cb_512", "speed_trl_liger_512"]


@pytest.fixture
def plan():
    return gpu_check.tiny_plan(argparse.Namespace(budget_s=None))


def test_dry_run_passes_every_check_and_times_every_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_check.py"), "--cpu-tiny", "--out",
                             str(tmp_path)], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = data["sections"]
    assert set(sections) == {"environment", "matmul_peak", "random_model", *CORRECTNESS, *SPEED}
    with_trl = importlib.util.find_spec("trl") is not None
    for name, entry in sections.items():
        missing = not with_trl or (name == "speed_trl_liger_512" and importlib.util.find_spec("liger_kernel") is None)
        expected = "skipped" if name.startswith("speed_trl") and missing else "ok"
        assert entry["status"] == expected, (name, entry.get("error"), entry.get("traceback"))
    assert all(sections[name]["passed"] for name in CORRECTNESS)
    assert sections["matmul_peak"]["tflops"] > 0
    assert all(item["met"] for item in sections["environment"]["declared_requirements"].values())

    plan = data["plan"]
    for name in SPEED:
        entry = sections[name]
        if entry["status"] == "skipped":
            continue
        long = name.endswith("4096")
        prompts = plan["long_prompts"] if long else plan["prompts"]
        assert entry["timed_steps"] == (plan["long_steps"] if long else plan["steps"])
        assert len(entry["steps"]) == entry["timed_steps"] + entry["warmup_steps"]
        for step in entry["steps"]:  # every step generated and trained its whole batch, and each phase was timed
            assert step["completions"] == prompts * plan["k"]
            assert 0 < step["generation"] + step["no_grad_passes"] + step["training_pass"] < step["seconds"]
            assert step["no_grad_passes"] > 0  # beta = 0.05 (both defaults): the reference pass
        assert entry["generation_tokens_per_s"] > 0 and entry["training_tokens_per_s"] > 0
        assert 0 < entry["training_mfu"] < 1
    assert sections["speed_rloo_4096"]["mean_completion_tokens"] > plan["completion_tokens"]
    assert sections["speed_rloo_512"]["settings"]["lean_activations"] is True
    assert sections["speed_rloo_lean_off_512"]["settings"]["lean_activations"] is False
    if with_trl:
        assert sections["speed_trl_defaults_512"]["settings"]["gradient_checkpointing"] is True
        assert sections["speed_trl_ours_512"]["settings"]["gradient_checkpointing"] is False
        assert sections["speed_trl_cb_512"]["settings"]["use_transformers_continuous_batching"] is True
        assert sections["speed_trl_cb_512"]["generation_s_per_step"] > 0  # generate_batch is timed as generation
    table = (tmp_path / "gpu_check.md").read_text()
    assert all(name in table for name in CORRECTNESS + SPEED) and "FAIL" not in table


def test_the_tiled_head_check_fails_on_a_wrong_head(plan, monkeypatch):
    """The check has teeth: a tiled head that divides by a slightly different temperature is caught."""
    from rloo.passes import logprobs as logprobs_module

    assert gpu_check.check_tiled_head(plan, "fp32")["passed"]
    original = logprobs_module.tiled_head_logprobs
    monkeypatch.setattr(logprobs_module, "tiled_head_logprobs",
                        lambda hidden, weight, bias, targets, temperature, *rest: original(
                            hidden, weight, bias, targets, temperature * 1.01, *rest))
    result = gpu_check.check_tiled_head(plan, "fp32")
    assert not result["passed"] and result["logp_rel_err"] > gpu_check.TOLERANCE["fp32"]


def test_the_sampler_check_fails_when_the_draws_come_from_another_distribution(plan, monkeypatch):
    from rloo.generation.fast import FastSampler

    original = FastSampler._next_token
    monkeypatch.setattr(FastSampler, "_next_token", lambda self, logits, *rest: original(self, logits * 1.5, *rest))
    result = gpu_check.check_sampler_draws(plan)
    assert not result["passed"]
    assert any(s["rows_identical"] < s["rows"] for s in result["settings"])


def test_forward_flops_by_hand():
    """One layer, H = 4, 2 heads of 2 (q width 4), 1 KV head (kv width 2), MLP 6, V = 10; 1 row of 2 prompt and
    3 completion tokens (T = 5). Decoder matrices: 4*4 + 2*4*2 + 4*4 + 3*4*6 = 120 weights; forward FLOPs:
    2*120*5 = 1200 decoder, 2*10*4*3 = 240 head, 4*4*(5*6/2) = 240 attention: 1680; training 3x: 5040."""
    config = dict(hidden_size=4, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=2,
                  intermediate_size=6, vocab_size=10)
    assert gpu_check.decoder_matrix_parameters(config) == 120
    assert gpu_check.forward_flops(config, 1, 2, 3) == 1680
    assert gpu_check.training_flops(config, 2, 2, 3) == 2 * 5040


def test_qwen3_0_6b_config_has_the_published_size():
    """The speed runs' model is Qwen3-0.6B's shape: 0.6B parameters with the tied head, 0.44B in the decoder."""
    import transformers

    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**gpu_check.QWEN3_0_6B))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert round(sum(p.numel() for p in model.parameters()) / 1e6) == 596
    assert round(gpu_check.decoder_matrix_parameters(gpu_check.QWEN3_0_6B) / 1e6) == 440


def test_a_section_still_running_when_the_budget_ends_is_stopped_and_reported(tmp_path, monkeypatch):
    """The budget's alarm ends a section mid-step (here a sampler that would sleep for two minutes): the section is
    recorded as stopped with what it had measured, the table is written, and nothing after it starts."""
    import signal
    import time

    from rloo.generation.fast import FastSampler

    def stuck(self, *args, **kwargs):
        time.sleep(120)
        raise AssertionError("the budget's alarm did not interrupt the section")

    monkeypatch.setattr(FastSampler, "sample", stuck)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGALRM, signal.SIGTERM)}
    try:
        data = gpu_check.main(["--cpu-tiny", "--out", str(tmp_path), "--budget-s", "20",
                               "--sections", "environment,speed_rloo_512,speed_rloo_4096"])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    sections = data["sections"]
    stopped = sections["speed_rloo_512"]
    assert stopped["status"] == "stopped", stopped
    assert "time budget" in stopped["reason"] and stopped["steps"] == []
    assert stopped["unfinished_step_phase_seconds"]["generation"] > 0  # the sampler's time so far was kept
    assert sections["speed_rloo_4096"]["status"] == "skipped"
    assert json.loads((tmp_path / "gpu_check.json").read_text())["sections"]["speed_rloo_512"]["status"] == "stopped"
    table = (tmp_path / "gpu_check.md").read_text()
    assert "stopped: speed_rloo_512" in table and "the unfinished step had run" in table


def test_the_16384_token_section_runs_only_when_named(tmp_path):
    """speed_rloo_16384 (issue #46: long reasoning on one GPU) at its tiny sizes: 1 prompt x K, no warm-up."""
    data = gpu_check.main(["--cpu-tiny", "--out", str(tmp_path), "--sections", "environment,speed_rloo_16384"])
    entry = data["sections"]["speed_rloo_16384"]
    assert entry["status"] == "ok", entry.get("traceback")
    assert entry["prompts"] == data["plan"]["xl_prompts"] and entry["max_completion_tokens"] == 32
    assert entry["timed_steps"] == 1 and entry["warmup_steps"] == 0
