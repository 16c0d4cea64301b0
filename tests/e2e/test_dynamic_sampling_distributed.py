"""Dynamic sampling over two processes: every process runs the same rounds (the collective calls inside a
rollout line up, nothing hangs) and the weights stay in sync."""

import json
from pathlib import Path

import pytest

from conftest import torchrun


def test_two_processes_run_the_same_rounds(tmp_path):
    result = torchrun(Path(__file__).parents[1] / "scripts" / "dynamic_sampling_run.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]["calls"]) == len(ranks[1]["calls"]) >= 4  # one reward call per round, on both
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9, abs=1e-9)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(line["dynamic_sampling/rounds"] for line in lines) == len(ranks[0]["calls"])
    assert any(line["dynamic_sampling/rounds"] > 1 for line in lines)  # 3 prompts in 4 have zero spread
