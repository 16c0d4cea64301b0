"""Launches that would run unconnected copies are refused; the documented CPU launch lines work."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import free_port, torchrun
from rloo.distributed.launch import LaunchError, check_launch, launched_world_size

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "accelerate_configs"



def test_world_size_from_the_launcher_environment():
    assert launched_world_size({}) == 1
    assert launched_world_size({"WORLD_SIZE": "4", "LOCAL_RANK": "0"}) == 4
    assert launched_world_size({"OMPI_COMM_WORLD_SIZE": "3"}) == 3


def test_more_launched_processes_than_connected_is_refused_with_the_fix():
    with pytest.raises(LaunchError, match="use_cpu=True") as info:
        check_launch(1, {"WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert "torchrun --nproc_per_node 2" in str(info.value)
    check_launch(2, {"WORLD_SIZE": "2", "LOCAL_RANK": "1"})  # connected: fine
    check_launch(1, {})  # plain python: fine


def test_accelerate_simple_launcher_asked_for_several_processes_warns(caplog):
    check_launch(1, {"MASTER_ADDR": "127.0.0.1", "ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_CPU": "True"})
    assert "started one" in caplog.text


@pytest.mark.parametrize("name", ["multi_cpu", "multi_gpu", "fsdp2", "deepspeed_zero2", "deepspeed_zero3"])
def test_shipped_accelerate_configs_parse(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert config.num_processes >= 2
    if name == "fsdp2":
        assert config.fsdp_config["fsdp_version"] == 2
    if name.startswith("deepspeed"):
        assert config.deepspeed_config["zero_stage"] == int(name[-1])


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("ACCELERATE_USE_CPU", None)
    return env


def test_torchrun_without_use_cpu_is_refused_not_duplicated(tmp_path):
    result = torchrun(ROOT / "tests" / "scripts" / "distributed_run.py", tmp_path, use_cpu=False)
    assert result.returncode != 0
    assert "2 unconnected copies" in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(shutil.which("accelerate") is None, reason="the accelerate command is not on PATH")
def test_documented_accelerate_cpu_line_runs_one_world_of_two(tmp_path):
    """docs/launching.md: accelerate launch --config_file .../multi_cpu.yaml ... --use_cpu."""
    script = ROOT / "tests" / "scripts" / "distributed_run.py"
    config = yaml.safe_load((CONFIGS / "multi_cpu.yaml").read_text())
    config["main_process_port"] = free_port()
    config_file = tmp_path / "multi_cpu.yaml"
    config_file.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        ["accelerate", "launch", "--config_file", str(config_file), str(script), str(tmp_path), "--use_cpu"],
        capture_output=True, text=True, timeout=600, env=_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9, abs=1e-9)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3  # one writer
