"""Running one turn's tool calls: plain and async functions, each with a timeout.

Every failure (an unknown tool, a malformed call, wrong arguments, an exception, a timeout) becomes
the tool's message `{"error": "..."}`, which the model reads on its next turn, and is marked
`failed` for `tools/failure_frequency`; none of them stops the run.

Trajectories run concurrently on one event loop (the trainer's, `rloo.event_loop`): async tools
overlap, and plain tools run one at a time (as TRL runs them, one after another: a plain tool need not be
thread-safe), each on a daemon thread of its own. A trajectory's own calls run in the order the model
wrote them, since environment tools change state.

A timeout ends the wait: an async tool is cancelled; a plain tool cannot be stopped, so the round stops
waiting for its thread (abandoned, never joined: a hung tool does not hang the rollout) and the thread
finishes in the background, its result ignored. Plain tools stay one at a time after a timeout: the next
plain call on the same loop first waits for the abandoned thread to return, within its own timeout (the
whole wait, queueing excluded, is at most `timeout`); if the abandoned tool still runs then, the call fails
with a message naming it. A tool that never returns thus fails every later plain call of the run, each
after `timeout`: make such a tool async, or give it a timeout of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from rloo.event_loop import EventLoop
from rloo.tools.parsing import ToolCall


@dataclass
class ToolResult:
    """What one call returned, as the tool message's text."""

    name: str
    content: str
    failed: bool = False


def run_tool_calls(calls: list[list[ToolCall]], toolboxes: list[dict[str, Callable]],
                   timeout: float, event_loop: EventLoop | None = None) -> list[list[ToolResult]]:
    """The results of each trajectory's calls, in call order; `toolboxes[i]` maps names to trajectory i's tools.
    Async tools run on `event_loop` (the trainer's, so a client or lock a tool keeps works in every round);
    None: on a loop of this call's own."""
    if not any(calls):
        return [[] for _ in calls]
    if event_loop is not None:
        return event_loop.run(_run_all(calls, toolboxes, timeout))
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no loop in this thread
        return asyncio.run(_run_all(calls, toolboxes, timeout))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from inside a running loop (a notebook)
        return pool.submit(asyncio.run, _run_all(calls, toolboxes, timeout)).result()


async def _run_all(calls: list[list[ToolCall]], toolboxes: list[dict[str, Callable]],
                   timeout: float) -> list[list[ToolResult]]:
    async def trajectory(turn_calls: list[ToolCall], toolbox: dict[str, Callable]) -> list[ToolResult]:
        return [await _run_one(call, toolbox, timeout) for call in turn_calls]

    return list(await asyncio.gather(*(trajectory(c, t) for c, t in zip(calls, toolboxes))))


async def _run_one(call: ToolCall, toolbox: dict[str, Callable], timeout: float) -> ToolResult:
    if call.error is not None:
        return _failure(call.name, f"malformed tool call: {call.error}")
    tool = toolbox.get(call.name)
    if tool is None:
        return _failure(call.name, f"unknown tool {call.name!r}; the tools are {sorted(toolbox)}")
    try:
        if inspect.iscoroutinefunction(tool):
            result = await asyncio.wait_for(tool(**call.arguments), timeout)
        else:
            result = await _run_plain(call.name, tool, call.arguments, timeout)
    except asyncio.TimeoutError:
        return _failure(call.name, f"the tool {call.name!r} did not return within {timeout:g} s")
    except _StillRunning as error:
        return _failure(call.name, str(error))
    except Exception as error:  # a tool's bug or a wrong argument is the model's feedback, not the run's end
        return _failure(call.name, f"{type(error).__name__}: {error}")
    return ToolResult(call.name, result if isinstance(result, str) else str(result))


class _StillRunning(Exception):
    """A plain call could not start: the plain tool that timed out before it still runs."""


@dataclass
class _PlainToolSlot:
    """One loop's plain tools, one at a time: `lock` queues the calls; `running` is settled by the last call's
    thread when its function returns, which may be long after that call timed out (`name` is that tool)."""

    lock: asyncio.Lock
    running: asyncio.Future | None = None
    name: str = ""


_SLOTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PlainToolSlot]" = weakref.WeakKeyDictionary()


async def _run_plain(name: str, tool: Callable, arguments: dict[str, Any], timeout: float) -> Any:
    """`tool(**arguments)` on a daemon thread, waited for at most `timeout` seconds (TimeoutError after)."""
    loop = asyncio.get_running_loop()
    slot = _SLOTS.setdefault(loop, _PlainToolSlot(asyncio.Lock()))
    async with slot.lock:
        deadline = loop.time() + timeout
        if slot.running is not None and not slot.running.done():  # a timed-out tool's thread: wait for it
            try:
                await asyncio.wait_for(asyncio.shield(slot.running), timeout)
            except asyncio.TimeoutError:
                raise _StillRunning(f"the tool {name!r} could not start within {timeout:g} s: plain tools run one at a "
                                    f"time, and {slot.name!r}, which timed out earlier, still runs") from None
        slot.running, slot.name = loop.create_future(), name
        threading.Thread(target=_call_and_settle, args=(loop, slot.running, tool, arguments), daemon=True,
                         name=f"rloo-tool-{name}").start()
        # shield: a timeout stops this wait, not the future, which stays pending until the thread returns
        succeeded, value = await asyncio.wait_for(asyncio.shield(slot.running), max(deadline - loop.time(), 0.0))
    if not succeeded:
        raise value
    return value


def _call_and_settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, tool: Callable,
                     arguments: dict[str, Any]) -> None:
    """The worker thread: run the tool, then settle `future` with (succeeded, result or exception) on its loop."""
    try:
        outcome: tuple[bool, Any] = (True, tool(**arguments))
    except Exception as error:
        outcome = (False, error)
    try:
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(outcome))
    except RuntimeError:  # the loop was closed while the tool ran: nobody waits for it any more
        pass


def _failure(name: str, message: str) -> ToolResult:
    return ToolResult(name or "unknown", json.dumps({"error": message}), failed=True)
