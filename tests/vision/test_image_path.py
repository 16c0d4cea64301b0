"""The image path end to end (data.images): rows with images through the processor, sampling, the no-grad
passes, the training pass and the reward functions, on tiny Gemma 3 and LLaVA-NeXT models."""

from __future__ import annotations

import pytest
import standin_vlms
import torch

import rloo.update as update_module
from rloo import RLOOConfig, RLOOTrainer
from rloo.algo.logprobs import completion_logprobs


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


def _vision_tower(model):
    return next(module for name, module in model.named_modules() if name.endswith("vision_tower"))


def test_every_pass_runs_the_images_and_lora_leaves_the_vision_tower_frozen(tmp_path):
    """Sampling, pi_old, the reference (LoRA adapters disabled) and the training pass each run the vision tower
    on every row's image: 2 prompts x K=2 rows, one call per pass."""
    from peft import LoraConfig

    model = standin_vlms.model("gemma3")
    calls = []
    _vision_tower(model).register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((torch.is_grad_enabled(), (args or (kwargs["pixel_values"],))[0].shape[0])),
        with_kwargs=True)
    args = _config(tmp_path, beta=0.1, learning_rate=1e-2)
    trainer = RLOOTrainer(model, _length_reward, args=args, train_dataset=standin_vlms.image_dataset(4),
                          processing_class=standin_vlms.processor("gemma3"),
                          peft_config=LoraConfig(r=4, target_modules="all-linear"))
    lora = [name for name, _ in trainer.model.named_parameters() if "lora_" in name]
    assert lora and not [name for name in lora if "vision" in name or "multi_modal_projector" in name]
    assert any("language_model" in name for name in lora)
    trainer.train()
    # generate's prefill, pi_old, pi_ref: no grad; the training pass: with grad (LoRA's inputs need none,
    # but the pass runs under grad mode)
    assert calls == [(False, 4), (False, 4), (False, 4), (True, 4)], calls


def _other_images(vision, seed):
    """The same VisionInputs with every prompt's pixel values taken from other random images."""
    import dataclasses

    fresh = [{**tensors, "pixel_values": torch.rand_like(tensors["pixel_values"], generator=torch.Generator().manual_seed(seed))}
             for tensors in vision.per_prompt]
    return dataclasses.replace(vision, per_prompt=fresh)


@pytest.mark.parametrize("family", ["gemma3", "llava_next"])
def test_the_image_changes_the_logprobs_of_the_no_grad_and_training_passes(tmp_path, family, monkeypatch):
    trainer = RLOOTrainer(standin_vlms.model(family), _length_reward, args=_config(tmp_path, beta=0.1),
                          train_dataset=standin_vlms.image_dataset(4), processing_class=standin_vlms.processor(family))
    collector, model = trainer.collector, trainer.accelerator.unwrap_model(trainer.model)
    rollout, _ = collector.collect([trainer.train_dataset[i] for i in range(2)])
    assert rollout.vision is not None and rollout.vision.rows == [0, 0, 1, 1]

    import dataclasses

    sampled = dataclasses.make_dataclass("Sampled", ["prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                                                     "vision"])
    as_sampled = sampled(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
                         rollout.vision)
    same = collector.logprobs(model, as_sampled)
    assert torch.allclose(same, collector.logprobs(model, as_sampled))  # deterministic
    as_sampled.vision = _other_images(rollout.vision, 1)
    other = collector.logprobs(model, as_sampled)
    mask = rollout.completion_mask.bool()
    assert not torch.allclose(same[mask], other[mask])

    assert (same[mask] - other[mask]).abs().max() > 1e-3

    # The training pass (update.Learner): the log-probs it computes move with the image too.
    seen = []

    def recording(*args, **kwargs):
        logps, entropy = completion_logprobs(*args, **kwargs)
        seen.append(logps.detach()[micro.completion_mask.bool()])
        return logps, entropy

    micro = rollout.micro_batch(0, 4)
    monkeypatch.setattr(update_module, "completion_logprobs", recording)
    trainer.learner.micro_batch_loss(micro)
    trainer.learner.micro_batch_loss(micro)
    micro.vision = _other_images(micro.vision, 2)
    trainer.learner.micro_batch_loss(micro)
    assert torch.allclose(seen[0], seen[1]) and (seen[0] - seen[2]).abs().max() > 1e-3
