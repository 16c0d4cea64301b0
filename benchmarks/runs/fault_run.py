"""`rloo train` (or one rank of a torchrun world) with one fault injected, for benchmarks/runs/faults.py.

    python benchmarks/runs/fault_run.py [rloo train flags...]      with RLOO_FAULT=<point>:<n>:<action>

point: "step" (after this process's n-th optimizer step), "eval" (at the start of its n-th evaluation),
"save" (inside its n-th checkpoint save, every file written, before the rename), "reward_model" (its n-th
call of a reward model), "push" / "pushed" (at the start / the end of its n-th weight push to a vLLM server),
"tool" (the model's n-th turn parsed as a call of the tool slow_add, the action sent mid-call). action: "TERM" /
"INT" / "INT2" (signals sent to this process; INT2 sends SIGINT twice), "KILL", "remount_ro" (output_dir made
read-only by a bind mount), "rmtree_checkpoints" (every checkpoint-* folder deleted), "rmtree_output"
(output_dir deleted), "oom" (torch.OutOfMemoryError), "stall" (sleep an hour), "restart_server" (the vLLM
server, RLOO_FAULT_SERVER_PID, killed and started again on the same port from RLOO_FAULT_SERVER_CMD: it then
serves the weights it starts with). RLOO_FAULT_RANK limits the fault to one rank of a distributed run.
The reward functions below fault on their own (their names say how) on the n-th batch, RLOO_FAULT_BATCH.
"""

import functools
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
BATCH = int(os.environ.get("RLOO_FAULT_BATCH", "2"))
_calls = {"n": 0}


def digit_fraction(completions, **kwargs):
    return [sum(ch.isdigit() for ch in str(c)) / max(len(str(c)), 1) for c in completions]


def _nth_batch() -> bool:
    _calls["n"] += 1
    return _calls["n"] == BATCH


def hangs(completions, **kwargs):
    if _nth_batch():
        time.sleep(3600)  # a reward server that never answers
    return digit_fraction(completions)


def raises(completions, **kwargs):
    if _nth_batch():
        raise ConnectionError("the reward server refused the connection")
    return digit_fraction(completions)


def wrong_count(completions, **kwargs):
    values = digit_fraction(completions)
    return values[:-1] if _nth_batch() else values


def returns_nan(completions, **kwargs):
    values = digit_fraction(completions)
    return [math.nan, *values[1:]] if _nth_batch() else values


def _in_sampler() -> bool:
    return multiprocessing.current_process().name != "MainProcess"


def sampler_dies(completions, **kwargs):
    if _in_sampler() and _nth_batch():
        os._exit(3)  # the producer process vanishes (as if OOM-killed)
    return digit_fraction(completions)


def sampler_raises(completions, **kwargs):
    if _in_sampler() and _nth_batch():
        raise RuntimeError("the sampler's reward server is down")
    return digit_fraction(completions)


def sampler_stalls(completions, **kwargs):
    if _in_sampler() and _nth_batch():
        time.sleep(3600)
    return digit_fraction(completions)


def rank_raises(completions, **kwargs):
    if os.environ.get("RANK") == os.environ.get("RLOO_FAULT_RANK", "1") and _nth_batch():
        raise ValueError("rank 1's reward parser hit an unexpected token")
    return digit_fraction(completions)


def slow_add(a: int, b: int) -> int:
    """Add two integers (a tool that takes 2 s: RLOO_FAULT_TOOL_SIGNAL, TERM or INT2, arrives in its middle).

    Args:
        a: the first integer
        b: the second integer
    """
    signal_name = os.environ.get("RLOO_FAULT_TOOL_SIGNAL")
    if signal_name and not _calls.get("signalled"):
        _calls["signalled"] = True
        time.sleep(0.5)
        _act(signal_name)
    time.sleep(1.5)
    return a + b


def _output_dir() -> Path:
    return Path(sys.argv[sys.argv.index("--output_dir") + 1])


def _act(action: str) -> None:
    sys.stdout.flush()
    if action in ("TERM", "INT", "KILL"):
        os.kill(os.getpid(), getattr(signal, f"SIG{action}"))
    elif action == "INT2":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
    elif action == "remount_ro":
        # A read-only bind mount over the folder: files the run holds open stay writable (a remount of the
        # whole file system is refused while they are), every new file or folder fails with EROFS.
        subprocess.run(["mount", "--bind", str(_output_dir()), str(_output_dir())], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(_output_dir())], check=True)
    elif action == "rmtree_checkpoints":
        for path in _output_dir().glob("checkpoint-*"):
            shutil.rmtree(path)
    elif action == "rmtree_output":
        shutil.rmtree(_output_dir())
    elif action == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    elif action == "stall":
        time.sleep(3600)
    elif action == "restart_server":
        _restart_server()


def _restart_server() -> None:
    import json
    import urllib.request

    url, cmd = os.environ["RLOO_FAULT_SERVER_URL"], json.loads(os.environ["RLOO_FAULT_SERVER_CMD"])
    os.kill(int(os.environ["RLOO_FAULT_SERVER_PID"]), signal.SIGKILL)
    time.sleep(1.0)  # its port free again
    env = {**os.environ, "RLOO_FAULT_TAG": os.environ["RLOO_FAULT_SERVER_TAG"], "RLOO_SERVER_FAULT": "",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(_output_dir().parent / "restarted-server.log", "w") as log:
        subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"the restarted vLLM server at {url} did not answer within 900 s")


def _arm(point: str, count: int, action: str) -> None:
    from rloo import evaluation, update
    from rloo.generation import vllm_client
    from rloo.rewards import reward_model
    from rloo.run import checkpoint

    if point == "tool":  # the model's n-th turn is a call of slow_add, whatever it wrote (a tiny model writes none)
        from rloo.tools.formats import CallFormat
        from rloo.tools.parsing import ToolCall

        parse, turns = CallFormat.parse, [0]

        def forced(self, text):
            turns[0] += 1
            content, calls = parse(self, text)
            return (content, [ToolCall("slow_add", {"a": 1, "b": 2})]) if turns[0] == count else (content, calls)

        CallFormat.parse = forced
        os.environ["RLOO_FAULT_TOOL_SIGNAL"] = action
        return
    targets = {"step": (update.Learner, "step"), "eval": (evaluation, "evaluate"), "save": (checkpoint, "_fsync_tree"),
               "reward_model": (reward_model.RewardModel, "__call__"), "push": (vllm_client.HTTPEngine, "load_weights"),
               "pushed": (vllm_client.HTTPEngine, "load_weights")}
    owner, name = targets[point]
    original = getattr(owner, name)
    calls = [0]

    @functools.wraps(original)  # the same signature: a reward model is still passed only what it takes
    def wrapped(*args, **kwargs):
        after = point in ("step", "pushed")
        result = original(*args, **kwargs) if after else None
        calls[0] += 1
        if calls[0] == count:
            _act(action)
        return result if after else original(*args, **kwargs)

    setattr(owner, name, wrapped)


if __name__ == "__main__":
    fault = os.environ.get("RLOO_FAULT")
    if fault and os.environ.get("RANK", "0") == os.environ.get("RLOO_FAULT_RANK", os.environ.get("RANK", "0")):
        point, count, action = fault.split(":")
        _arm(point, int(count), action)
    from rloo.cli import main

    main(["train", *sys.argv[1:]])
