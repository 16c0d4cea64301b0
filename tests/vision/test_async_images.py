"""Images with async_rollouts: the sampler (a forked process on CPU, or a thread) encodes each row's images itself and
sends them back with the rollout; the learner's training pass must see the very images the sampler sampled from."""

from __future__ import annotations

import functools
import json

import pytest
import standin_vlms
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.passes.logprobs import completion_logprobs
from rloo.rollout.async_rollouts import AsyncRollouts


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def _logprobs(model, mini_batch, vision, temperature):
    input_ids = torch.cat([mini_batch.prompt_ids, mini_batch.completion_ids], dim=1)
    attention_mask = torch.cat([mini_batch.prompt_mask, mini_batch.completion_mask], dim=1)
    with torch.no_grad():
        logps, _ = completion_logprobs(model, input_ids, attention_mask, mini_batch.completion_ids.shape[1], temperature,
                                       model_inputs=vision.model_kwargs(input_ids))
    return logps


@pytest.mark.parametrize("worker", ["process", "thread"])
@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_async_rollouts_carry_the_sampled_images_to_the_training_pass(tmp_path, family, worker, monkeypatch):
    """Rollout 0 is sampled from the weights the first step starts from, so the sampler's log-probs (pi_old, computed
    in the worker with the images it encoded) equal the policy's log-probs recomputed here from the rollout's images;
    with the images of other rows they do not (the check can fail). Three steps train, one rollout behind."""
    monkeypatch.setattr("rloo.rollout.async_rollouts.AsyncRollouts", functools.partial(AsyncRollouts, worker=worker))
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, max_prompt_length=512, learning_rate=1e-3, beta=0.0, max_steps=3,
                      logging_steps=1, save_steps=0, seed=0, report_to="none", async_rollouts=True)
    trainer = RLOOTrainer(standin_vlms.model(family), _length_reward, args=args,
                          train_dataset=standin_vlms.image_dataset(8), processing_class=standin_vlms.processor(family))
    first = {}
    original_step = trainer.learner.step

    def step(mini_batch):
        if not first:
            vision = mini_batch.vision
            swapped = vision.select([2, 3, 0, 1])  # each completion with the other prompt's image
            first.update(old=mini_batch.old_logps, mask=mini_batch.completion_mask.bool(),
                         same=_logprobs(trainer.model, mini_batch, vision, args.temperature),
                         other=_logprobs(trainer.model, mini_batch, swapped, args.temperature))
        return original_step(mini_batch)

    trainer.learner.step = step
    trainer.train()
    mask = first["mask"]
    assert first["old"] is not None and mask.any()
    assert (first["old"] - first["same"]).abs()[mask].max() < 1e-4
    assert (first["old"] - first["other"]).abs()[mask].max() > 1e-3
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["async/staleness"] for line in lines if "async/staleness" in line] == [0, 1, 1]
