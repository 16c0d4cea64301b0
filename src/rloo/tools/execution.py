"""Running one turn's tool calls: plain and async functions, each with a timeout.

Every failure (an unknown tool, a malformed call, wrong arguments, an exception, a timeout) becomes
the tool's message `{"error": "..."}`, which the model reads on its next turn, and is marked
`failed` for `tools/failure_frequency`; none of them stops the run.

Trajectories run concurrently on one event loop: async tools overlap, and plain tools run one at a
time on a worker thread (as TRL runs them, one after another: a plain tool need not be thread-safe).
A trajectory's own calls run in the order the model wrote them, since environment tools change state.
A plain tool that times out cannot be stopped: its thread finishes in the background, ignored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
from dataclasses import dataclass
from typing import Callable

from rloo.run.event_loop import EventLoop
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
    plain_tools = asyncio.Lock()  # one plain tool at a time

    async def trajectory(turn_calls: list[ToolCall], toolbox: dict[str, Callable]) -> list[ToolResult]:
        return [await _run_one(call, toolbox, timeout, plain_tools) for call in turn_calls]

    return list(await asyncio.gather(*(trajectory(c, t) for c, t in zip(calls, toolboxes))))


async def _run_one(call: ToolCall, toolbox: dict[str, Callable], timeout: float, plain_tools: asyncio.Lock) -> ToolResult:
    if call.error is not None:
        return _failure(call.name, f"malformed tool call: {call.error}")
    tool = toolbox.get(call.name)
    if tool is None:
        return _failure(call.name, f"unknown tool {call.name!r}; the tools are {sorted(toolbox)}")
    try:
        if inspect.iscoroutinefunction(tool):
            result = await asyncio.wait_for(tool(**call.arguments), timeout)
        else:
            async with plain_tools:
                result = await asyncio.wait_for(asyncio.to_thread(tool, **call.arguments), timeout)
    except asyncio.TimeoutError:
        return _failure(call.name, f"the tool {call.name!r} did not return within {timeout:g} s")
    except Exception as error:  # a tool's bug or a wrong argument is the model's feedback, not the run's end
        return _failure(call.name, f"{type(error).__name__}: {error}")
    return ToolResult(call.name, result if isinstance(result, str) else str(result))


def _failure(name: str, message: str) -> ToolResult:
    return ToolResult(name or "unknown", json.dumps({"error": message}), failed=True)
