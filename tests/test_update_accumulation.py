"""accelerate knows where an optimizer step ends: sync_gradients is False on all but the last
micro-batch, the optimizer steps once, and accelerate's own division by the number of
micro-batches does not change the gradient (our denominator covers the whole step)."""

import torch

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo import update as update_module


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, gradient_accumulation_steps=4,
                  num_generations=4, max_completion_length=4, beta=0.0, max_steps=1, logging_steps=1, save_steps=0,
                  seed=0, max_grad_norm=0.0)
    return RLOOConfig(**{**values, **overrides})


def test_sync_gradients_only_on_the_last_micro_batch_and_one_optimizer_step(tmp_path, make_model, tokenizer,
                                                                            digit_dataset, monkeypatch):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    assert trainer.accelerator.gradient_accumulation_steps == 4
    pattern, real = [], update_module.Learner.micro_batch_loss

    def recording(self, micro):
        pattern.append(self.accelerator.sync_gradients)
        return real(self, micro)

    monkeypatch.setattr(update_module.Learner, "micro_batch_loss", recording)
    steps = []
    optimizer_step = trainer.learner.optimizer.step
    monkeypatch.setattr(trainer.learner.optimizer, "step", lambda *a, **k: (steps.append(1), optimizer_step(*a, **k)))
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    trainer.learner.step(rollout)
    assert pattern == [False, False, False, True] and len(steps) == 1
    assert trainer.accelerator.sync_gradients  # left True for whatever runs next


def test_accumulated_gradient_equals_one_backward_of_the_whole_step(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, loss_agg_mode="token-mean"),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    rollout.advantages = torch.linspace(-1.0, 1.0, rollout.advantages.numel())
    trainer.learner.accumulate_gradients(rollout)
    accumulated = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.model.zero_grad(set_to_none=True)
    # By hand: the token-mean loss of all 8 completions, one plain backward.
    learner = trainer.learner
    numerators, _ = learner.micro_batch_loss(rollout)
    (numerators.sum() / rollout.loss_mask().sum()).backward()
    for accumulated_grad, p in zip(accumulated, trainer.model.parameters()):
        torch.testing.assert_close(accumulated_grad, p.grad, rtol=1e-5, atol=1e-7)
