"""The training pass computes its log-probs under the precision the no-grad passes use.

accelerate puts only the model's forward under autocast; rloo's tiled LM head runs after it. Under bf16 the
reference's log-probs (a no-grad pass, in the collector's autocast) and the training pass's must come from the
same bf16 products, or the KL to an identical reference is not zero at the first step (kl_penalty="loss" keeps
the reference's log-probs for the training pass; the old log-probs of num_iterations > 1 are made the same way).
"""

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo import update as update_module


def test_training_logprobs_match_the_reference_pass_under_bf16(tmp_path, make_model, tokenizer, digit_dataset,
                                                                monkeypatch):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=6, beta=0.05, kl_penalty="loss", max_steps=1, logging_steps=1,
                      save_steps=0, seed=0, bf16=True, use_cpu=True)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    assert trainer.accelerator.mixed_precision == "bf16"
    seen, real = [], update_module.Learner.policy_loss

    def recording(self, logps, old_logps, micro, mask):
        seen.append((logps.detach(), micro.ref_logps, mask))
        return real(self, logps, old_logps, micro, mask)

    monkeypatch.setattr(update_module.Learner, "policy_loss", recording)
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    trainer.learner.accumulate_gradients(rollout)
    assert len(seen) == 2
    for logps, ref_logps, mask in seen:
        # The reference is the initial policy: the same function, so the same values up to summation order.
        gap = ((logps - ref_logps).abs() * mask).max().item()
        assert gap < 1e-5, gap  # 0 here; 1.1e-3 with the head's products in fp32 in the training pass only
