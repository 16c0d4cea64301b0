"""SIGTERM in the middle of the slow calls (issue #48): a tool call and a weight push to a vLLM server finish whole,
and the signal is kept for the loop, which stops at the end of the rollout's optimizer steps with a checkpoint
(run/run_dir.py StopSignals; benchmarks/runs/faults.py injects both into real runs: "SIGTERM during a tool call",
"SIGTERM during a vLLM weight push"). A half-run tool call or a half-loaded push is never what a run resumes from."""

import os
import signal
import threading
import time

import torch

from rloo.generation.vllm_client import HTTPEngine
from rloo.generation.vllm_server import WeightServer
from rloo.run.run_dir import StopSignals
from rloo.tools.execution import run_tool_calls
from rloo.tools.parsing import ToolCall


def test_sigterm_during_a_tool_call_lets_the_call_finish_and_asks_the_loop_to_stop():
    def slow_add(a: int, b: int) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread, which waits for this call
        time.sleep(0.3)
        return a + b

    with StopSignals() as signals:
        (results,) = run_tool_calls([[ToolCall("slow_add", {"a": 1, "b": 2})]], [{"slow_add": slow_add}], timeout=10)
    assert [(r.content, r.failed) for r in results] == [("3", False)]
    assert signals.received == "SIGTERM"


class SignallingEngine:
    """Sends this process SIGTERM in the middle of loading a push (the server runs on a thread of this process)."""

    def __init__(self):
        self.loads = []

    def load_weights(self, weights):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        self.loads.append(dict(weights))


def test_sigterm_during_a_weight_push_lets_the_push_finish_and_asks_the_loop_to_stop():
    server = WeightServer(("127.0.0.1", 0), SignallingEngine(), "m", "x")
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        client = HTTPEngine(f"http://127.0.0.1:{server.server_port}", timeout=10.0)
        with StopSignals() as signals:
            client.load_weights(iter([("w", torch.ones(3))]))
        assert len(server.engine.loads) == 1 and client.weights_version == server.weights_version
        assert signals.received == "SIGTERM"
    finally:
        server.shutdown()
        server.server_close()
