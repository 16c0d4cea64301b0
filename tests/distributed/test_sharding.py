"""Sharded training on CPU processes: FSDP2 (`fully_shard`, gloo) for real, DeepSpeed ZeRO-3 against a
fake `deepspeed` module (its real run is unverified here; docs/launching.md)."""

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest import torchrun
from rloo import RLOOConfig
from rloo.config import ConfigError


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    result = torchrun(Path(__file__).parents[1] / "scripts" / "fsdp2_run.py", out)
    assert result.returncode == 0, result.stderr[-4000:]
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_fsdp2_gathered_generation_equals_the_unsharded_model(fsdp2_run):
    _, ranks = fsdp2_run
    for rank in ranks:
        assert rank["gathered"] == rank["expected"]  # greedy tokens of the fast sampler
        assert rank["plain_during"] and rank["sharded_after"]  # full weights inside, shards again after
    assert ranks[0]["expected"] != ranks[1]["expected"]  # each process generated for its own prompts


def test_fsdp2_generation_without_gathering_equals_the_unsharded_model(fsdp2_run):
    _, ranks = fsdp2_run
    for rank in ranks:  # ds3_gather_for_generation=False: generate on the sharded model, processes in step
        assert rank["not_gathered"] == rank["expected_top1"]


def test_fsdp2_reference_logprobs_equal_the_unsharded_ones(fsdp2_run):
    _, ranks = fsdp2_run
    for rank in ranks:
        expected = torch.tensor(rank["reference_expected"])  # (B, C)
        torch.testing.assert_close(torch.tensor(rank["reference_sharded"]), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.tensor(rank["policy_after_generation"]), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.tensor(rank["lora_reference"]), expected, rtol=0, atol=1e-5)  # adapters off
        assert (torch.tensor(rank["lora_policy"]) - expected).abs().max() > 1e-3  # adapters on: another model


def test_fsdp2_saves_a_full_checkpoint_that_loads_with_from_pretrained(fsdp2_run):
    from transformers import AutoModelForCausalLM

    out, _ = fsdp2_run
    loaded = AutoModelForCausalLM.from_pretrained(out / "saved").state_dict()
    expected = torch.load(out / "expected.pt")
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_fsdp2_training_through_accelerate_matches_ddp_and_resumes(tmp_path):
    """The whole loop under accelerate's FSDP2 (forced on CPU, see fsdp2_train_run.py): sharded
    policy and reference, gathered generation, a checkpoint every step, the final save. The same
    seed under DDP must reach the same weights, and resuming from checkpoint-1 the same again."""
    from safetensors.torch import load_file

    script = Path(__file__).parents[1] / "scripts" / "fsdp2_train_run.py"
    for mode in ("fsdp2", "ddp"):
        result = torchrun(script, tmp_path, mode)
        assert result.returncode == 0, result.stderr[-4000:]
    fsdp2 = [json.loads((tmp_path / f"fsdp2-rank{r}.json").read_text()) for r in range(2)]
    assert all(r["distributed_type"] == "DistributedType.FSDP" for r in fsdp2)
    assert all(r["policy"] == "fsdp2" and r["reference"] == "fsdp2" for r in fsdp2)  # no full copy per process
    sharded, replicated = (load_file(str(tmp_path / mode / "model.safetensors")) for mode in ("fsdp2", "ddp"))
    assert sharded.keys() == replicated.keys()  # full weights, the tied head written once
    # Adam at lr 1e-2 moves weights ~1e-2 a step; the reference pass (each prompt once, then its completions
    # on the cache) rounds differently from the training pass at the 1e-7 level, which two steps carry to ~2e-6.
    for name, tensor in replicated.items():
        torch.testing.assert_close(sharded[name], tensor, rtol=0, atol=1e-5, msg=name)
    logs = {mode: [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
            for mode in ("fsdp2", "ddp")}
    for key in ("reward", "eval/reward"):  # the eval: 3 and 2 prompts on the two processes, generating as often
        values = {mode: [row[key] for row in rows if key in row] for mode, rows in logs.items()}
        assert values["fsdp2"] == values["ddp"] and values["ddp"], key

    result = torchrun(script, tmp_path, "fsdp2", "--resume")  # step 2 again, from checkpoint-1's sharded state
    assert result.returncode == 0, result.stderr[-4000:]
    resumed = load_file(str(tmp_path / "fsdp2" / "model.safetensors"))
    for name, tensor in sharded.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_fsdp2_a_nan_in_one_shard_stops_every_process_from_saving(fsdp2_run):
    _, ranks = fsdp2_run
    assert "model.norm.weight" in ranks[1]["nan_refused"]  # the process holding it names it
    assert "another process" in ranks[0]["nan_refused"]


def test_gathering_off_needs_the_generate_sampler():
    with pytest.raises(ConfigError, match="ds3_gather_for_generation=False.*sampler='generate'"):
        RLOOConfig(ds3_gather_for_generation=False)
    assert RLOOConfig(ds3_gather_for_generation=False, sampler="generate").ds3_gather_for_generation is False


# ------------------------------------------------------------------ ZeRO-3, against a fake deepspeed


class FakeZero3Param(torch.nn.Parameter):
    """Stands for a ZeRO-3 partitioned parameter: a `ds_id` and the modules currently using it."""


def _zero3_engine(calls):
    """A module whose parameters look partitioned and an engine-like object holding ZeRO-3's hooks."""
    module = torch.nn.Linear(2, 2)
    for name, param in list(module.named_parameters()):
        fake = FakeZero3Param(param.detach().clone())
        fake.ds_id, fake.ds_active_sub_modules = len(calls), {1}
        setattr(module, name, fake)

    class Hook:
        def __init__(self, name):
            self.name = name

        def remove(self):
            calls.append(f"remove {self.name}")

    coordinator = types.SimpleNamespace(module=module, forward_hooks=[Hook("forward")], backward_hooks=[Hook("backward")],
                                        _register_deepspeed_module=lambda m: calls.append("register hooks"))
    engine = torch.nn.Module()  # a DeepSpeedEngine is a Module wrapping the model as .module
    engine.module, engine.optimizer = module, types.SimpleNamespace(parameter_offload=coordinator)
    return engine, module, coordinator


def test_zero3_gathers_with_deepspeeds_gathered_parameters(monkeypatch):
    from rloo.distributed import sharding

    calls = []

    class GatheredParameters:
        def __init__(self, params, modifier_rank=None):
            calls.append(f"gather {len(list(params))}")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append("release")

    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(zero=types.SimpleNamespace(
        GatheredParameters=GatheredParameters)))
    engine, module, coordinator = _zero3_engine(calls)
    accelerator = types.SimpleNamespace(unwrap_model=lambda m: module)
    assert sharding.sharding_of(module) == "zero3"
    with sharding.full_weights_for_generation(accelerator, engine) as model:
        assert model is module
        calls.append("generate")
        assert all(not p.ds_active_sub_modules for p in module.parameters())
    assert calls == ["gather 2", "remove forward", "remove backward", "generate", "register hooks", "release"]
    assert coordinator.forward_hooks == [] and coordinator.backward_hooks == []

    calls.clear()
    with sharding.full_weights_for_generation(accelerator, engine, gather=False) as model:
        assert model is module
    assert calls == []  # ds3_gather_for_generation=False: the partitioned model as it is


def test_zero3_reference_is_a_deepspeed_engine_without_optimizer(monkeypatch):
    from accelerate.utils import DistributedType

    from rloo.distributed import sharding

    seen = {}

    def initialize(model, config):
        seen["model"], seen["config"] = model, config
        engine = types.SimpleNamespace(training=True)
        engine.eval = lambda: setattr(engine, "training", False)  # returns None, as DeepSpeedEngine.eval does
        return engine, None, None, None

    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(initialize=initialize))
    ds_config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
                 "optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}, "train_batch_size": 8}
    accelerator = types.SimpleNamespace(is_fsdp2=False, distributed_type=DistributedType.DEEPSPEED,
                                        state=types.SimpleNamespace(deepspeed_plugin=types.SimpleNamespace(
                                            deepspeed_config=ds_config)))
    reference = torch.nn.Linear(2, 2)
    engine = sharding.prepare_reference(accelerator, reference)
    assert engine is not None and engine.training is False
    assert seen["model"] is reference and not any(p.requires_grad for p in reference.parameters())
    assert seen["config"] == {"zero_optimization": {"stage": 3}, "train_batch_size": 8}
    assert "optimizer" in ds_config  # the run's own config is left as it was


def test_fsdp1_is_refused_with_the_fix():
    from accelerate.utils import DistributedType

    from rloo.distributed.sharding import check_supported

    with pytest.raises(ValueError, match="fsdp_version: 2"):
        check_supported(types.SimpleNamespace(distributed_type=DistributedType.FSDP, is_fsdp2=False))
    check_supported(types.SimpleNamespace(distributed_type=DistributedType.FSDP, is_fsdp2=True))
