"""What a client can make `rloo vllm-serve` do (generation/vllm_server.py), without vLLM: its HTTP layer serving a
stand-in engine on 127.0.0.1. The token, the size limits checked before a body is read, the socket timeout, /health
answering while another client stalls or a generation runs, the connection cap, and the bound on pending chunks.

Every socket here has a timeout (10 s unless said), so a broken server fails a test instead of hanging it."""

import json
import socket
import threading

import pytest
import torch
from safetensors.torch import save

from rloo import RLOOConfig
from rloo.generation.vllm_client import HTTPEngine, ServerError, plan_chunks
from rloo.generation.vllm_server import ServerLimits, WeightServer, check_exposure, main

WAIT = 10.0  # the longest any client socket here waits: a bound against hanging, never a speed threshold
TOKEN = "s3cret-token"


class RecordingEngine:
    """Completion k of each prompt: k + 1 tokens `7`; records weight loads. `gate`, when set, holds every
    generation until the test opens it; `busy` records the most calls ever inside the engine at once."""

    def __init__(self, gate: threading.Event | None = None):
        self.loads, self.prompts, self.gate = [], [], gate
        self.inside, self.busy, self.entered, self.loading = 0, 0, threading.Event(), threading.Event()
        self._count = threading.Lock()

    def generate(self, prompts, n, params):
        with self._count:
            self.inside += 1
            self.busy = max(self.busy, self.inside)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT)
        self.prompts.append((prompts, n, params))
        with self._count:
            self.inside -= 1
        return [[([7] * (k + 1), [-0.25] * (k + 1)) for k in range(n)] for _ in prompts]

    def load_weights(self, weights):
        with self._count:
            self.inside += 1
            self.busy = max(self.busy, self.inside)
        self.loading.set()
        self.loads.append({name: tensor.clone() for name, tensor in weights})
        with self._count:
            self.inside -= 1


@pytest.fixture
def serve():
    """serve(engine=None, token=None, **limits) -> (server, port); every server is shut down after the test."""
    servers = []

    def start(engine=None, token=None, **limits):
        server = WeightServer(("127.0.0.1", 0), engine or RecordingEngine(), "m", "x", token=token,
                              limits=ServerLimits(**{"pending_bytes": 2**30, **limits}))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server, server.server_port

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def exchange(port: int, data: bytes, timeout: float = WAIT) -> tuple[int, dict]:
    """Send `data` on a fresh connection, read until the server closes it: (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        reply = read_until_closed(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body or b"{}")


def read_until_closed(sock: socket.socket) -> bytes:
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


def post(path: str, body: bytes, token: str | None = None, length: int | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    size = len(body) if length is None else length
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {size}\r\n\r\n".encode() + body


def get_health(port: int, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET /health HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()


def chunk(**tensors) -> bytes:
    return save({name: t.contiguous() for name, t in tensors.items()})


# --- the token ---

def test_without_the_token_every_endpoint_is_refused_naming_the_variable(serve):
    server, port = serve(token=TOKEN)
    status, body = exchange(port, get_health(port))
    assert status == 401 and "RLOO_VLLM_TOKEN" in body["error"] and "--token" in body["error"]
    status, _ = exchange(port, post("/generate", b'{"prompts": [[1]], "n": 1, "params": {}}'))
    assert status == 401
    status, _ = exchange(port, post("/weights?push=a&index=0&final=1", chunk(w=torch.ones(2))))
    assert status == 401
    assert server.engine.prompts == [] and server.engine.loads == []
    with pytest.raises(ServerError, match="requires a token: set the environment variable RLOO_VLLM_TOKEN"):
        HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT).call("GET", "/health")


def test_a_wrong_token_is_refused_and_changes_nothing(serve):
    server, port = serve(token=TOKEN)
    for wrong in ("s3cret-tokem", "s3cret-token-and-more", "s3cret", "x"):
        status, body = exchange(port, post("/weights?push=a&index=0&final=1", chunk(w=torch.ones(2)), token=wrong))
        assert status == 403 and "wrong token" in body["error"] and "RLOO_VLLM_TOKEN" in body["error"]
        status, _ = exchange(port, post("/generate", b'{"prompts": [[1]], "n": 1, "params": {}}', token=wrong))
        assert status == 403
    assert server.engine.prompts == [] and server.engine.loads == []
    with pytest.raises(ServerError, match="wrong token"):
        HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT, token="nope").generate([[1]], 1, {})


def test_the_right_token_from_the_environment_generates_and_pushes(serve, monkeypatch):
    server, port = serve(token=TOKEN)
    monkeypatch.setenv("RLOO_VLLM_TOKEN", TOKEN)
    args = RLOOConfig(sampler="vllm", vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{port}",
                      vllm_server_timeout=WAIT)
    client = HTTPEngine.build(args)
    assert client.generate([[1, 2]], 2, {})[0][1] == ([7, 7], [-0.25, -0.25])
    client.load_weights(iter([("w", torch.arange(3.0))]))
    torch.testing.assert_close(server.engine.loads[0]["w"], torch.arange(3.0))


def test_a_client_with_a_token_refuses_a_server_that_requires_none(serve, monkeypatch):
    _, port = serve()
    monkeypatch.setenv("RLOO_VLLM_TOKEN", TOKEN)
    args = RLOOConfig(sampler="vllm", vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{port}",
                      vllm_server_timeout=WAIT)
    with pytest.raises(ServerError, match="RLOO_VLLM_TOKEN is set, but the vLLM server .* does not require a token"):
        HTTPEngine.build(args)


# --- sizes, refused from the header ---

def test_an_oversized_body_is_refused_from_its_content_length_without_being_read(serve):
    """Only the headers are sent, never the body: the 413 comes back anyway, so the server did not wait for it."""
    server, port = serve(request_bytes=1000, chunk_bytes=5000)
    status, body = exchange(port, post("/generate", b"", length=1001))
    assert status == 413 and "--max_request_mb" in body["error"]
    status, body = exchange(port, post("/weights?push=a&index=0&final=1", b"", length=5001))
    assert status == 413 and "--max_chunk_mb" in body["error"]
    status, body = exchange(port, post("/generate", b"", length=10**15))
    assert status == 413
    assert server.engine.prompts == [] and server.engine.loads == [] and server.pending.bytes == 0


def test_a_bad_or_missing_content_length_or_push_query_is_refused(serve):
    server, port = serve()
    assert exchange(port, b"POST /generate HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 411
    for length in ("-5", "+5", "5e3", "\u00b2".encode("latin-1").decode("latin-1")):
        status, body = exchange(port, f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode("latin-1"))
        assert status == 400 and "Content-Length must be" in body["error"]
    for query in ("push=&index=0&final=1", "push=a/b&index=0&final=1", "push=a&index=-1&final=1", "push=a&index=0&final=2"):
        status, body = exchange(port, post(f"/weights?{query}", chunk(w=torch.ones(2))))
        assert status == 400 and "needs ?push=ID&index=N&final=0|1" in body["error"]
    assert server.pending.push_id is None and server.engine.loads == []


def test_the_client_refuses_a_tensor_over_the_servers_chunk_limit_before_sending(serve):
    server, port = serve(chunk_bytes=2000)
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    with pytest.raises(ServerError, match=r"the tensor big .* restart `rloo vllm-serve` with a larger --max_chunk_mb"):
        client.load_weights(iter([("small", torch.ones(4)), ("big", torch.ones(1000))]))
    assert server.engine.loads == [] and server.pending.push_id is None  # nothing was sent
    client.load_weights(iter([(f"w{i}", torch.full((100,), float(i))) for i in range(12)]))  # 12 x 400 B: chunks of <= 2000
    assert sorted(server.engine.loads[0], key=lambda name: int(name[1:])) == [f"w{i}" for i in range(12)]
    torch.testing.assert_close(server.engine.loads[0]["w11"], torch.full((100,), 11.0))


# --- stalled clients, concurrent requests ---

def test_a_client_stalled_mid_body_does_not_block_health(serve):
    """A client announces 1 MB, sends 10 bytes and holds the connection. The server's socket timeout (30 s)
    outlasts the /health client's wait (10 s): a server that reads the stalled body before anything else fails."""
    server, port = serve(socket_timeout=30.0)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as stalled:
        stalled.sendall(post("/weights?push=a&index=0&final=1", b"0123456789", length=10**6))
        status, body = exchange(port, get_health(port))
        assert status == 200 and body["model"] == "m"
        assert HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT).generate([[1]], 1, {}) == [[([7], [-0.25])]]


def test_a_client_stalled_mid_body_is_dropped_after_the_socket_timeout(serve):
    server, port = serve(socket_timeout=0.5)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as stalled:
        stalled.sendall(post("/weights?push=a&index=0&final=1", b"0123456789", length=10**6))
        reply = read_until_closed(stalled)  # ends when the server drops it; a server without a timeout never does
    assert b" 408 " in reply.split(b"\r\n")[0] and b"--socket_timeout" in reply
    assert server.pending.push_id is None and server.pending.bytes == 0 and server.engine.loads == []


def test_health_answers_while_a_generation_runs_and_generations_take_turns(serve):
    gate = threading.Event()
    server, port = serve(engine=RecordingEngine(gate))
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    results = []
    threads = [threading.Thread(target=lambda: results.append(client.generate([[1]], 1, {}))) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        assert server.engine.entered.wait(WAIT)
        assert exchange(port, get_health(port))[0] == 200  # the generation still holds the engine
    finally:
        gate.set()
        for thread in threads:
            thread.join(WAIT)
    assert len(results) == 2 and server.engine.busy == 1  # both answered, never two inside the engine at once


def test_a_weight_load_waits_for_the_running_generation(serve):
    """A push's final chunk arrives while a generation holds the engine: the load starts only after it. The 1 s
    wait for the load can only hide a missing lock on a very slow machine; it never fails a correct server."""
    gate = threading.Event()
    server, port = serve(engine=RecordingEngine(gate))
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    generation = threading.Thread(target=client.generate, args=([[1]], 1, {}))
    push = threading.Thread(target=client.load_weights, args=(iter([("w", torch.ones(2))]),))
    generation.start()
    try:
        assert server.engine.entered.wait(WAIT)
        push.start()
        assert not server.engine.loading.wait(1.0)  # held behind the generation
    finally:
        gate.set()
        generation.join(WAIT)
        push.join(WAIT)
    assert len(server.engine.loads) == 1 and server.engine.busy == 1


def test_connections_over_the_cap_get_503_at_once(serve):
    _, port = serve(connections=1, socket_timeout=30.0)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as holder:
        holder.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")  # stalls, keeps its slot
        status, body = exchange(port, get_health(port))
        assert status == 503 and "--max_connections" in body["error"]


# --- pending chunks ---

def test_pending_chunks_over_the_count_bound_are_refused_and_the_push_dropped(serve):
    server, port = serve(pending_chunks=2)
    part = chunk(w=torch.ones(2))
    assert exchange(port, post("/weights?push=a&index=0&final=0", part))[0] == 200
    assert exchange(port, post("/weights?push=a&index=1&final=0", part))[0] == 200
    status, body = exchange(port, post("/weights?push=a&index=2&final=0", part))
    assert status == 413 and "--max_pending_chunks" in body["error"] and "dropped" in body["error"]
    assert server.pending.push_id is None and server.pending.bytes == 0
    status, body = exchange(port, post("/weights?push=a&index=3&final=1", part))
    assert status == 409 and "send the whole push again" in body["error"]
    assert server.engine.loads == []  # no part of the dropped push reached the engine


def test_pending_bytes_over_the_bound_are_refused_before_the_body_is_read(serve):
    part = chunk(w=torch.ones(100))
    server, port = serve(pending_bytes=len(part) + 10)
    assert exchange(port, post("/weights?push=a&index=0&final=0", part))[0] == 200
    status, body = exchange(port, post("/weights?push=a&index=1&final=0", b"", length=len(part)))  # no body sent
    assert status == 413 and "--max_pending_mb" in body["error"]
    assert server.pending.bytes == 0 and server.engine.loads == []


def test_a_new_push_drops_an_unfinished_one(serve):
    server, port = serve()
    assert exchange(port, post("/weights?push=old&index=0&final=0", chunk(w=torch.zeros(2))))[0] == 200
    assert exchange(port, post("/weights?push=new&index=0&final=0", chunk(a=torch.ones(2))))[0] == 200
    assert exchange(port, post("/weights?push=old&index=1&final=1", chunk(v=torch.zeros(2))))[0] == 409
    assert exchange(port, post("/weights?push=new&index=1&final=1", chunk(b=torch.ones(2))))[0] == 200
    assert [list(load) for load in server.engine.loads] == [["a", "b"]]
    assert server.pending.push_id is None and server.pending.bytes == 0


def test_the_client_refuses_a_push_over_the_pending_bounds_before_sending(serve):
    server, port = serve(chunk_bytes=2000, pending_chunks=3)
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    with pytest.raises(ServerError, match="over what the vLLM server .* --max_pending_chunks / --max_pending_mb"):
        client.load_weights(iter([(f"w{i}", torch.ones(400)) for i in range(4)]))  # 4 chunks of one 1600 B tensor
    assert server.engine.loads == [] and server.pending.push_id is None


def test_plan_chunks_keeps_order_and_the_limit():
    assert plan_chunks([], 10) == [[]]
    assert plan_chunks([4, 4, 4, 20, 1], 10) == [[0, 1], [2], [3], [4]]


# --- the command line ---

def test_a_non_loopback_address_without_a_token_is_refused_before_vllm_loads(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # reaching the vLLM import would say "needs vLLM" instead
    monkeypatch.delenv("RLOO_VLLM_TOKEN", raising=False)
    with pytest.raises(SystemExit, match="--host 0.0.0.0 is reachable from other machines.*RLOO_VLLM_TOKEN.*--allow_no_token"):
        main(["--model", "m", "--host", "0.0.0.0"])
    check_exposure("0.0.0.0", TOKEN, False)
    check_exposure("0.0.0.0", None, True)
    check_exposure("127.0.0.1", None, False)
    check_exposure("localhost", None, False)
    with pytest.raises(SystemExit, match="--max_chunk_mb must be > 0"):
        main(["--model", "m", "--max_chunk_mb", "0"])
