"""One process x B completions == two CPU processes x B/2: the same gradient before the step."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from equivalence_run import VARIANTS, gradients


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_one_process_equals_two_processes_with_half_the_batch(tmp_path):
    script = Path(__file__).with_name("equivalence_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
         str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    two = [torch.load(tmp_path / f"grads{rank}.pt") for rank in range(2)]
    one = gradients(1, 0, tmp_path)
    for name in VARIANTS:
        assert any(g.abs().sum() > 0 for g in one[name])
        for g_one, g_rank0, g_rank1 in zip(one[name], two[0][name], two[1][name]):
            torch.testing.assert_close(g_rank0, g_rank1, rtol=0, atol=0)  # DDP averaged them
            torch.testing.assert_close(g_rank0, g_one, rtol=1e-4, atol=1e-6, msg=name)
