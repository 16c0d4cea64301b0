"""How tools and async reward functions run (tools/execution.py, event_loop.py): one event loop for the
whole run, so an async client or lock made in round 1 works in round 2 and at the next step; a plain tool's
timeout ends the wait, and plain tools still run one at a time after a timeout."""

import asyncio
import gc
import json
import threading
import time

import pytest
from datasets import Dataset
from tool_chat import ScriptedSampler, call, tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.event_loop import EventLoop
from rloo.tools import ToolCall, run_tool_calls
from rloo.toy import build_tiny_model


class LoopBoundClient:
    """Like httpx.AsyncClient / AsyncOpenAI: bound to the loop it was made on, and refusing any other."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.lock = asyncio.Lock()
        self.requests = 0

    async def request(self) -> int:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("<asyncio.locks.Lock object> is bound to a different event loop")
        async with self.lock:  # contended by the concurrent trajectories: binds the lock to this loop
            await asyncio.sleep(0.01)
            self.requests += 1
            return self.requests


def _dataset(n=2):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{a}+1?"}]} for a in range(n)])


def _trainer(tmp_path, tools, reward, script):
    tokenizer = tool_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    config = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=200, learning_rate=1e-2, beta=0.0, max_steps=2, logging_steps=1,
                        save_steps=0, seed=0, overwrite_output_dir=True, max_tool_calling_iterations=3)
    return RLOOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=_dataset(), processing_class=tokenizer,
                       sampler=ScriptedSampler(tokenizer, script), tools=tools)


def test_an_async_client_made_in_round_one_works_in_later_rounds_and_steps(tmp_path):
    """Two rounds of calls per trajectory, two steps, and an async reward function keeping its own client: every
    call and every reward call reaches the client made by the first one (a fresh asyncio.run per round fails
    from round 2 on with 'bound to a different event loop', sent to the model as a tool error)."""
    clients: dict[str, LoopBoundClient] = {}

    async def fetch(query: str) -> str:
        """Fetch a page.

        Args:
            query: what to look up
        """
        clients.setdefault("tool", LoopBoundClient())
        return f"page {await clients['tool'].request()}"

    async def judged(completions, **kwargs):
        clients.setdefault("reward", LoopBoundClient())
        return [float(await clients["reward"].request()) for _ in completions]

    def script(text, row):
        return call("fetch", query="x") if text.count("<tool_response>") < 2 else "done"

    trainer = _trainer(tmp_path, [fetch], judged, script)
    trainer.train()
    frequencies = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert [entry["tools/call_frequency"] for entry in frequencies] == [2.0, 2.0]  # two rounds, both steps
    assert [entry["tools/failure_frequency"] for entry in frequencies] == [0.0, 0.0]
    assert clients["tool"].requests == 2 * 2 * 4 and clients["reward"].requests == 2 * 4
    assert clients["tool"].loop is clients["reward"].loop is trainer.collector.event_loop.loop()

    loop = trainer.collector.event_loop
    assert loop.running
    del trainer
    gc.collect()
    assert not loop.running  # closed with the trainer


def test_the_event_loop_runs_coroutines_from_any_thread_and_closes():
    loop = EventLoop()

    async def where():
        return asyncio.get_running_loop()

    first = loop.run(where())
    seen = []
    thread = threading.Thread(target=lambda: seen.append(loop.run(where())))
    thread.start()
    thread.join()
    assert seen == [first] and loop.running
    with pytest.raises(ZeroDivisionError):
        loop.run(_raise())
    loop.close()
    loop.close()
    assert not loop.running and first.is_closed()


async def _raise():
    return 1 / 0


def test_run_tool_calls_on_one_loop_keeps_a_tool_s_lock_across_rounds():
    """The unit version: two trajectories contend for a lock made in round 1, in three rounds on the given loop."""
    state: dict[str, LoopBoundClient] = {}

    async def fetch(query: str) -> str:
        """Fetch.

        Args:
            query: anything
        """
        state.setdefault("client", LoopBoundClient())
        return str(await state["client"].request())

    loop = EventLoop()
    try:
        for _ in range(3):
            calls = [[ToolCall("fetch", {"query": "a"})], [ToolCall("fetch", {"query": "b"})]]
            results = run_tool_calls(calls, [{"fetch": fetch}] * 2, timeout=5, event_loop=loop)
            assert not any(r.failed for turn in results for r in turn), [json.loads(r.content) for t in results for r in t]
    finally:
        loop.close()
    assert state["client"].requests == 6


# ------------------------------------------------------------------ plain tools: timeouts end the wait


def _stuck_tool(release: threading.Event, log: list):
    def stuck(x: int) -> int:
        """Hang until released (4 s at most).

        Args:
            x: anything
        """
        log.append("stuck started")
        release.wait(4)
        log.append("stuck returned")
        return x

    return stuck


def _quick_tool(log: list):
    def quick(x: int) -> int:
        """Return at once.

        Args:
            x: anything
        """
        log.append("quick ran")
        return x

    return quick


@pytest.mark.parametrize("on_the_run_s_loop", [False, True], ids=["own_loop", "run_loop"])
def test_a_plain_tool_s_timeout_ends_the_wait(on_the_run_s_loop):
    """A plain tool hanging for 4 s under a 0.5 s timeout: the round returns the timeout message well before the
    4 s are up (the worker thread is abandoned, not joined), on a loop of the call's own or the run's."""
    release, log = threading.Event(), []
    loop = EventLoop() if on_the_run_s_loop else None
    start = time.perf_counter()
    try:
        [[result]] = run_tool_calls([[ToolCall("stuck", {"x": 1})]], [{"stuck": _stuck_tool(release, log)}],
                                    timeout=0.5, event_loop=loop)
        waited = time.perf_counter() - start
    finally:
        release.set()
        if loop is not None:
            loop.close()
    assert result.failed and "did not return within 0.5 s" in json.loads(result.content)["error"]
    assert waited < 3.0, f"the round waited {waited:.1f} s for a tool that timed out after 0.5 s"


def test_plain_tools_stay_one_at_a_time_after_a_timeout():
    """Round 1's plain tool times out and keeps running; round 2's plain tool starts only once it has returned
    (released after 1 s, within round 2's timeout), never beside it."""
    release, log = threading.Event(), []
    tools = {"stuck": _stuck_tool(release, log), "quick": _quick_tool(log)}
    loop = EventLoop()
    try:
        [[first]] = run_tool_calls([[ToolCall("stuck", {"x": 1})]], [tools], timeout=0.3, event_loop=loop)
        assert first.failed and log == ["stuck started"]
        threading.Timer(1.0, release.set).start()
        [[second]] = run_tool_calls([[ToolCall("quick", {"x": 2})]], [tools], timeout=10, event_loop=loop)
    finally:
        release.set()
        loop.close()
    assert not second.failed and second.content == "2"
    assert log == ["stuck started", "stuck returned", "quick ran"]


def test_a_plain_call_behind_a_tool_that_still_runs_fails_naming_it():
    """If the timed-out tool still runs when the next plain call's own timeout is up, that call fails, within
    about its timeout, with a message naming the tool it waited for; it never runs beside it."""
    release, log = threading.Event(), []
    tools = {"stuck": _stuck_tool(release, log), "quick": _quick_tool(log)}
    loop = EventLoop()
    try:
        run_tool_calls([[ToolCall("stuck", {"x": 1})]], [tools], timeout=0.3, event_loop=loop)
        start = time.perf_counter()
        [[second]] = run_tool_calls([[ToolCall("quick", {"x": 2})]], [tools], timeout=0.3, event_loop=loop)
        waited = time.perf_counter() - start
    finally:
        release.set()
        loop.close()
    error = json.loads(second.content)["error"]
    assert second.failed and "'quick' could not start within 0.3 s" in error and "'stuck'" in error
    assert "quick ran" not in log and waited < 3.0
