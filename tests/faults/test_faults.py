"""Every fault of benchmarks/runs/faults.py, injected into a real tiny `rloo train` run (issue #48): the run ends in
its deadline, with its exit status and message, no complete checkpoint damaged, the resumable ones resuming to the
unfaulted run's weights bit for bit, and no process of its tree left behind (found by /proc, from outside).

Each run is a subprocess of 10-30 s (a stalled rank: ddp_timeout plus torchrun's grace, about 80 s; a vLLM server
fault: the server's start, about a minute, more). The storage faults need root (a tmpfs as output_dir) and are
skipped without it, the vLLM ones the venv scripts/test_vllm.sh builds; tests/faults/test_disk_full.py covers the
full disk in-process, tests/faults/test_server_engine_faults.py the server's guards without vLLM."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "runs"))

import faults  # noqa: E402  (benchmarks/runs/faults.py)

FAULTS = {fault.name: fault for fault in faults.faults()}
# 35 runs of 10-80 s each, the vLLM server ones a server start more (about 30 minutes on 2 cores): the harness tier,
# left out of the README's test command
# (scripts/run_tests.sh runs -m "not harness"); each guard also has a quick test of its own in tests/faults/.
pytestmark = [pytest.mark.slow, pytest.mark.harness]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults")
    (path / "runs").mkdir()
    faults.setup(path)
    return path


@pytest.fixture(scope="module")
def straight(work):
    """Unfaulted runs, by what a faulted run must share with one (faults.key), made when first asked for."""
    runs: dict = {}

    def get(fault):
        if faults.key(fault) not in runs:
            runs[faults.key(fault)] = faults.straight_run(work, *faults.key(fault))
        return runs
    return get


@pytest.mark.parametrize("name", list(FAULTS))
def test_the_fault_ends_the_run_cleanly(name, work, straight):
    fault = FAULTS[name]
    if fault.tmpfs_kb is not None and os.geteuid() != 0:
        pytest.skip("a tmpfs output_dir needs root")
    if fault.processes > 1 and os.environ.get("RLOO_SKIP_DISTRIBUTED"):
        pytest.skip("RLOO_SKIP_DISTRIBUTED is set")
    if fault.server is not None and faults.vllm_python() is None:
        pytest.skip("no vLLM venv for the server (bash scripts/test_vllm.sh builds it)")
    runs = straight(fault) if fault.resume or fault.tmpfs_kb == 0 else {}
    checkpoint_kb = 0
    if fault.tmpfs_kb == 0:
        sized = runs[faults.key(fault)]
        checkpoint_kb = max(sum(p.stat().st_size for p in c.rglob("*") if p.is_file())
                            for c in sized.glob("checkpoint-*")) // 1024 + 1
    row = faults.run_fault(fault, work, runs, checkpoint_kb)
    log = faults.output_dir_of(work, fault).with_suffix(".log")
    assert not row.hang, f"{name}: no end within {fault.deadline} s\n{log.read_text()[-3000:]}"
    assert row.left == 0, f"{name}: {row.left} processes left behind"
    assert row.lost == 0, f"{name}: {row.note}"
    assert row.ok, f"{name}: exit {row.exit}, message {row.message!r}\n{log.read_text()[-3000:]}"
