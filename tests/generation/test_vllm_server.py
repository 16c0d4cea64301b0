"""Server mode against vLLM's real engine: `rloo vllm-serve` (generation/vllm_server.py) started on
127.0.0.1 with a tiny Qwen2 and a token (RLOO_VLLM_TOKEN in both processes' environment), rloo's HTTP client
generating from it, pushing weights, and training.

Run by scripts/test_vllm.sh; skipped where vLLM is not installed, except with RLOO_REQUIRE_VLLM set (CI).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401  (CI: a missing vLLM is a failure, not a skip)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from test_vllm_engine import PROMPTS, K, max_logprob_gap, policy_logprobs, tiny_model  # noqa: E402

from conftest import digit_fraction, free_port  # noqa: E402
from rloo import RLOOConfig, RLOOTrainer  # noqa: E402
from rloo.generation.vllm import VLLMSampler, policy_weights  # noqa: E402
from rloo.generation.vllm_client import HTTPEngine, ServerError  # noqa: E402

TOKEN = "test-token-1234"
PROCESSES: dict[str, subprocess.Popen] = {}  # the server process of each URL `serving` yields


@contextlib.contextmanager
def serving(folder):
    """`rloo vllm-serve` of the model saved in `folder`, on a free port with TOKEN, until the block ends;
    RLOO_VLLM_TOKEN is set in this process meanwhile (the trainer's HTTPEngine.build reads it). Yields the URL."""
    port = free_port()
    log = open(folder / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "rloo.cli", "vllm-serve", "--model", str(folder),
                                "--port", str(port), "--dtype", "float32"], stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "RLOO_VLLM_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            HTTPEngine(url, timeout=5, token=TOKEN).call("GET", "/health")
            break
        except ServerError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"rloo vllm-serve did not start: {(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(2)
    previous = os.environ.get("RLOO_VLLM_TOKEN")
    os.environ["RLOO_VLLM_TOKEN"] = TOKEN
    PROCESSES[url] = process
    try:
        yield url
    finally:
        PROCESSES.pop(url, None)
        if previous is None:
            os.environ.pop("RLOO_VLLM_TOKEN")
        else:
            os.environ["RLOO_VLLM_TOKEN"] = previous
        process.terminate()
        process.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    model, tokenizer = tiny_model(seed=1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with serving(folder) as url:
        with pytest.raises(ServerError, match="requires a token"):  # the real server refuses a client without it
            HTTPEngine(url, timeout=5).call("GET", "/health")
        model.config._name_or_path = str(folder)
        yield model, tokenizer, url


def test_server_samples_with_the_policys_logprobs_and_takes_pushed_weights(server):
    model, tokenizer, url = server
    args = RLOOConfig(sampler="vllm", vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=120)
    sampler = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=12, args=args)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    batch = sampler.sample(model, prompts, K)
    gap = max_logprob_gap(model, batch)
    print(f"server: largest |engine - trainer| log-prob difference {gap:.2e}")
    assert gap < 1e-4
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.5)
    sampler.on_optimizer_step(model)
    after = sampler.sample(model, prompts, K)
    gap = max_logprob_gap(model, after)
    print(f"server, after a push over HTTP: largest difference {gap:.2e}")
    assert gap < 1e-4
    assert (policy_logprobs(model, batch) - batch.logprobs).abs().max() > 1e-2  # the old samples are stale


def test_training_against_a_local_server(server, tmp_path, digit_dataset):
    model, tokenizer, url = server
    args = RLOOConfig(output_dir=str(tmp_path), sampler="vllm", vllm_mode="server", vllm_server_base_url=url,
                      num_generations=4, per_device_train_batch_size=8, max_completion_length=8, max_steps=2,
                      beta=0.0, save_steps=0, logging_steps=1, vllm_server_timeout=120)
    trainer = RLOOTrainer(model.config._name_or_path, digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    metrics = trainer.train()
    assert "sampler/mean_abs_log_ratio" in metrics


def test_async_rollouts_against_a_local_server(server, tmp_path, digit_dataset):
    """async_rollouts with the server: the sampler thread pushes its snapshot over HTTP whenever it takes newer
    weights, so the server's log-probs are those of the sampling weights (pi_old) at every step."""
    model, tokenizer, url = server
    args = RLOOConfig(output_dir=str(tmp_path), sampler="vllm", vllm_mode="server", vllm_server_base_url=url,
                      num_generations=4, per_device_train_batch_size=8, max_completion_length=8, max_steps=4,
                      learning_rate=3e-3, beta=0.0, save_steps=0, logging_steps=1, vllm_server_timeout=120,
                      async_rollouts=True)
    trainer = RLOOTrainer(model.config._name_or_path, digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "sampler/max_abs_log_ratio" in line]
    gaps = [line["sampler/max_abs_log_ratio"] for line in steps]
    print(f"server, async: engine vs sampling-weights gap per step {gaps}")
    assert [line["async/staleness"] for line in steps] == [0, 1, 1, 1]
    assert max(gaps) < 1e-4


def test_generations_are_checked_against_the_pushed_weights_and_a_stopped_server_ends_at_the_deadline(server):
    """Issue #48, on the shared server: every /generate reply names the weights version the engine sampled with,
    which the client checks against its last push; a SIGSTOPped server (sockets open, nothing answers) ends the
    client at its own deadline, vllm_server_timeout. The costlier server faults (killed, the engine failing,
    restarted with other weights) are rows of benchmarks/runs/faults.py and tests/generation/test_vllm_server_faults.py
    (harness tier); tests/faults/test_server_engine_faults.py holds their guards without vLLM."""
    model, tokenizer, url = server
    client = HTTPEngine.build(SimpleNamespace(vllm_server_base_url=url, vllm_server_timeout=120.0))
    assert client.weights_version  # "boot-..." or the last push of an earlier test: what the server holds
    client.load_weights(policy_weights(model))
    pushed = client.weights_version
    assert pushed and not pushed.startswith("boot-")
    client.generate([[5, 6, 7]], 2, {"max_tokens": 3})
    client.weights_version = "another-push"  # as if the server had since been restarted or pushed to
    with pytest.raises(ServerError, match=f"generated with weights version '{pushed}', not 'another-push'"):
        client.generate([[5, 6, 7]], 2, {"max_tokens": 3})
    process = PROCESSES[url]
    process.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(ServerError, match=f"{url} did not answer GET /health within vllm_server_timeout=2.0 s"):
            HTTPEngine(url, timeout=2.0, token=TOKEN).call("GET", "/health")
        assert time.monotonic() - start < 30  # the client's deadline, not the server's
    finally:
        process.send_signal(signal.SIGCONT)
    assert HTTPEngine(url, timeout=60.0, token=TOKEN).call("GET", "/health")["weights_version"] == pushed
