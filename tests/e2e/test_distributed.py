"""Two processes with accelerate on CPU: whole groups per process, global counts, weights in sync."""

import json
from pathlib import Path

import pytest

from conftest import torchrun


def test_two_processes_keep_groups_whole_and_weights_in_sync(tmp_path):
    # On CPU, accelerate runs multi-process (gloo) under torchrun when ACCELERATE_USE_CPU is set.
    result = torchrun(Path(__file__).parents[1] / "scripts" / "distributed_run.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["num_processes"] == 2 for r in ranks)
    for rank in ranks:
        for prompts in rank["seen"]:  # each call scores this process's whole step: 2 groups of K=4
            assert len(prompts) == 8
            assert len(set(prompts[:4])) == 1 and len(set(prompts[4:])) == 1
    for step in range(3):  # the two processes draw different prompts
        assert set(ranks[0]["seen"][step]).isdisjoint(ranks[1]["seen"][step])
    assert ranks[0]["episode"] == ranks[1]["episode"] == 3 * 8 * 2  # episodes count both processes
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9, abs=1e-9)  # DDP kept weights equal
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # only the main process writes
    # The linear schedule decays once per optimizer step, not once per process: step s uses 1e-2 * (4 - s) / 3.
    assert [json.loads(line)["lr"] for line in lines] == pytest.approx([1e-2, 1e-2 * 2 / 3, 1e-2 / 3])


def test_two_processes_with_the_shared_prefix_forward_train_like_the_whole_row_pass(tmp_path):
    # The shared-prefix forward calls the DDP-wrapped model twice (prompts, then completions) before
    # one backward: DDP must still average the same gradients, also when each MLP is recomputed in
    # backward (gradient checkpointing under the shared prefix) and so runs again inside DDP's backward.
    variants = {"whole": [], "shared": ["--shared_prefix_forward"],
                "shared_checkpointed": ["--shared_prefix_forward", "--gradient_checkpointing"]}
    checksums = {}
    for variant, extra in variants.items():
        result = torchrun(Path(__file__).parents[1] / "scripts" / "distributed_run.py", tmp_path / variant, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        ranks = [json.loads((tmp_path / variant / f"rank{r}.json").read_text()) for r in range(2)]
        assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9, abs=1e-9)
        assert [r["checkpointed_layers"] for r in ranks] == [2 if variant == "shared_checkpointed" else 0] * 2
        checksums[variant] = ranks[0]["checksum"]
    assert checksums["shared"] == pytest.approx(checksums["whole"], rel=1e-6)
    assert checksums["shared_checkpointed"] == pytest.approx(checksums["whole"], rel=1e-6)
