"""What one client can make `rloo vllm-serve` (generation/vllm_server.py) do, hold or wait for: the token's
environment variable, the server's limits, the weight push it assembles, bounded in chunks and bytes, and the
/generate request, checked field by field, its images (PNG, base64) decoded within a bound on their pixels.
No HTTP here (the server's request handler calls in), so the trainer's side imports it without the server."""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

MB = 2**20
TOKEN_ENV = "RLOO_VLLM_TOKEN"  # the shared secret, in the server's and the trainer's environment


def half_the_memory() -> int:
    """Half this machine's physical memory in bytes (16 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


@dataclass(frozen=True)
class ServerLimits:
    """What one client can make the server hold or wait for. Sizes in bytes, times in seconds."""

    request_bytes: int = 64 * MB  # the body of a /generate request
    chunk_bytes: int = 2048 * MB  # the body of one /weights request (one safetensors chunk)
    pending_chunks: int = 4096  # chunks of the push being assembled
    pending_bytes: int = field(default_factory=half_the_memory)  # their bodies, together
    socket_timeout: float = 30.0  # a client silent this long mid-request is dropped
    connections: int = 64  # open connections; more are answered 503 and closed
    image_pixels: int = 128 * MB  # the images of one /generate request, together, decoded (RGB: 3 bytes a pixel)


class Refused(Exception):
    """A request the server answers with an error status; `message` names the limit or the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class PendingPush:
    """The chunks of the weight push being assembled, bounded in count and bytes.

    One push at a time: the first chunk (index 0) of another push drops an unfinished one (its sender died
    or gave up; that push's later chunks are then refused). A chunk is admitted from its size alone, before
    its body is read (`admit`), and counted from then on, so concurrent requests cannot overshoot the bound.
    A chunk over either bound is refused and its whole push dropped: loading part of a push would leave the
    engine with a mix of old and new weights, so the sender must resend it all.
    """

    def __init__(self, max_chunks: int, max_bytes: int) -> None:
        self.max_chunks, self.max_bytes = max_chunks, max_bytes
        self._lock = threading.Lock()
        self._reset(None)

    def _reset(self, push_id: str | None) -> None:
        self.push_id, self.chunks, self.bytes, self.next_index = push_id, {}, 0, 0

    def admit(self, push_id: str, index: int, size: int) -> str | None:
        """Count chunk `index` of `push_id` (`size` bytes) as pending, or raise Refused. Returns a line about
        an unfinished push this one dropped, if any."""
        with self._lock:
            dropped = None
            if index == 0:
                if self.push_id is not None and self.push_id != push_id:
                    dropped = (f"dropped the unfinished push {self.push_id} ({len(self.chunks)} chunks, "
                               f"{self.bytes} bytes pending): push {push_id} began")
                self._reset(push_id)
            elif push_id != self.push_id:
                raise Refused(409, f"push {push_id} is not being assembled (a newer push began, or it was dropped "
                                   f"over a bound); send the whole push again from index 0")
            if index != self.next_index:
                self._reset(None)
                raise Refused(409, f"chunk {index} of push {push_id} came out of order (expected {self.next_index}); "
                                   f"the push was dropped, send it again from index 0")
            if len(self.chunks) + 1 > self.max_chunks or self.bytes + size > self.max_bytes:
                count, held = len(self.chunks), self.bytes
                self._reset(None)
                raise Refused(413, f"push {push_id} would hold {count + 1} chunks and {held + size} bytes before its "
                                   f"final chunk, over this server's bound of {self.max_chunks} chunks "
                                   f"(--max_pending_chunks) and {self.max_bytes} bytes (--max_pending_mb); the push "
                                   f"was dropped. Restart the server with larger bounds for a model this size.")
            self.chunks[index] = None  # admitted; its tensors arrive with `add`
            self.bytes += size
            self.next_index += 1
            return dropped

    def add(self, push_id: str, index: int, tensors: list[tuple[str, torch.Tensor]], final: bool) -> list | None:
        """Store an admitted chunk's tensors; with `final`, take the whole push out (in chunk order)."""
        with self._lock:
            if push_id != self.push_id or index not in self.chunks:
                raise Refused(409, f"push {push_id} was dropped while chunk {index} was in transit (a newer push "
                                   f"began); send it again from index 0")
            self.chunks[index] = tensors
            if not final:
                return None
            if any(chunk is None for chunk in self.chunks.values()):
                self._reset(None)
                raise Refused(409, f"the final chunk of push {push_id} arrived before an earlier one; the push was "
                                   f"dropped, send it again from index 0")
            weights = [pair for i in sorted(self.chunks) for pair in self.chunks[i]]
            self._reset(None)
            return weights

    def drop(self, push_id: str) -> None:
        """Forget `push_id` (a chunk of it failed to arrive whole)."""
        with self._lock:
            if self.push_id == push_id:
                self._reset(None)


@dataclass
class GenerateRequest:
    """A /generate body, checked: `prompts` token ids, `n` completions each, vLLM `params`; with `images` (one list
    per prompt, each image a base64 PNG, not decoded yet: `decode_images`), the prompts are chat-template ids whose
    image placeholders the engine expands."""

    prompts: list[list[int]]
    n: int
    params: dict[str, Any]
    images: list[list[str]] | None = None
    adapter: int | None = None  # the LoRA adapter version to sample with (POST /adapter); None: the base weights

    @classmethod
    def parse(cls, body: bytes) -> "GenerateRequest":
        """The request, or Refused(400) naming the field that is wrong."""
        try:
            request = json.loads(body)
            prompts, n, params = request["prompts"], request["n"], request["params"]
        except (ValueError, KeyError, TypeError) as error:
            raise Refused(400, f"a /generate body must be JSON with prompts, n and params: {type(error).__name__}: {error}")
        if not isinstance(prompts, list) or not all(isinstance(p, list) and p and all(_is_id(t) for t in p)
                                                     for p in prompts):
            raise Refused(400, "prompts must be a list of non-empty lists of token ids (integers >= 0)")
        if not _is_id(n) or n < 1:
            raise Refused(400, f"n must be an integer >= 1, got {n!r}")
        if not isinstance(params, dict):
            raise Refused(400, f"params must be a JSON object of vLLM SamplingParams fields, got {type(params).__name__}")
        params = dict(params)
        if params.get("logit_bias") is not None:  # JSON object keys are strings; vLLM's SamplingParams wants token ids
            bias = params["logit_bias"]
            if not isinstance(bias, dict) or not all(k.isdigit() and _is_bias(v) for k, v in bias.items()):
                raise Refused(400, "params.logit_bias must map token ids to numbers (-Infinity allowed; not NaN or "
                                   "+Infinity)")
            params["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
        images = request.get("images")
        if images is not None:
            if not isinstance(images, list) or len(images) != len(prompts) or not all(
                    isinstance(each, list) and all(isinstance(image, str) for image in each) for each in images):
                raise Refused(400, f"images must be one list per prompt ({len(prompts)} lists) of base64 PNG strings")
        adapter = request.get("adapter")
        if adapter is not None and (not _is_id(adapter) or adapter < 1):
            raise Refused(400, f"adapter must be an adapter version (an integer >= 1), got {adapter!r}")
        return cls(prompts, n, params, images, adapter)


def parse_adapter(body: bytes, version: str) -> tuple[dict, str]:
    """A POST /adapter body: (its tensors, the adapter_config.json text in its safetensors metadata), or Refused(400)."""
    from safetensors.torch import load

    try:
        size = int.from_bytes(body[:8], "little")  # a safetensors file: 8 bytes of header length, the JSON header
        config = json.loads(body[8:8 + size])["__metadata__"]["adapter_config"]
        return load(body), config
    except Exception as error:
        raise Refused(400, f"adapter version {version} is not a safetensors file with adapter_config in its metadata: "
                           f"{type(error).__name__}: {error}") from None


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_bias(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) and value != math.inf


def decode_images(images: list[list[str]], max_pixels: int) -> list[list[Any]]:
    """The PIL (RGB) images of a /generate request, per prompt. Each must be a base64 PNG; their sizes, read from
    the headers before any pixel is decoded, must total at most `max_pixels` (--max_image_megapixels). Anything
    else is Refused(400, or 413 over the bound), naming the image."""
    from PIL import Image

    opened, total = [], 0
    for p, each in enumerate(images):
        for i, text in enumerate(each):
            where = f"image {i} of prompt {p}"
            try:
                data = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError) as error:
                raise Refused(400, f"{where} is not base64: {error}") from None
            try:
                image = Image.open(io.BytesIO(data), formats=["PNG"])
            except Exception as error:  # PIL raises several kinds for data that is not an image it reads
                raise Refused(400, f"{where} is not a PNG image: {type(error).__name__}: {error}") from None
            total += image.width * image.height
            if total > max_pixels:
                raise Refused(413, f"the images of this request have over {max_pixels} pixels together ({where} is "
                                   f"{image.width}x{image.height}), over this server's limit (--max_image_megapixels); "
                                   f"send fewer prompts per request or smaller images")
            opened.append((p, where, image))
    decoded: list[list[Any]] = [[] for _ in images]
    for p, where, image in opened:
        try:
            image.load()
            decoded[p].append(image.convert("RGB") if image.mode != "RGB" else image)
        except Exception as error:  # truncated or corrupt pixel data
            raise Refused(400, f"{where} is not a readable PNG image: {type(error).__name__}: {error}") from None
    return decoded
