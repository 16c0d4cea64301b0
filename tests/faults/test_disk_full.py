"""A full disk during a checkpoint (issue #48): torch.save reports it as a RuntimeError without the errno; the
run stops with a CheckpointError naming the errno and output_dir, and no checkpoint-<n> is half-written."""

import errno
import os

import pytest
import torch
from datasets import Dataset

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.run import checkpoint
from rloo.run.checkpoint import CheckpointError, complete_checkpoints, save_checkpoint


def test_a_full_disk_in_torch_save_names_the_errno_and_the_folder(tmp_path, make_model, tokenizer, monkeypatch):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, max_steps=1, save_steps=1, report_to="none")
    dataset = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer)
    save_checkpoint(trainer.accelerator, trainer.model, tokenizer, args, 2, 0, 8, trainer.run_id)

    def full(*a, **k):  # what torch.save's zip writer raises when a write comes up short
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trainer.accelerator, "save_state", full)
    monkeypatch.setattr(checkpoint.os, "fsync", no_space)  # the probe write fails as the disk is full
    with pytest.raises(CheckpointError, match=r"could not write checkpoint-4 into output_dir=.*run'.*"
                                              r"\[Errno 28\] No space left on device.*the previous checkpoint is intact"):
        save_checkpoint(trainer.accelerator, trainer.model, tokenizer, args, 4, 1, 16, trainer.run_id)
    monkeypatch.undo()
    assert [p.name for p in complete_checkpoints(tmp_path / "run")] == ["checkpoint-2"]
    assert not (tmp_path / "run" / "checkpoint-4").exists()
    assert not (tmp_path / "run" / ".rloo-write-probe").exists()


def test_other_runtime_errors_in_a_save_are_not_relabelled(tmp_path, make_model, tokenizer, monkeypatch):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, max_steps=1, save_steps=1, report_to="none")
    dataset = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer)
    monkeypatch.setattr(trainer.accelerator, "save_state", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError, match="^bug$"):
        save_checkpoint(trainer.accelerator, trainer.model, tokenizer, args, 1, 0, 8, trainer.run_id)
    assert torch.is_grad_enabled()
