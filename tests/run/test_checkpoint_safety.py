"""Checkpoints in process: what they hold, which one `latest` picks, rotation, damage, output_dir reuse,
non-finite guards and strict JSON history."""

import json
import logging
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.run.checkpoint import CheckpointError, save_checkpoint
from rloo.run.run_lock import LOCK_NAME


def _config(path, **overrides):
    values = dict(output_dir=str(path), per_device_train_batch_size=8, num_generations=4, max_completion_length=5,
                  learning_rate=3e-3, beta=0.1, max_steps=2, logging_steps=1, save_steps=1, seed=0)
    return RLOOConfig(**{**values, **overrides})


def _trainer(make_model, tokenizer, dataset, args, **kwargs):
    return RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer,
                       **kwargs)


def test_a_checkpoint_holds_the_policy_once_and_loads_with_from_pretrained(tmp_path, make_model, tokenizer,
                                                                             digit_dataset):
    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run"))
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    weight_files = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*")
                          if p.suffix in (".safetensors", ".bin") and "optimizer" not in p.name
                          and "scheduler" not in p.name)
    assert weight_files == ["model.safetensors"]  # not accelerate's copy, not the frozen reference
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint)
    for (name, a), b in zip(trainer.model.named_parameters(), loaded.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert not list((tmp_path / "run").glob(".checkpoint-*"))  # no temporary directory left


def test_lora_checkpoint_holds_adapters_only_and_resumes_exactly(tmp_path, make_model, tokenizer, digit_dataset):
    peft = pytest.importorskip("peft")
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    straight = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "a", max_steps=3),
                        peft_config=peft.LoraConfig(**lora))
    straight.train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").exists() and not (checkpoint / "model.safetensors").exists()
    assert not list((checkpoint / "accelerate_state").glob("model*"))
    resumed = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "b", max_steps=3),
                       peft_config=peft.LoraConfig(**lora))
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)


def test_latest_skips_incomplete_checkpoints_and_rotation_ignores_foreign_folders(tmp_path, make_model, tokenizer,
                                                                                   digit_dataset, caplog):
    run = tmp_path / "run"
    _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=2)).train()
    (run / "checkpoint-best").mkdir()  # a user's folder
    (run / "checkpoint-9").mkdir()  # a save killed before this format's atomic rename existed
    shutil.copytree(run / "checkpoint-2", run / ".checkpoint-3.tmp")  # a save killed before its rename
    resumed = _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=4, save_total_limit=1))
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint="latest")
    assert "Skipping" in caplog.text and "checkpoint-9" in caplog.text
    assert resumed.global_step == 4
    names = sorted(p.name for p in run.iterdir() if "checkpoint" in p.name)
    assert names == ["checkpoint-4", "checkpoint-9", "checkpoint-best"]  # the temporary directory was replaced


def test_latest_with_no_checkpoint_starts_fresh(tmp_path, make_model, tokenizer, digit_dataset, caplog):
    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run", save_steps=0, max_steps=1))
    with caplog.at_level(logging.WARNING):
        trainer.train(resume_from_checkpoint="latest")
    assert "starting a fresh run" in caplog.text and trainer.global_step == 1


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_damaged_random_state_file_fails_loudly(tmp_path, make_model, tokenizer, digit_dataset, damage):
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run", max_steps=1)).train()
    rng = next((tmp_path / "run" / "checkpoint-1" / "accelerate_state").glob("random_states*"))
    rng.unlink() if damage == "missing" else rng.write_bytes(rng.read_bytes()[:20])
    resumed = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "b"))
    with pytest.raises(CheckpointError, match="damaged.*random_states" if damage == "missing" else "damaged"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))


def test_a_changed_learning_rate_on_resume_is_refused(tmp_path, make_model, tokenizer, digit_dataset):
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run", max_steps=1)).train()
    resumed = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run", learning_rate=1e-2))
    with pytest.raises(ConfigError, match="learning_rate: 0.003 -> 0.01"):
        resumed.train(resume_from_checkpoint="latest")


def test_a_used_output_dir_is_refused_unless_resuming_or_overwriting(tmp_path, make_model, tokenizer, digit_dataset):
    run = tmp_path / "run"
    _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=1)).train()
    # the run's files (the lock file names whichever trainer of this process holds the folder now)
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name != LOCK_NAME}
    refused = _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=1))  # the trainer cannot know yet
    with pytest.raises(ConfigError, match="holds another run's files.*overwrite_output_dir"):
        refused.train()
    assert {path: path.read_bytes() for path in run.rglob("*")
            if path.is_file() and path.name != LOCK_NAME} == before  # nothing written
    again = _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=1, overwrite_output_dir=True))
    again.train()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    with pytest.raises(ConfigError, match="output_dir must be a non-empty"):
        _config("")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        _config(tmp_path / "file")


def test_a_non_finite_step_is_skipped_or_stops_the_run(tmp_path, make_model, tokenizer, digit_dataset, caplog):
    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run", max_steps=1, save_steps=0))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    param = next(trainer.model.parameters())
    handle = param.register_hook(lambda grad: grad * float("nan"))
    with caplog.at_level(logging.WARNING):
        metrics = trainer.train()
    assert "non-finite optimizer step" in caplog.text and metrics["train/nonfinite_skipped"] == 1.0
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p, before[name], rtol=0, atol=0, msg=name)
    stopping = _trainer(make_model, tokenizer, digit_dataset,
                        _config(tmp_path / "stop", max_steps=1, save_steps=0, nan_policy="stop"))
    next(stopping.model.parameters()).register_hook(lambda grad: grad * float("nan"))
    with pytest.raises(FloatingPointError, match='nan_policy="stop"'):
        stopping.train()
    handle.remove()


def test_no_checkpoint_is_written_with_non_finite_weights(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run"))
    with torch.no_grad():
        next(trainer.model.parameters())[0] = float("inf")
    with pytest.raises(CheckpointError, match="NaN or inf"):
        save_checkpoint(trainer.accelerator, trainer.model, tokenizer, trainer.args, 1, 0, 8, trainer.run_id)
    assert not list((tmp_path / "run").glob("*checkpoint*"))


def test_metrics_are_strict_json_with_null_for_non_finite(tmp_path, make_model, tokenizer, digit_dataset, capsys):
    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "run", save_steps=0))
    trainer.logger.log({"a": float("nan"), "b": float("inf"), "c": 1.5}, step=3)
    line = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1]
    assert json.loads(line, parse_constant=lambda token: pytest.fail(token)) == {"step": 3, "a": None, "b": None,
                                                                                 "c": 1.5}
    assert "written as null: a=nan, b=inf" in capsys.readouterr().out


def test_a_second_signal_exits_at_once(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = ("import os, signal, time\n"
              "from rloo.run.run_dir import StopSignals\n"
              "with StopSignals() as stop:\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(0.1)\n"
              "    assert stop.received == 'SIGTERM'\n"
              "    print('first handled', flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(5)\n"
              "print('not reached')\n")
    src = str(Path(__file__).resolve().parents[2] / "src")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 128 + 2, result.stderr
    assert "first handled" in result.stdout and "not reached" not in result.stdout
    assert "second signal (SIGINT): exiting now" in result.stderr


# ------------------------------------------------------------------ exact resume means exact


def _tamper(checkpoint, damage):
    """Damage one file of a checkpoint AND rewrite its manifest to match, as a save that never wrote the
    file (or a foreign tool) would leave it: only the loading itself can then notice."""
    from rloo.run.checkpoint import TRAINER_STATE, _manifest

    state_dir = checkpoint / "accelerate_state"
    rng = state_dir / "random_states_0.pkl"
    if damage == "rng missing":
        rng.unlink()
    elif damage == "rng garbage":
        rng.write_bytes(b"\x80\x04not a pickle at all")
    elif damage == "rng wrong content":
        torch.save({"step": 0}, rng)
    elif damage == "optimizer missing":
        (state_dir / "optimizer.bin").unlink()
    elif damage == "weights garbage":
        (checkpoint / "model.safetensors").write_bytes(b"garbage")
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    state["manifest"] = _manifest(checkpoint)
    state["manifest"].pop(TRAINER_STATE, None)
    (checkpoint / TRAINER_STATE).write_text(json.dumps(state))


@pytest.mark.parametrize("damage, named", [
    ("rng missing", r"accelerate_state/random_states_0\.pkl is missing"),
    ("rng garbage", r"accelerate_state/random_states_0\.pkl is unreadable"),
    ("rng wrong content", r"accelerate_state/random_states_0\.pkl is unreadable \(KeyError"),
    ("optimizer missing", r"optimizer\.bin"),
    ("weights garbage", r"model\.safetensors is unreadable"),
])
def test_a_checkpoint_file_that_cannot_be_restored_is_an_error_naming_it_and_the_previous_checkpoint(
        tmp_path, make_model, tokenizer, digit_dataset, damage, named):
    run = tmp_path / "run"
    _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=2)).train()
    _tamper(run / "checkpoint-2", damage)
    resumed = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "b", max_steps=3))
    with pytest.raises(CheckpointError, match=named) as error:
        resumed.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert f"--resume_from_checkpoint {run / 'checkpoint-1'}" in str(error.value)
    assert "resuming would not be exact" in str(error.value) or "rng" not in damage


def test_with_no_earlier_checkpoint_the_fix_is_a_new_run(tmp_path, make_model, tokenizer, digit_dataset):
    run = tmp_path / "run"
    _trainer(make_model, tokenizer, digit_dataset, _config(run, max_steps=1)).train()
    (run / "checkpoint-1" / "accelerate_state" / "random_states_0.pkl").unlink()  # the manifest catches this one
    resumed = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "b"))
    with pytest.raises(CheckpointError, match="random_states_0.pkl is missing.*holds no earlier complete checkpoint"):
        resumed.train(resume_from_checkpoint=str(run / "checkpoint-1"))
