"""How tools and async reward functions run (tools/execution.py, run/event_loop.py): one event loop for the
whole run, so an async client or lock made in round 1 works in round 2 and at the next step; a plain tool's
timeout ends the wait, and plain tools still run one at a time after a timeout."""

import asyncio
import gc
import json
import threading

import pytest
from datasets import Dataset
from tool_chat import ScriptedSampler, call, tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.run.event_loop import EventLoop
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
