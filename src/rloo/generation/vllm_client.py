"""The trainer's side of `rloo vllm-serve` (generation/vllm_server.py): generation and weight pushes over HTTP,
each call bounded by vllm_server_timeout.

Only the main process pushes weights (DDP keeps every process's copy identical); every process generates its
own prompts. Prompts with images go with their images as base64 PNG (lossless: the server's engine gets the
pixels the training passes see), each distinct prompt once; the server answers with the prompt ids its engine
ran, checked here against the processor's (`check_expanded`, as the colocated engine does). Weights travel as
safetensors chunks of about `chunk_bytes` (smaller where the server's --max_chunk_mb is), so no NCCL is needed
and a CPU machine can run both sides. A push that the server's bounds would refuse (a tensor over
--max_chunk_mb, a model over --max_pending_mb) is refused here before anything is sent. With RLOO_VLLM_TOKEN
in the environment, every request carries that token.

Every generation is checked to have run on the weights this client last pushed (issue #48): the server names its
weights version in each reply ("boot-..." for the weights it started with, else the id of its last complete push),
and a reply with another version ends the run (ServerError), since the server was restarted or another trainer
pushed to it. The run fails rather than re-pushing: this client does not hold the policy, and a server that
restarts mid-run is a fault its operator should see (resume from the last checkpoint against a live server).
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import urllib.error
import urllib.request
import uuid
from typing import Any, Iterator

import torch

from rloo.generation.vllm_images import check_expanded
from rloo.generation.vllm_server_guards import TOKEN_ENV

CHUNK_BYTES = 256 * 2**20
HEADER_BYTES = 64  # a safetensors file's own header bytes, beyond its tensors' entries
ENTRY_BYTES = 160  # a tensor's entry in that header, beyond its name (dtype, shape, offsets, JSON punctuation)


class ServerError(RuntimeError):
    """The vLLM server did not answer in time, could not be reached, or failed a request."""


def server_url(args: Any) -> str:
    """The server's base URL from the config (vllm_server_base_url, else host and port)."""
    if args.vllm_server_base_url:
        return args.vllm_server_base_url.rstrip("/")
    return f"http://{args.vllm_server_host}:{args.vllm_server_port}"


class HTTPEngine:
    """An `Engine` (generation/vllm.py) backed by an `rloo vllm-serve` server."""

    def __init__(self, url: str, timeout: float, is_main_process: bool = True, chunk_bytes: int = CHUNK_BYTES,
                 token: str | None = None) -> None:
        self.url, self.timeout, self.is_main_process, self.chunk_bytes = url, timeout, is_main_process, chunk_bytes
        self.token = token
        self._limits: dict | None = None  # the server's ServerLimits, from its /health
        self._lora: dict | None = None  # its LoRA options ({"max_lora_rank", "max_loras"}), None without --enable_lora
        self.lora_refusal = ""
        self.weights_version: str | None = None  # what the server last said it holds; None: not asked yet

    @classmethod
    def build(cls, args: Any) -> "HTTPEngine":
        is_main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        token = os.environ.get(TOKEN_ENV) or None  # not a config field: the config is written to disk and trackers
        engine = cls(server_url(args), args.vllm_server_timeout, is_main, token=token)
        health = engine.call("GET", "/health")  # fail now, naming the server, rather than at the first generation
        if token and not health.get("token_required"):
            raise ServerError(f"{TOKEN_ENV} is set, but the vLLM server at {engine.url} does not require a token, so "
                              f"any process that reaches it can replace its weights: start `rloo vllm-serve` with the "
                              f"same {TOKEN_ENV} in its environment, or unset {TOKEN_ENV} here.")
        engine._limits, engine._lora = health.get("limits", {}), health.get("lora")
        engine.weights_version = health.get("weights_version")
        return engine

    def serves_lora(self, rank: int) -> bool:
        """Whether the server takes adapters of rank `rank`; if not, `lora_refusal` says why."""
        lora = getattr(self, "_lora", None)
        if not lora:
            self.lora_refusal = (f"the vLLM server at {self.url} was started without --enable_lora (restart it with "
                                 f"`rloo vllm-serve ... --enable_lora --max_lora_rank R` to sync adapters alone)")
        elif rank > lora["max_lora_rank"]:
            self.lora_refusal = (f"the adapter's rank {rank} is over the server's --max_lora_rank "
                                 f"{lora['max_lora_rank']} at {self.url}")
        else:
            return True
        return False

    def load_adapter(self, version: int, tensors: dict[str, torch.Tensor], config_json: str) -> None:
        """Send adapter `version` (one safetensors body, its adapter_config.json in the metadata); main process only."""
        from safetensors.torch import save

        if self.is_main_process:
            body = save(tensors, metadata={"adapter_config": config_json})
            self.call("POST", f"/adapter?version={version}", body, "application/octet-stream")
        if torch.distributed.is_initialized():  # nobody generates before the adapter is there
            torch.distributed.barrier()

    def server_limits(self) -> dict:
        """The server's size limits (ServerLimits as a dict), asked once."""
        if self._limits is None:
            self._limits = self.call("GET", "/health").get("limits", {})
        return self._limits

    def call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json") -> dict:
        """One request; any failure or a wait beyond `timeout` seconds raises ServerError naming the server."""
        headers = {"Content-Type": content_type}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
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
        except urllib.error.URLError as error:
            if isinstance(error.reason, (TimeoutError, socket.timeout)):
                raise ServerError(self._timeout_message(method, path)) from error
            if isinstance(error.reason, ConnectionError) and not isinstance(error.reason, ConnectionRefusedError):
                raise ServerError(self._dropped_message(method, path, error.reason)) from None
            raise ServerError(f"cannot reach the vLLM server at {self.url} ({error.reason}); start it with "
                              f"`rloo vllm-serve --model MODEL --port PORT` and set vllm_server_base_url (or "
                              f"vllm_server_host / vllm_server_port).") from None
        except (TimeoutError, socket.timeout) as error:
            raise ServerError(self._timeout_message(method, path)) from error
        except ConnectionError as error:
            raise ServerError(self._dropped_message(method, path, error)) from None

    def _timeout_message(self, method: str, path: str) -> str:
        return (f"the vLLM server at {self.url} did not answer {method} {path} within vllm_server_timeout={self.timeout} s; "
                f"check that it is alive (`rloo vllm-serve`), or raise vllm_server_timeout for a slow engine.")

    def _dropped_message(self, method: str, path: str, error: BaseException) -> str:
        return (f"the vLLM server at {self.url} closed the connection during {method} {path} ({error}); it drops "
                f"requests over its size limits and clients that stall (its log names which), or it stopped.")

    def generate(self, prompts, n, params, adapter: int | None = None):
        request = {"prompts": prompts, "n": n, "params": params, **({} if adapter is None else {"adapter": adapter})}
        grouped = self._generate(request)["completions"]
        return [[(ids, logps) for ids, logps in group] for group in grouped]

    def generate_with_images(self, prompts, images, expanded, n, params, adapter: int | None = None):
        reply = self._generate({"prompts": prompts, "images": [[png_base64(image) for image in each] for each in images],
                                "n": n, "params": params, **({} if adapter is None else {"adapter": adapter})})
        check_expanded(reply["prompt_ids"], expanded)
        return [[(ids, logps) for ids, logps in group] for group in reply["completions"]]

    def _generate(self, request: dict) -> dict:
        """POST /generate, refused here (nothing sent) when the body is over the server's --max_request_mb (known from
        its /health once `build` or a weight push asked)."""
        body = json.dumps(request).encode()  # logit_bias's -inf goes as -Infinity, which the server's json reads
        limit = (self._limits or {}).get("request_bytes")
        if limit is not None and len(body) > limit:
            raise ServerError(f"a /generate request of {len(body) / 2**20:.1f} MiB ({len(request['prompts'])} prompts"
                              f"{', with their images' if 'images' in request else ''}) is over the largest the vLLM "
                              f"server at {self.url} takes ({limit / 2**20:.1f} MiB): restart `rloo vllm-serve` with a "
                              f"larger --max_request_mb, or lower per_device_train_batch_size.")
        reply = self.call("POST", "/generate", body)
        self.check_version(reply.get("weights_version"))
        return reply

    def check_version(self, served: str | None) -> None:
        """Raise ServerError unless the server generated with the weights this client last saw it hold."""
        if self.weights_version is None or served == self.weights_version:
            return
        expected = ("the weights it was started with" if self.weights_version.startswith("boot-")
                    else "the trainer's last weight push")
        raise ServerError(f"the vLLM server at {self.url} generated with weights version {served!r}, not "
                          f"{self.weights_version!r} ({expected}): it was restarted or another trainer pushed to it, "
                          f"so its samples are not the policy's. The run stops: resume it from its last checkpoint "
                          f"(--resume_from_checkpoint latest) against a server only this run uses.")

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.is_main_process:
            weights = list(weights)
            limits = self.server_limits()
            chunk_limit = min(self.chunk_bytes, limits.get("chunk_bytes", self.chunk_bytes) - HEADER_BYTES)
            sizes = [_entry_bytes(name, tensor) for name, tensor in weights]
            groups = plan_chunks(sizes, chunk_limit)
            self._check_push(weights, sizes, len(groups), limits)
            push = uuid.uuid4().hex
            for index, group in enumerate(groups):
                chunk = _encode([weights[i] for i in group])
                final = int(index == len(groups) - 1)
                reply = self.call("POST", f"/weights?push={push}&index={index}&final={final}", chunk,
                                  "application/octet-stream")
            self.weights_version = reply.get("weights_version")
        if torch.distributed.is_initialized():  # nobody generates before the push is done; all expect its version
            version = [self.weights_version]
            torch.distributed.broadcast_object_list(version, src=0)
            self.weights_version = version[0]

    def _check_push(self, weights: list, sizes: list[int], chunks: int, limits: dict) -> None:
        """Refuse, before sending anything, a push the server's bounds would refuse half-way."""
        mib = 2**20
        if "chunk_bytes" in limits:
            largest = max(range(len(sizes)), key=sizes.__getitem__, default=None)
            if largest is not None and sizes[largest] + HEADER_BYTES > limits["chunk_bytes"]:
                raise ServerError(f"the tensor {weights[largest][0]} takes {sizes[largest] / mib:.1f} MiB, over the "
                                  f"largest chunk the vLLM server at {self.url} takes ({limits['chunk_bytes'] / mib:.1f} "
                                  f"MiB): restart `rloo vllm-serve` with a larger --max_chunk_mb.")
        total = sum(sizes) + chunks * HEADER_BYTES
        if "pending_chunks" in limits and (chunks > limits["pending_chunks"] or total > limits["pending_bytes"]):
            raise ServerError(f"a weight push of {chunks} chunks and {total / mib:.1f} MiB is over what the vLLM server at "
                              f"{self.url} holds ({limits['pending_chunks']} chunks, {limits['pending_bytes'] / mib:.1f} "
                              f"MiB): restart `rloo vllm-serve` with a larger --max_pending_chunks / --max_pending_mb.")

    def sleep(self):
        pass

    def wake_up(self):
        pass


def _entry_bytes(name: str, tensor: torch.Tensor) -> int:
    """A tensor's bytes in a safetensors file, its header entry included (an upper bound)."""
    return tensor.numel() * tensor.element_size() + len(name.encode()) + ENTRY_BYTES


def plan_chunks(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive indices of `sizes` grouped so that each group's total stays within `limit`; an item over
    `limit` goes alone. Always at least one group (an empty push sends one empty final chunk)."""
    groups: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if groups[-1] and total + size > limit:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += size
    return groups


def _encode(weights: list[tuple[str, torch.Tensor]]) -> bytes:
    """One safetensors chunk. Tensors are copied to CPU: safetensors refuses tensors that share memory (tied heads)."""
    from safetensors.torch import save

    return save({name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in weights})


def png_base64(image: Any) -> str:
    """A PIL image as base64 PNG text (lossless)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
