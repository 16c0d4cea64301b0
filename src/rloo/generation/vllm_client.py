"""The trainer's side of `rloo vllm-serve` (generation/vllm_server.py): generation and weight pushes
over HTTP, each call bounded by vllm_server_timeout.

Only the main process pushes weights (DDP keeps every process's copy identical); every process
generates its own prompts. Weights travel as safetensors chunks of about `chunk_bytes`, so no NCCL
is needed and a CPU machine can run both sides.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any, Iterator

import torch

CHUNK_BYTES = 256 * 2**20


class ServerError(RuntimeError):
    """The vLLM server did not answer in time, could not be reached, or failed a request."""


def server_url(args: Any) -> str:
    """The server's base URL from the config (vllm_server_base_url, else host and port)."""
    if args.vllm_server_base_url:
        return args.vllm_server_base_url.rstrip("/")
    return f"http://{args.vllm_server_host}:{args.vllm_server_port}"


class HTTPEngine:
    """An `Engine` (generation/vllm.py) backed by an `rloo vllm-serve` server."""

    def __init__(self, url: str, timeout: float, is_main_process: bool = True, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.url, self.timeout, self.is_main_process, self.chunk_bytes = url, timeout, is_main_process, chunk_bytes

    @classmethod
    def build(cls, args: Any) -> "HTTPEngine":
        is_main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        engine = cls(server_url(args), args.vllm_server_timeout, is_main)
        engine.call("GET", "/health")  # fail now, naming the server, rather than at the first generation
        return engine

    def call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json") -> dict:
        """One request; any failure or a wait beyond `timeout` seconds raises ServerError naming the server."""
        request = urllib.request.Request(self.url + path, data=body, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            try:
                detail = json.loads(detail)["error"]
            except (ValueError, KeyError, TypeError):
                pass
            raise ServerError(f"the vLLM server at {self.url} failed {method} {path}: {detail}") from None
        except (TimeoutError, socket.timeout) as error:
            raise ServerError(f"the vLLM server at {self.url} did not answer {method} {path} within "
                              f"vllm_server_timeout={self.timeout} s; check that it is alive (`rloo vllm-serve`), "
                              f"or raise vllm_server_timeout for a slow engine.") from error
        except urllib.error.URLError as error:
            raise ServerError(f"cannot reach the vLLM server at {self.url} ({error.reason}); start it with "
                              f"`rloo vllm-serve --model MODEL --port PORT` and set vllm_server_base_url (or "
                              f"vllm_server_host / vllm_server_port).") from None

    def generate(self, prompts, n, params):
        body = json.dumps({"prompts": prompts, "n": n, "params": params}).encode()
        grouped = self.call("POST", "/generate", body)["completions"]
        return [[(ids, logps) for ids, logps in group] for group in grouped]

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.is_main_process:
            for chunk, final in _chunks(weights, self.chunk_bytes):
                self.call("POST", f"/weights?final={int(final)}", chunk, "application/octet-stream")
        if torch.distributed.is_initialized():  # nobody generates before the push is done
            torch.distributed.barrier()

    def sleep(self):
        pass

    def wake_up(self):
        pass


def _chunks(weights: Iterator[tuple[str, torch.Tensor]], limit: int) -> Iterator[tuple[bytes, bool]]:
    """safetensors-encoded groups of about `limit` bytes, the last flagged final (an empty push sends one
    empty final chunk). Tensors are copied to CPU: safetensors refuses tensors that share memory (tied heads)."""
    from safetensors.torch import save

    group: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        if group and size + tensor.numel() * tensor.element_size() > limit:
            yield save(group), False
            group, size = {}, 0
        group[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += tensor.numel() * tensor.element_size()
    yield save(group), True
