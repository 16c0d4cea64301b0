"""`rloo vllm-serve` with one fault armed inside its real vLLM engine, for benchmarks/runs/faults.py and the vLLM
tier's tests/generation/test_vllm_server_faults.py (issue #48). Runs in the vLLM venv:

    python benchmarks/runs/fault_server.py [rloo vllm-serve flags...]    with RLOO_SERVER_FAULT=<point>:<n>:<action>

point: "generate" (the n-th /generate request: the fault fires at the engine's next model step, so mid-generation,
with requests in flight) or "push" (the n-th weight load, once its chunks have arrived: mid-push). action: "raise"
(the model step raises ValueError("Encoder cache miss ..."), as vLLM's does when its encoder cache is corrupt),
"KILL" or "STOP" (the signal sent to this server). Without RLOO_SERVER_FAULT it is plain `rloo vllm-serve`.
"""

import os
import signal
import sys


def _act(action: str) -> None:
    if action == "raise":
        raise ValueError("Encoder cache miss for mm_hash 5d41402abc4b (injected by fault_server.py)")
    sys.stderr.flush()
    os.kill(os.getpid(), getattr(signal, f"SIG{action}"))


def _arm(point: str, count: int, action: str) -> None:
    from rloo.generation import vllm_server

    build = vllm_server.build_engine

    def build_engine(*args, **kwargs):
        engine = build(*args, **kwargs)
        worker = engine.llm.llm_engine.model_executor.driver_worker
        runner = getattr(worker, "worker", worker).model_runner
        step, armed, calls = runner.execute_model, [False], [0]

        def execute_model(*a, **k):  # the engine's own model step: an error here leaves its requests in flight
            if armed[0]:
                armed[0] = False
                _act(action)
            return step(*a, **k)

        runner.execute_model = execute_model
        target = "generate" if point == "generate" else "load_weights"
        original = getattr(engine, target)

        def wrapped(*a, **k):
            calls[0] += 1
            if calls[0] == count:
                if point == "generate":
                    armed[0] = True
                else:
                    _act(action)
            return original(*a, **k)

        setattr(engine, target, wrapped)
        return engine

    vllm_server.build_engine = build_engine


if __name__ == "__main__":
    fault = os.environ.get("RLOO_SERVER_FAULT")
    if fault:
        point, count, action = fault.split(":")
        _arm(point, int(count), action)
    from rloo.generation.vllm_server import main

    main(sys.argv[1:])
