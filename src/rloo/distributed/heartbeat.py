"""Which process of a distributed run stopped making progress (issue #48).

When one process dies or stalls, the others wait in their next collective until ddp_timeout and then fail, and
the launcher reports the first process that failed: a survivor, not the culprit (torchrun blames rank 0 for rank
1's stall). So each process writes a heartbeat to the process group's key-value store (the one torchrun or
accelerate already runs, which outlives the workers) at each point of the loop: a count and a label ("rollout 2"
once it is collected, "after optimizer step 3"). When a collective fails, `blame` reads every process's heartbeat:
the processes whose count is behind the others' are the ones that stopped, named with their last point and how long
ago it was. A heartbeat costs one small store write per point, one per rollout and one per optimizer step.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from typing import Any, Iterator

import torch

KEY = "rloo/heartbeat/{rank}"
MARKERS = ("gloo", "nccl", "timed out", "connection reset", "connection closed", "broken pipe")


class RankFailure(RuntimeError):
    """A collective failed, and the heartbeats name the process(es) that stopped making progress."""


class Heartbeat:
    """This process's heartbeat (`beat`) and every process's, read back (`blame`). In a world of one: nothing.
    As a context manager around the loop, it turns a collective's failure into RankFailure."""

    def __init__(self, rank: int = 0, world_size: int = 1, store: Any = None, timeout: float = 300.0) -> None:
        self.rank, self.world_size, self.store, self.timeout = rank, world_size, store, timeout
        self.count = 0

    def __enter__(self) -> "Heartbeat":
        return self

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
        """A collective's failure leaves as RankFailure naming the process(es) that stopped (`blame`)."""
        blame = self.blame(error) if isinstance(error, RuntimeError) else None
        if blame is not None:
            raise RankFailure(blame) from error

    @classmethod
    def for_process_group(cls, timeout: float) -> "Heartbeat":
        """The heartbeat of this process in the default process group (none outside a distributed run)."""
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return cls()
        try:
            store = dist.distributed_c10d._get_default_store()  # torch keeps no public accessor for it
        except Exception:  # another backend's group without a store: no heartbeats, the plain error stays
            return cls()
        return cls(dist.get_rank(), dist.get_world_size(), store, timeout)

    def beat(self, where: str) -> None:
        """Record that this process reached `where` (a label of the loop's point), now."""
        if self.store is None:
            return
        self.count += 1
        self.store.set(KEY.format(rank=self.rank), json.dumps([self.count, where, time.time()]))

    @contextlib.contextmanager
    def after(self, where: str) -> Iterator[None]:
        """Beat `where` once the block has run (not if it raised)."""
        yield
        self.beat(where)

    def read(self) -> dict[int, list | None]:
        """Every process's last heartbeat ([count, where, unix time]); None for one that wrote none or the store
        could not give (its server gone)."""
        beats: dict[int, list | None] = {}
        if self.store is None:
            return beats
        try:
            self.store.set_timeout(datetime.timedelta(seconds=min(self.timeout, 10.0)))  # the store may be dying too
        except Exception:
            pass
        for rank in range(self.world_size):
            key = KEY.format(rank=rank)
            try:
                beats[rank] = json.loads(self.store.get(key)) if self.store.check([key]) else None
            except Exception:
                beats[rank] = None
        return beats

    def blame(self, error: BaseException) -> str | None:
        """One line naming the processes that stopped making progress when a collective failed with `error`, or
        None when `error` is not a collective's or the heartbeats cannot tell (every process at the same point)."""
        if self.store is None or not looks_like_a_collective_failure(error):
            return None
        beats = self.read()
        counts = {rank: beat[0] if beat else 0 for rank, beat in beats.items()}
        if not counts or len(set(counts.values())) == 1:
            return None
        furthest = max(counts.values())
        behind = sorted(rank for rank, count in counts.items() if count < furthest)
        now = time.time()

        def last(rank: int) -> str:
            beat = beats[rank]
            return "no heartbeat yet" if beat is None else f"'{beat[1]}' {now - beat[2]:.0f} s ago"

        ahead = min(rank for rank, count in counts.items() if count == furthest)
        named = ", ".join(f"rank {rank} (last at {last(rank)})" for rank in behind)
        return (f"rank {self.rank} ended waiting for the other processes ({type(error).__name__} in a collective, "
                f"ddp_timeout={self.timeout:g} s), and {named} stopped making progress while rank {ahead} reached "
                f"{last(ahead)}: {'that process' if len(behind) == 1 else 'those processes'} stalled or died. Read "
                f"{'its' if len(behind) == 1 else 'their'} log for why (a hang in data loading or a reward, an "
                f"out-of-memory kill); if it was only slow, raise ddp_timeout.")


def looks_like_a_collective_failure(error: BaseException) -> bool:
    """Whether `error` is a process group's (torch's DistError, or a RuntimeError from gloo or NCCL)."""
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in MARKERS)
