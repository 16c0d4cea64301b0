"""`rloo vllm-serve`'s faults without vLLM (issue #48): its HTTP server over a stand-in engine on 127.0.0.1.
An engine that raises mid-generation or mid-load makes the server answer 500 naming the error, then 503 to
everything, and stop serving (`main` then exits 1); a server restarted between two steps (other weights) is
caught by the client's weights-version check at the next generation. The real engine's faults (killed, SIGSTOP,
"Encoder cache miss") are in tests/generation/test_vllm_server_faults.py (vLLM tier) and benchmarks/runs/faults.py.
"""

import threading

import pytest
import torch

from rloo.generation.vllm_client import HTTPEngine, ServerError
from rloo.generation.vllm_server import WeightServer

WAIT = 10.0  # every client waits at most this: a bound against hanging, never a speed threshold


class FailingEngine:
    """Generates (k + 1 tokens `7` for completion k) until `fail_on` ("generate" or "load") is set, then raises
    there as vLLM's engine does on a corrupt step."""

    def __init__(self):
        self.fail_on, self.generations = None, 0

    def generate(self, prompts, n, params):
        if self.fail_on == "generate":
            raise ValueError("Encoder cache miss for 3f2a (injected)")
        self.generations += 1
        return [[([7] * (k + 1), [-0.25] * (k + 1)) for k in range(n)] for _ in prompts]

    def load_weights(self, weights):
        list(weights)
        if self.fail_on == "load":
            raise RuntimeError("shape mismatch in layer 3 (injected)")


def start(port: int = 0) -> tuple[WeightServer, threading.Thread]:
    server = WeightServer(("127.0.0.1", port), FailingEngine(), "m", "x")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def served():
    servers = []

    def serve(port: int = 0):
        server, thread = start(port)
        servers.append(server)
        return server, thread, HTTPEngine(f"http://127.0.0.1:{server.server_port}", timeout=WAIT)

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("fail_on, during", [("generate", "a generation"), ("load", "the load of weight push")])
def test_an_engine_that_fails_makes_the_server_say_so_and_stop(served, fail_on, during):
    server, thread, client = served()
    client.generate([[1, 2]], 2, {})
    server.engine.fail_on = fail_on
    with pytest.raises(ServerError, match=f"engine of this server failed during {during}.*injected.*restart it, "
                                          f"then resume the run from its last checkpoint"):
        if fail_on == "generate":
            client.generate([[1, 2]], 2, {})
        else:
            client.load_weights(iter([("w", torch.ones(3))]))
    thread.join(WAIT)
    assert not thread.is_alive()  # serve_forever returned: `rloo vllm-serve` exits 1 (its main)
    assert server.failure is not None


def test_requests_after_the_engine_failed_are_answered_503(served):
    server, thread, client = served()
    server.failure = "the vLLM engine of this server failed during a generation (injected)"  # before shutdown ends it
    for method, path in (("GET", "/health"), ("POST", "/generate")):
        with pytest.raises(ServerError, match=f"failed {method} {path}: the vLLM engine of this server failed"):
            client.call(method, path, b'{"prompts": [[1]], "n": 1, "params": {}}' if method == "POST" else None)
    assert server.engine.generations == 0


def test_a_server_restarted_between_steps_is_caught_at_the_next_generation(served):
    server, _, client = served()
    client.weights_version = client.call("GET", "/health")["weights_version"]  # as HTTPEngine.build records it
    assert client.weights_version.startswith("boot-")
    client.generate([[1]], 1, {})
    client.load_weights(iter([("w", torch.ones(3))]))
    assert client.weights_version == server.weights_version and not client.weights_version.startswith("boot-")
    client.generate([[1]], 1, {})  # the pushed weights: accepted
    port = server.server_port
    server.shutdown()
    server.server_close()
    restarted, _, _ = served(port)  # the same address, --model's weights again
    with pytest.raises(ServerError, match=r"generated with weights version 'boot-\w+', not '\w+' \(the trainer's "
                                          r"last weight push\): it was restarted"):
        client.generate([[1]], 1, {})
    assert restarted.engine.generations == 1  # it did generate: the reply, not the request, is what is checked
