"""`rloo vllm-serve`'s faults against vLLM's real engine (issue #48), on one server (benchmarks/runs/fault_server.py,
its 3rd generation armed to fail inside the engine's model step as vLLM's "Encoder cache miss" does): the weights
version checked on every generation, SIGSTOP (sockets open, nothing answers: the client's deadline ends it), and
the engine failing while HTTP answers (the server answers 500 naming it and exits 1). The costlier faults (the
server killed mid-generation and mid-push, restarted between steps, each in a training run) are rows of
benchmarks/runs/faults.py.

A server of its own (about a minute to start on 2 cores): the `harness` tier, which scripts/test_vllm.sh leaves out
(`bash scripts/test_vllm.sh -m harness` runs it); CI's vLLM tier checks the version and SIGSTOP on the shared server
(test_vllm_server.py). Skipped where vLLM is not installed, except with RLOO_REQUIRE_VLLM set.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401  (CI: a missing vLLM is a failure, not a skip)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from test_vllm_engine import tiny_model  # noqa: E402

from conftest import free_port  # noqa: E402
from rloo.generation.vllm import policy_weights  # noqa: E402
from rloo.generation.vllm_client import HTTPEngine, ServerError  # noqa: E402

pytestmark = pytest.mark.harness
SERVER = Path(__file__).resolve().parents[2] / "benchmarks" / "runs" / "fault_server.py"
PARAMS = {"temperature": 1.0, "max_tokens": 4}


def test_a_stopped_server_and_a_failed_engine_end_with_a_clear_line(tmp_path):
    model, tokenizer = tiny_model(seed=2)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, str(SERVER), "--model", str(tmp_path), "--port", str(port),
                               "--dtype", "float32", "--max_model_length", "64"], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "RLOO_SERVER_FAULT": "generate:3:raise"})
    url, args = f"http://127.0.0.1:{port}", SimpleNamespace(vllm_server_base_url=f"http://127.0.0.1:{port}",
                                                            vllm_server_timeout=60.0)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                client = HTTPEngine.build(args)
                break
            except ServerError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the fault server did not start: {(tmp_path / 'server.log').read_text()[-3000:]}")
                time.sleep(1)
        assert client.weights_version.startswith("boot-")
        client.generate([[5, 6, 7]], 2, PARAMS)  # generation 1: the weights it started with
        client.load_weights(policy_weights(model))
        assert not client.weights_version.startswith("boot-")
        client.generate([[5, 6, 7]], 2, PARAMS)  # generation 2: the version of the push, checked

        server.send_signal(signal.SIGSTOP)  # sockets open, nothing answers
        stopped = HTTPEngine(url, timeout=2.0)
        start = time.monotonic()
        with pytest.raises(ServerError, match=f"{url} did not answer GET /health within vllm_server_timeout=2.0 s"):
            stopped.call("GET", "/health")
        assert time.monotonic() - start < 30  # the client's deadline, not the server's
        server.send_signal(signal.SIGCONT)

        with pytest.raises(ServerError, match=r"engine of this server failed during a generation \(ValueError: Encoder "
                                              r"cache miss .*restart it, then resume the run"):
            client.generate([[5, 6, 7]], 2, PARAMS)  # generation 3 fails inside the engine's model step
        assert server.wait(timeout=30) == 1  # it exits rather than serving with an engine in an unknown state
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGCONT)
            server.kill()
            server.wait()
        log.close()
