"""Shared fixtures: a character tokenizer and tiny random models, built locally in milliseconds;
and a two-process torchrun launcher for the multi-process tests."""

import os
import socket
import subprocess
import sys

import pytest
import torch
import transformers
from datasets import Dataset

from rloo.toy import build_char_tokenizer, build_tiny_model

# One intra-op thread: tiny models gain nothing from more, and a busy machine makes spinning
# OpenMP threads dozens of times slower.
torch.set_num_threads(1)

# The helper scripts that tests launch in subprocesses (tests/scripts/) are also imported by them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip on a machine without a CUDA device (CI); scripts/gpu_lease.sh runs them."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run by scripts/gpu_lease.sh)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def make_model(tokenizer):
    """A fresh tiny Qwen2 (about 20k parameters); the same seed gives the same weights."""

    def make(seed: int = 0, **overrides):
        sizes = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
        return build_tiny_model(tokenizer, seed=seed, **{**sizes, **overrides})

    return make


@pytest.fixture
def digit_dataset():
    """Prompts with an `answer` column; the reward below only looks at the completions."""
    return Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)])


def gpt2_model(tokenizer, n_positions: int = 128, attn_implementation: str | None = None):
    """A tiny GPT-2 (absolute positions) whose position embeddings are large, so that a position off
    by one changes every log-prob: the check that rotary models cannot give."""
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.pad_token_id, attn_implementation=attn_implementation)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.wpe.weight.normal_(0, 1.0)
    return model.eval()  # no dropout: the passes compared must see the same network


def digit_fraction(completions, **kwargs):
    """Fraction of characters that are digits: easy to raise from a random init."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_plain_python(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python args...` in a process of its own, as a user runs a script without a launcher: none of the launcher's
    variables (an engine in this process may have set them), output captured."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def torchrun(script, *script_args, use_cpu: bool = True) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node 2 script args` on CPU processes; ACCELERATE_USE_CPU=1 makes accelerate
    join them into one world (without it accelerate sees two unconnected runs)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("ACCELERATE_USE_CPU", None)
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(script), *map(str, script_args)],
        capture_output=True, text=True, timeout=600, env=env,
    )


def pytest_configure(config):
    # Run by default (the README's command runs them); `-m "not slow"` leaves them out for a quick pass.
    config.addinivalue_line("markers", "slow: runs for tens of seconds or more (the sandbox's location and layer "
                                       "matrices); deselect with -m 'not slow'")
    config.addinivalue_line("markers", "harness: every fault of benchmarks/runs/faults.py injected into a real run "
                                       "(tests/faults/test_faults.py, ~15 min); the README's test command leaves it "
                                       "out (-m 'not harness'), `python -m pytest tests/faults -m harness` runs it")
