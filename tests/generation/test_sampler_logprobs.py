"""The samplers' per-token log-probs equal the training pass's, so the trainer can skip a forward."""

import pytest
import torch

from rloo.generation import FastSampler
from rloo.passes.logprobs import completion_logprobs


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 0), (1.3, 5)])
def test_fast_sampler_logprobs_match_the_training_pass(make_model, tokenizer, temperature, top_k):
    model = make_model()
    sampler = FastSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=12, temperature=temperature, top_k=top_k)
    prompts = [tokenizer("12+3=", add_special_tokens=False)["input_ids"],
               tokenizer("7+45=", add_special_tokens=False)["input_ids"][:3]]
    torch.manual_seed(0)
    sampled = sampler.sample(model, prompts, 3)
    assert sampled.logprobs is not None and sampled.logprobs.shape == sampled.completion_ids.shape
    input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)
    mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
    with torch.no_grad():
        # The trainer's log-probs use the unfiltered distribution at the same temperature (top-k ignored).
        want, _ = completion_logprobs(model, input_ids, mask, sampled.completion_ids.shape[1], temperature)
    real = sampled.completion_mask.bool()
    torch.testing.assert_close(sampled.logprobs[real], want[real], atol=1e-5, rtol=0)
    assert (sampled.logprobs[~real] == 0).all()
    assert (want[real] < 0).all()  # real log-probs, not a vacuous zero == zero


def test_rollout_uses_sampler_logprobs_as_old_logprobs(tmp_path, make_model, tokenizer, digit_dataset):
    from rloo import RLOOConfig, RLOOTrainer

    args = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, beta=0.1,
                      max_completion_length=6, kl_penalty="loss", save_steps=0, report_to="none", temperature=0.8)
    trainer = RLOOTrainer(make_model(), lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=digit_dataset, processing_class=tokenizer)
    collector = trainer.collector if hasattr(trainer, "collector") else next(
        v for v in vars(trainer).values() if type(v).__name__ == "RolloutCollector")
    sampled = collector.sample([digit_dataset[i]["prompt"] for i in range(2)])
    old = collector.trusted_sampler_logprobs(sampled)
    assert old is sampled.logprobs or torch.equal(old, sampled.logprobs)
    with torch.no_grad():
        want = collector.logprobs(trainer.model, sampled)  # the no-grad policy pass it replaces
    mask = sampled.completion_mask.bool()
    torch.testing.assert_close(old[mask], want[mask], atol=1e-5, rtol=0)
