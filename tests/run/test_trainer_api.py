"""The transformers Trainer API that TRL scripts use: callbacks, state, optimizers, TrainOutput,
model card and push_to_hub, IterableDataset, an eval dict, and a second trainer in one process."""

import pytest
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import TrainOutput

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer


def _config(tmp_path, name="run", **overrides):
    values = dict(output_dir=str(tmp_path / name), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, learning_rate=3e-3, beta=0.0, max_steps=3, logging_steps=1,
                  save_steps=0, seed=0)
    return RLOOConfig(**{**values, **overrides})


class Recorder(TrainerCallback):
    def __init__(self, stop_at=None):
        self.events, self.stop_at = [], stop_at

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("begin", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step", state.global_step, state.epoch))
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("log", state.global_step, "reward" in logs))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(("save", state.global_step))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.events.append(("evaluate", "eval/reward" in metrics, state.global_step))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.events.append(("end", state.global_step, model is not None))


def test_callbacks_state_and_train_output(tmp_path, make_model, tokenizer, digit_dataset):
    recorder = Recorder()
    args = _config(tmp_path, save_steps=2)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer, eval_dataset=digit_dataset.select(range(4)), callbacks=[recorder])
    out = trainer.train()
    kinds = [e[0] for e in recorder.events]
    assert kinds[0] == "begin" and kinds[-1] == "end" and recorder.events[-1] == ("end", 3, True)
    assert [e[1] for e in recorder.events if e[0] == "step"] == [1, 2, 3]
    # 8 completions of 4 prompts per step over 64 prompts: epoch 2/64 after step 1.
    assert [e[2] for e in recorder.events if e[0] == "step"][0] == pytest.approx(2 / 64)
    # eval_steps is unset: one evaluation, at the end, with the eval metrics.
    assert ("save", 2) in recorder.events
    assert [e for e in recorder.events if e[0] == "evaluate"] == [("evaluate", True, 3)]
    assert isinstance(out, TrainOutput) and out.global_step == 3 and out["reward"] == out.metrics["reward"]
    history = trainer.state.log_history
    # the last step's figures move into transformers' closing entry, after the final eval
    assert [h["step"] for h in history if "reward" in h] == [1, 2, 3] and "eval/reward" in history[-2]
    # transformers' closing entry comes last, and train() returns its figures too.
    closing = history[-1]
    assert set(closing) >= {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "epoch"}
    assert closing["step"] == 3 and closing["train_loss"] == out.training_loss == out["train_loss"]
    assert closing["train_steps_per_second"] == pytest.approx(3 / closing["train_runtime"], rel=1e-2, abs=1e-3)
    assert out.training_loss == pytest.approx(
        sum(h["loss/policy_avg"] for h in history if "loss/policy_avg" in h) / 3)


def test_callback_can_stop_training(tmp_path, make_model, tokenizer, digit_dataset):
    recorder = Recorder(stop_at=2)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=5),
                          train_dataset=digit_dataset, processing_class=tokenizer, callbacks=[recorder])
    assert trainer.train().global_step == 2


def test_given_optimizer_and_scheduler_are_used(tmp_path, make_model, tokenizer, digit_dataset):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    trainer = RLOOTrainer(model, digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer, optimizers=(optimizer, scheduler))
    trainer.train()
    assert trainer.optimizer.optimizer is optimizer
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 / 4)  # three scheduler steps
    # The rate each step used: 0.5, then 0.5 / 2 and 0.5 / 3.
    assert [h["lr"] for h in trainer.state.log_history if "lr" in h] == pytest.approx([0.5, 0.25, 0.5 / 3])


def test_model_card_written_and_push_fails_offline_with_advice(tmp_path, make_model, tokenizer, digit_dataset,
                                                               monkeypatch):
    args = _config(tmp_path, max_steps=1, hub_model_id="me/tiny-rloo", push_to_hub=True)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    card = (tmp_path / "run" / "README.md").read_text()
    assert card.startswith("---") and "rloo" in card and "arxiv.org/abs/2402.14740" in card
    assert "pypi.org" not in card  # rloo is not published there: the card links no page that does not exist
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE.*me/tiny-rloo"):
        trainer.push_to_hub(dataset_name="digits")
    assert "- digits" in (tmp_path / "run" / "README.md").read_text()  # the card is written either way


def test_iterable_dataset_needs_and_uses_max_steps(tmp_path, make_model, tokenizer, digit_dataset):
    stream = digit_dataset.to_iterable_dataset()
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=2),
                          train_dataset=stream, processing_class=tokenizer)
    assert len(trainer.train_dataset) == 4 and trainer.train().global_step == 2  # 2 steps * 2 prompts read
    with pytest.raises(ValueError, match="max_steps"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=-1),
                    train_dataset=stream, processing_class=tokenizer)


def test_eval_dict_prefixes_metrics_per_name(tmp_path, make_model, tokenizer, digit_dataset):
    evals = {"easy": digit_dataset.select(range(4)), "hard": digit_dataset.select(range(4, 12))}
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=1),
                          train_dataset=digit_dataset, eval_dataset=evals, processing_class=tokenizer)
    metrics = trainer.train()
    assert "eval_easy/reward" in metrics and "eval_hard/reward" in metrics
    assert {"eval_easy/reward", "eval_hard/reward"} <= set(trainer.evaluate())
    assert not any(key.startswith("eval/") for key in trainer.evaluate())


def test_second_trainer_in_one_process_with_other_precision(tmp_path, make_model, tokenizer, digit_dataset):
    first = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, "a", max_steps=1),
                        train_dataset=digit_dataset, processing_class=tokenizer)
    first.train()
    second = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, "b", max_steps=1, bf16=True),
                         train_dataset=digit_dataset, processing_class=tokenizer)
    assert second.accelerator.mixed_precision == "bf16"
    assert second.train().global_step == 1
    third = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, "c", max_steps=1),
                        train_dataset=digit_dataset, processing_class=tokenizer)
    assert third.accelerator.mixed_precision == "no"
