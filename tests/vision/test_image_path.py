"""The image path end to end (data.images): rows with images through the processor, sampling, the no-grad
passes, the training pass and the reward functions, on tiny Gemma 3, Gemma 4 and LLaVA-NeXT models."""

from __future__ import annotations

import pytest
import standin_vlms
import torch

import rloo.update as update_module
from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.passes.logprobs import completion_logprobs


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=4, max_prompt_length=512, learning_rate=1e-3, beta=0.0, max_steps=1,
                  logging_steps=1, save_steps=0, seed=0, sampler="generate", report_to="none")
    return RLOOConfig(**{**values, **overrides})


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "llava_next"])
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


@pytest.mark.parametrize("family", ["gemma3", "llava_next"])
def test_a_model_id_loads_its_processor_and_image_text_class(tmp_path, family):
    """As TRL does for a VLM given by name: no processing_class -> the model's AutoProcessor, and the model loaded
    as an image-text-to-text model (AutoModelForCausalLM does not take LLaVA-NeXT's config)."""
    folder = tmp_path / "vlm"
    standin_vlms.model(family).save_pretrained(folder)
    standin_vlms.processor(family).save_pretrained(folder)
    trainer = RLOOTrainer(str(folder), _length_reward, args=_config(tmp_path),
                          train_dataset=standin_vlms.image_dataset(4))
    assert type(trainer.accelerator.unwrap_model(trainer.model)).__name__ == type(standin_vlms.model(family)).__name__
    assert trainer.collector.prompt_stage.image_column == "image"  # the image stage took the loaded processor
    trainer.train()


def _vision_tower(model):
    return next(module for name, module in model.named_modules() if name.endswith("vision_tower"))


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
def test_every_pass_runs_the_images_and_lora_leaves_the_vision_tower_frozen(tmp_path, family):
    """Sampling, pi_old, the reference (LoRA adapters disabled) and the training pass each run the vision tower, one
    call per pass: generate's prefill and the whole-row training pass on every row's image (2 prompts x K=2 rows),
    the no-grad passes on each prompt's once (the shared-prefix path, the sliding window applied by the mask).
    Gemma 4's projector is `embed_vision`."""
    from peft import LoraConfig

    model = standin_vlms.model(family)
    calls = []
    _vision_tower(model).register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((torch.is_grad_enabled(), (args or (kwargs["pixel_values"],))[0].shape[0])),
        with_kwargs=True)
    args = _config(tmp_path, beta=0.1, learning_rate=1e-2)
    trainer = RLOOTrainer(model, _length_reward, args=args, train_dataset=standin_vlms.image_dataset(4),
                          processing_class=standin_vlms.processor(family),
                          peft_config=LoraConfig(r=4, target_modules="all-linear"))
    lora = [name for name, _ in trainer.model.named_parameters() if "lora_" in name]
    assert lora and not [name for name in lora if "vision" in name or "multi_modal_projector" in name]
    assert all("language_model" in name for name in lora)
    trainer.train()
    # generate's prefill, pi_old, pi_ref: no grad; the training pass: with grad (LoRA's inputs need none,
    # but the pass runs under grad mode)
    assert calls == [(False, 4), (False, 2), (False, 2), (True, 4)], calls


def test_lora_keeps_off_gemma4s_vision_and_audio_towers_and_their_projectors():
    """Gemma 4 names its projectors `embed_vision` and `embed_audio` (the E2B and E4B checkpoints have an audio tower):
    with `target_modules="all-linear"` and no `exclude_modules`, only the language model gets adapters, while PEFT
    alone would put them on both projectors and the audio tower's linear maps too."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from rloo.data.images import language_model_only

    standin = standin_vlms._standin("gemma4")
    audio = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "subsampling_conv_channels": [8, 4],
             "output_proj_dims": 16}
    config = transformers.Gemma4Config(**{**standin.config, "audio_config": audio})

    def adapted(lora_config):
        model = get_peft_model(transformers.Gemma4ForConditionalGeneration(config), lora_config)
        return {name.split(".lora_")[0].removeprefix("base_model.model.model.") for name, _ in model.named_parameters()
                if "lora_" in name}

    user_config = LoraConfig(r=4, target_modules="all-linear")
    everywhere = adapted(user_config)
    assert {"embed_vision.embedding_projection", "embed_audio.embedding_projection"} <= everywhere
    assert any(name.startswith("audio_tower.") for name in everywhere)
    ours = adapted(language_model_only(user_config, transformers.Gemma4ForConditionalGeneration(config)))
    assert ours and all(name.startswith("language_model.") for name in ours), sorted(ours)
    assert user_config.exclude_modules is None  # the user's config is left as given


def _other_images(vision, seed):
    """The same VisionInputs with every prompt's pixel values taken from other random images."""
    import dataclasses

    fresh = [{**tensors, "pixel_values": torch.rand_like(tensors["pixel_values"], generator=torch.Generator().manual_seed(seed))}
             for tensors in vision.per_prompt]
    return dataclasses.replace(vision, per_prompt=fresh)


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "llava_next"])
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


@pytest.mark.parametrize(("overrides", "processing", "match"), [
    ({"sampler": "paged"}, "processor", "sampler='fast' or 'generate'"),
    ({}, "tokenizer", "not a multimodal processor"),
])
def test_unsupported_combinations_are_refused_by_name(tmp_path, overrides, processing, match):
    processor = standin_vlms.processor("gemma3")
    with pytest.raises(ConfigError, match=match):
        RLOOTrainer(standin_vlms.model("gemma3"), _length_reward, args=_config(tmp_path, **overrides),
                    train_dataset=standin_vlms.image_dataset(4),
                    processing_class=processor if processing == "processor" else processor.tokenizer)


def test_text_prompts_with_images_and_long_prompts_are_refused(tmp_path):
    from datasets import Dataset

    rows = Dataset.from_dict({"prompt": ["count the squares", "and these"], "image": standin_vlms.images(2)})
    trainer = RLOOTrainer(standin_vlms.model("gemma3"), _length_reward, args=_config(tmp_path), train_dataset=rows,
                          processing_class=standin_vlms.processor("gemma3"))
    with pytest.raises(ConfigError, match="must be conversational"):
        trainer.train()
    trainer = RLOOTrainer(standin_vlms.model("gemma3"), _length_reward, args=_config(tmp_path, max_prompt_length=8),
                          train_dataset=standin_vlms.image_dataset(2), processing_class=standin_vlms.processor("gemma3"))
    with pytest.raises(ConfigError, match="not truncated"):
        trainer.train()


def test_images_column_paths_and_placeholders(tmp_path):
    """`images` (a list per row) as file paths, with {"type": "image"} placeholders placed by the user."""
    from datasets import Dataset

    paths = []
    for index, image in enumerate(standin_vlms.images(4)):
        paths.append(str(tmp_path / f"{index}.png"))
        image.save(paths[-1])
    prompt = [{"role": "user", "content": [{"type": "text", "text": "left"}, {"type": "image"},
                                           {"type": "text", "text": "right"}, {"type": "image"}]}]
    rows = Dataset.from_dict({"prompt": [prompt, prompt], "images": [paths[:2], paths[2:]]})
    seen = []

    def reward(completions, images, **kwargs):
        seen.extend(images)
        return [1.0] * len(completions)

    trainer = RLOOTrainer(standin_vlms.model("llava_next"), reward, args=_config(tmp_path), train_dataset=rows,
                          processing_class=standin_vlms.processor("llava_next"))
    trainer.train()
    assert seen[0] == paths[:2] and len(seen) == 4  # rewards get the column as the dataset holds it, as in TRL
    assert trainer.collector.prompt_stage.encoder.encode([rows[0]])[1].num_images == [2]


@pytest.mark.parametrize("log_multimodal", [True, False])
def test_log_multimodal_writes_the_images_next_to_the_completions_and_the_report_shows_them(tmp_path, log_multimodal,
                                                                                             monkeypatch):
    import json

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rloo.run.report import build_report

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = _config(tmp_path, log_completions=True, log_multimodal=log_multimodal, num_completions_to_print=3,
                   report_to="tensorboard")
    trainer = RLOOTrainer(standin_vlms.model("gemma3"), _length_reward, args=args,
                          train_dataset=standin_vlms.image_dataset(4), processing_class=standin_vlms.processor("gemma3"))
    trainer.train()
    # TRL's buffer: each completion's prompt images, a list per completion (an `image` value wrapped), or nothing
    logged = trainer._logs["images"]
    assert (len(logged), [len(images) for images in logged][:1]) == ((4, [1]) if log_multimodal else (0, []))
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    page = build_report(run).read_text()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0}).Reload()
    # TensorBoard (no tables): each table row's images as image summaries, row r's under "completions/row<r>/image<i>"
    logged_to_tensorboard = {tag: [(e.width, e.height) for e in events.Images(tag)] for tag in events.Tags()["images"]}
    if not log_multimodal:
        assert logged_to_tensorboard == {}
        assert "image" not in rows[0] and "<img src=\"images/" not in page
        return
    assert len(rows) == 3 and rows[0]["image"] == rows[1]["image"] and rows[0]["image"] != rows[2]["image"]
    assert all((run / path).is_file() for row in rows for path in row["image"])
    assert page.count('<img src="images/') == 3
    assert logged_to_tensorboard == {f"completions/row{r}/image0": [Image.open(run / row["image"][0]).size]
                                     for r, row in enumerate(rows)}


def test_the_report_shows_only_its_own_image_files_as_images():
    from rloo.run.report import completions_html

    page = completions_html([{"step": 1, "prompt": "p", "completion": "c",
                              "image": ['x" onerror="alert(1)', "http://example.com/a.png"]}])
    assert "<img" not in page and "onerror=\"" not in page


def test_micro_batches_iterations_and_eval_carry_each_rows_image(tmp_path):
    """Micro-batches of 2 rows (one group each), two iterations (pi_old kept), and evaluate(): every forward of
    the vision tower gets as many images as its rows."""
    model = standin_vlms.model("llava_next")
    calls = []
    _vision_tower(model).register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(torch.is_grad_enabled()), with_kwargs=True)
    args = _config(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2, num_iterations=2,
                   max_steps=2)
    trainer = RLOOTrainer(model, _length_reward, args=args, train_dataset=standin_vlms.image_dataset(4),
                          eval_dataset=standin_vlms.image_dataset(2, seed=1),
                          processing_class=standin_vlms.processor("llava_next"))
    trainer.train()
    # generate (1 call), pi_old (2 micro-batches), then 2 steps x 2 micro-batches with grad; the final eval's generate
    assert calls.count(True) == 4 and calls[:3] == [False, False, False], calls
    before = len(calls)
    metrics = trainer.evaluate()
    assert "eval/reward" in metrics and len(calls) > before and not any(calls[before:])


def test_save_model_and_checkpoints_save_the_processor(tmp_path):
    """As TRL saves its processing_class: the processor (image processor and chat template too), not only its
    tokenizer, so that AutoProcessor loads the saved folder."""
    from transformers import AutoProcessor

    processor = standin_vlms.processor("llava")
    trainer = RLOOTrainer(standin_vlms.model("llava"), _length_reward, args=_config(tmp_path, save_steps=1),
                          train_dataset=standin_vlms.image_dataset(4), processing_class=processor)
    assert trainer.processing_class is processor
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    for folder in (tmp_path / "saved", tmp_path / "run" / "checkpoint-1"):
        loaded = AutoProcessor.from_pretrained(folder)
        assert type(loaded).__name__ == type(processor).__name__ and loaded.chat_template == processor.chat_template


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_a_run_with_images_resumes_exactly_from_its_full_weights(tmp_path, family):
    """save_pretrained writes a VLM's weights under the family's original names (LLaVA's `language_model.model.*`,
    Qwen2-VL's `visual.*`); resuming maps them back to the model's (`model_loading.saved_names`), so a run resumed
    at step 1 ends on the weights of one that was not stopped."""
    def trainer(folder, **overrides):
        torch.manual_seed(0)  # the same starting weights (the stand-in leaves some to torch's default init)
        return RLOOTrainer(standin_vlms.model(family), _length_reward,
                           args=_config(tmp_path / folder, max_steps=2, sampler="fast", **overrides),
                           train_dataset=standin_vlms.image_dataset(8), processing_class=standin_vlms.processor(family))

    straight = trainer("a", save_steps=1)
    straight.train()
    from safetensors.torch import load_file

    saved = set(load_file(str(tmp_path / "a" / "run" / "checkpoint-1" / "model.safetensors")))
    assert not saved <= set(straight.model.state_dict())  # the original names, not the model's
    resumed = trainer("b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "run" / "checkpoint-1"))
    assert resumed.global_step == 2
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
