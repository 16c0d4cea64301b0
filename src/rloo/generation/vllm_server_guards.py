"""What one client can make `rloo vllm-serve` (generation/vllm_server.py) do, hold or wait for: the token's
environment variable, the server's limits, and the weight push it assembles, bounded in chunks and bytes.
No HTTP here (the server's request handler calls in), so the trainer's side imports it without the server."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

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
