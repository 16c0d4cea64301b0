"""Adapters alone to `rloo vllm-serve --enable_lora` (server mode, vllm_lora_sync="adapters"): after each of two
optimizer steps the server's engine samples with the newest adapter version, at the training pass's log-probs
within the merged push's tolerance; no base weight is sent; a version the server does not hold is refused (409).

Run by scripts/test_vllm.sh; skipped where vLLM is not installed, except with RLOO_REQUIRE_VLLM set (CI).
"""

import contextlib
import os
import subprocess
import sys
import time

import pytest

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from test_vllm_lora import PROMPTS, TOLERANCE, K, gap, lora_policy, optimizer_step, tiny_model  # noqa: E402

from conftest import free_port  # noqa: E402
from rloo import RLOOConfig  # noqa: E402
from rloo.generation import vllm_lora  # noqa: E402
from rloo.generation.vllm import VLLMSampler  # noqa: E402
from rloo.generation.vllm_client import HTTPEngine, ServerError  # noqa: E402


@contextlib.contextmanager
def serving(folder, *flags):
    """`rloo vllm-serve` of the model in `folder` with `flags`, on a free loopback port, until the block ends."""
    port = free_port()
    log = open(folder / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "rloo.cli", "vllm-serve", "--model", str(folder), "--port",
                                str(port), "--dtype", "float32", *flags], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            try:
                HTTPEngine(url, timeout=5).call("GET", "/health")
                break
            except ServerError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"rloo vllm-serve did not start: {(folder / 'server.log').read_text()[-3000:]}")
                time.sleep(2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_server_lora")
    model, tokenizer = tiny_model()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with serving(folder, "--enable_lora", "--max_lora_rank", "8", "--max_loras", "2") as url:
        yield folder, tokenizer, url


def test_server_takes_adapters_alone_after_each_step(lora_server):
    folder, tokenizer, url = lora_server
    args = RLOOConfig(output_dir=str(folder / "out"), sampler="vllm", vllm_mode="server", vllm_server_base_url=url,
                      max_completion_length=12, vllm_lora_sync="adapters")
    sampler = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=12, args=args)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    policy = lora_policy(folder)
    batch = sampler.sample(policy, prompts, K)
    assert sampler.lora_sync == "adapters"
    base_pushes = []
    sampler.engine.load_weights = lambda weights: base_pushes.append(weights)  # a base-weight push would land here
    gaps = [gap(policy, batch)]
    for _ in range(2):
        optimizer_step(policy, batch)
        sampler.on_optimizer_step(policy)
        batch = sampler.sample(policy, prompts, K)
        gaps.append(gap(policy, batch))
    adapter_bytes = vllm_lora.tensor_bytes(vllm_lora.adapter_tensors(policy))
    print(f"server, adapters alone: gaps {gaps}, {sampler.synced_bytes} bytes in 3 syncs")
    assert max(gaps) < TOLERANCE
    assert base_pushes == [] and sampler.synced_bytes == 3 * adapter_bytes
    with pytest.raises(ServerError, match="adapter version 1"):  # the server holds versions 2 and 3 (--max_loras 2)
        sampler.engine.generate(prompts, 1, {"max_tokens": 2}, adapter=1)
