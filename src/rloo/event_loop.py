"""One asyncio event loop for a run's async tools and async reward functions, living as long as the trainer.

An async tool or reward function that keeps an `asyncio.Lock`, an `httpx.AsyncClient`, an `aiohttp`
session or an `AsyncOpenAI` client binds it to the loop it was first used on. A fresh `asyncio.run` per
tool round or per reward call would give round 2 another loop, and the object fails there ("bound to a
different event loop"). So the trainer owns one `EventLoop`: a loop running on a daemon thread of its
own, started at the first coroutine, that every round and every reward call of the run submits to (from
the training thread, an async-rollouts sampler thread, or evaluation alike), and that is closed when the
trainer is garbage-collected or the interpreter exits (`close`, which also cancels what still runs).

A forked process (async_rollouts' sampler on CPU) does not inherit the parent's loop thread: there the
first coroutine starts the child's own loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import Any, Coroutine


class EventLoop:
    """A loop on a background thread; `run(coroutine)` blocks the calling thread until it is done."""

    def __init__(self, owner: object | None = None) -> None:
        """With `owner` (a trainer), the loop is closed when the owner is garbage-collected."""
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if owner is not None:
            weakref.finalize(owner, self.close)

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """The coroutine's result, run on this loop (its exception, raised here)."""
        loop = self.loop()
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("EventLoop.run was called from a coroutine running on the same loop; await instead.")
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use (and in a forked child, whose parent's thread is not there)."""
        if self._pid != os.getpid():
            self._pid, self._guard, self._loop, self._thread = os.getpid(), threading.Lock(), None, None
        with self._guard:
            if self._loop is None:
                ready = threading.Event()
                self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name="rloo-event-loop")
                self._thread.start()
                ready.wait()
            assert self._loop is not None
            return self._loop

    def _serve(self, ready: threading.Event) -> None:
        with asyncio.Runner() as runner:  # on close: cancels the tasks left, async generators, the default executor
            self._loop = runner.get_loop()
            self._loop.call_soon(ready.set)
            self._loop.run_forever()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()

    def close(self) -> None:
        """Stop the loop and wait for its thread (tasks still pending are cancelled). Closing twice does nothing;
        a coroutine run after closing starts a new loop."""
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join()
