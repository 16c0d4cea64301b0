"""One process x B completions == two CPU processes x B/2: the same gradient before the step."""

from pathlib import Path

import torch
from equivalence_run import VARIANTS, gradients

from conftest import torchrun


def test_one_process_equals_two_processes_with_half_the_batch(tmp_path):
    result = torchrun(Path(__file__).parents[1] / "scripts" / "equivalence_run.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    two = [torch.load(tmp_path / f"grads{rank}.pt") for rank in range(2)]
    one = gradients(1, 0, tmp_path)
    for name in VARIANTS:
        assert any(g.abs().sum() > 0 for g in one[name])
        for g_one, g_rank0, g_rank1 in zip(one[name], two[0][name], two[1][name]):
            torch.testing.assert_close(g_rank0, g_rank1, rtol=0, atol=0)  # DDP averaged them
            torch.testing.assert_close(g_rank0, g_one, rtol=1e-4, atol=1e-6, msg=name)
