"""DeepSpeed: the "auto" config values rloo fills (always run), and ZeRO-2 and ZeRO-3 for real on 2 CPU
processes through `accelerate launch` with the shipped configs (skipped where deepspeed is not installed;
ZeRO-3 also where rloo has no gather for generation).

On CPU DeepSpeed JIT-compiles its shared-memory communication op (g++, ninja) the first time a process
group starts: a few minutes once, cached in ~/.cache/torch_extensions after that."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import free_port, torchrun
from rloo import ConfigError, RLOOConfig
from rloo.distributed.deepspeed_setup import fill_deepspeed_config, process_group_kwargs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parents[1] / "scripts" / "deepspeed_run.py"


def test_auto_micro_batch_and_clipping_come_from_the_config():
    args = RLOOConfig(per_device_train_batch_size=4, num_generations=4, max_grad_norm=0.5)
    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    fill_deepspeed_config(config, args)
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["gradient_clipping"] == 0.5
    kept = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5}
    fill_deepspeed_config(kept, args)
    assert kept == {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5}
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=8.*per_device_train_batch_size=4"):
        fill_deepspeed_config({"train_micro_batch_size_per_gpu": 8}, args)
    with pytest.raises(ConfigError, match="gradient_clipping=1.0.*max_grad_norm=0.5"):
        fill_deepspeed_config({"gradient_clipping": 1.0}, args)


def test_no_process_group_override_without_deepspeed(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert process_group_kwargs(RLOOConfig()) == []


def test_use_cpu_under_a_deepspeed_launch_is_refused(monkeypatch):
    # accelerate would silently drop DeepSpeed under cpu=True and train with DDP instead.
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with pytest.raises(ConfigError, match="use_cpu.*drop DeepSpeed"):
        process_group_kwargs(RLOOConfig(use_cpu=True))
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    with pytest.raises(ConfigError, match="ACCELERATE_USE_CPU"):
        process_group_kwargs(RLOOConfig())


def launch_env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("ACCELERATE_USE_CPU", None)
    if not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
    return env


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_on_two_cpu_processes_steps_once_per_optimizer_step_and_matches_ddp(tmp_path, stage):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed); ZeRO not run")
    if torch.cuda.is_available():
        pytest.skip("this test runs DeepSpeed on CPU processes")
    if stage == 3 and importlib.util.find_spec("rloo.distributed.sharding") is None:
        pytest.skip("ZeRO-3 needs the gather for generation (rloo.distributed.sharding, from the shard branch)")
    ds_dir, ddp_dir = tmp_path / f"zero{stage}", tmp_path / "ddp"
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(ROOT / "examples" / "accelerate_configs" / f"deepspeed_zero{stage}.yaml"),
              "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
              str(SCRIPT), str(ds_dir)]
    result = subprocess.run(launch, capture_output=True, text=True, timeout=1200, env=launch_env())
    assert result.returncode == 0, result.stderr[-3000:]
    ddp = torchrun(SCRIPT, ddp_dir)
    assert ddp.returncode == 0, ddp.stderr[-3000:]

    ranks = [json.loads((ds_dir / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        assert rank["num_processes"] == 2 and rank["engine"] == "DeepSpeedEngine" and rank["zero_stage"] == stage
        # 3 optimizer steps of 2 micro-batches each: the engine stepped 3 times, not 6.
        assert rank["global_steps"] == 3
        assert rank["ds_config"] == {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                     "gradient_clipping": 1.0, "train_batch_size": 4 * 2 * 2}
    reference = json.loads((ddp_dir / "rank0.json").read_text())
    assert reference["engine"] == "DistributedDataParallel"
    # The same data, seed and steps: ZeRO and DDP end at the same weights (the saved full checkpoints).
    saved, ddp_saved = (load_file(d / "run" / "model.safetensors") for d in (ds_dir, ddp_dir))
    for name, weight in ddp_saved.items():
        torch.testing.assert_close(saved[name], weight, rtol=0, atol=1e-4, msg=name)
    if stage == 2:  # full weights on every process
        assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9)
        assert ranks[0]["checksum"] == pytest.approx(reference["checksum"], rel=1e-6)
    lines = [json.loads(line) for line in (ds_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    ddp_lines = [json.loads(line) for line in (ddp_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["lr"] for line in lines] == pytest.approx([1e-2, 1e-2 * 2 / 3, 1e-2 / 3])  # once per step
    assert [line["grad_norm"] for line in lines] == pytest.approx([line["grad_norm"] for line in ddp_lines], rel=1e-5)
