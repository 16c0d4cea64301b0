"""The image path end to end (data.images): rows with images through the processor, sampling, the no-grad
passes, the training pass and the reward functions, on tiny Gemma 3 and LLaVA-NeXT models."""

from __future__ import annotations

import pytest
import standin_vlms
import torch

from rloo import RLOOConfig, RLOOTrainer


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=4, max_prompt_length=512, learning_rate=1e-3, beta=0.0, max_steps=1,
                  logging_steps=1, save_steps=0, seed=0, sampler="generate", report_to="none")
    return RLOOConfig(**{**values, **overrides})


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


@pytest.mark.parametrize("family", ["gemma3", "llava_next"])
def test_train_with_images_runs_and_rewards_get_them(tmp_path, family):
    seen = []

    def image_reward(completions, image, **kwargs):
        seen.extend(image)
        return [float(im.size[0] % 3) + len(c[0]["content"]) for c, im in zip(completions, image)]

    args = _config(tmp_path, beta=0.1)
    model = standin_vlms.model(family)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RLOOTrainer(model, image_reward, args=args, train_dataset=standin_vlms.image_dataset(4),
                          processing_class=standin_vlms.processor(family))
    trainer.train()
    assert len(seen) == 4 and all(hasattr(im, "size") for im in seen)  # 2 prompts x K=2, PIL images
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert any("language_model" in n for n in changed)
