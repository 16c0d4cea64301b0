"""Resuming checks the checkpoint against the run: another algorithm or model size is refused by name,
another length is warned about, and the resume itself is announced."""

import logging

import pytest
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.config_checks import ConfigError
from rloo.run.checkpoint import CheckpointError


def _reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _trainer(tmp_path, model, tokenizer, **overrides):
    args = RLOOConfig(**{**dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                                max_completion_length=3, max_steps=2, save_steps=1, report_to="none", beta=0.0),
                         **overrides})
    dataset = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
    return RLOOTrainer(model, _reward, args=args, train_dataset=dataset, processing_class=tokenizer)


@pytest.fixture
def saved_run(tmp_path, make_model, tokenizer):
    _trainer(tmp_path, make_model(), tokenizer, max_steps=1).train()
    return tmp_path / "run" / "checkpoint-1"


def test_a_changed_algorithm_is_refused(tmp_path, make_model, tokenizer, saved_run):
    resumed = _trainer(tmp_path, make_model(), tokenizer, num_generations=4)  # same completions per step
    with pytest.raises(ConfigError, match=r"changed algorithm \(num_generations: 2 -> 4\)"):
        resumed.train(resume_from_checkpoint=str(saved_run))
    resumed = _trainer(tmp_path, make_model(), tokenizer, advantage_estimator="grpo")
    with pytest.raises(ConfigError, match=r"advantage_estimator: 'rloo' -> 'grpo'"):
        resumed.train(resume_from_checkpoint=str(saved_run))


def test_a_changed_length_is_warned_and_the_resume_announced(tmp_path, make_model, tokenizer, saved_run, caplog,
                                                            capsys):
    resumed = _trainer(tmp_path, make_model(), tokenizer, max_steps=2)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint="latest")
    assert "changed run length (max_steps: 1 -> 2)" in caplog.text and "schedule is rebuilt" in caplog.text
    assert "resuming from checkpoint-1 (step 1 of 2)" in capsys.readouterr().out
    assert resumed.global_step == 2


def test_a_model_of_another_size_is_named(tmp_path, make_model, tokenizer, saved_run):
    resumed = _trainer(tmp_path, make_model(hidden_size=48), tokenizer)
    with pytest.raises(CheckpointError, match=r"checkpoint-1: the saved weights have other shapes .* another size"):
        resumed.train(resume_from_checkpoint=str(saved_run))


def test_removed_weights_are_named(tmp_path, make_model, tokenizer, saved_run):
    (saved_run / "model.safetensors").unlink()
    resumed = _trainer(tmp_path, make_model(), tokenizer)
    with pytest.raises(CheckpointError, match=r"checkpoint-1 is damaged: model.safetensors is missing"):
        resumed.train(resume_from_checkpoint=str(saved_run))


def test_an_output_dir_that_cannot_be_created_is_refused_before_loading(tmp_path, tokenizer):
    (tmp_path / "a_file").write_text("x")
    args = RLOOConfig(output_dir=str(tmp_path / "a_file" / "run"), report_to="none")
    with pytest.raises(ConfigError, match=r"cannot be created: .*a_file' is a file, not a directory"):
        RLOOTrainer(str(tmp_path / "never" / "loaded"), _reward, args=args,
                    train_dataset=Dataset.from_list([{"prompt": "1+1="}]), processing_class=tokenizer)


def test_a_failed_checkpoint_write_names_output_dir(tmp_path, make_model, tokenizer, monkeypatch):
    import rloo.run.checkpoint

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rloo.run.checkpoint, "_write_synced", full_disk)
    trainer = _trainer(tmp_path, make_model(), tokenizer, max_steps=1)
    with pytest.raises(CheckpointError, match=r"could not write checkpoint-1 into output_dir=.*run'.*No space left"):
        trainer.train()
