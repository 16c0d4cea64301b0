"""Dynamic sampling with images in the prompts: the refill rounds encode their own prompts' images, and the kept groups
of several rounds concatenate with their vision inputs row for row (`data.images.VisionInputs.concat`), so the
kept rollout's pi_old, pi_ref, training pass and completions log each see a row's own prompt's images."""

from __future__ import annotations

import dataclasses
import json

import pytest
import standin_vlms
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.data.images import VisionInputs, save_images
from rloo.passes.logprobs import completion_logprobs

K = 2


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=6, num_generations=K,
                  max_completion_length=4, max_prompt_length=512, learning_rate=1e-3, beta=0.0, max_steps=1,
                  logging_steps=1, save_steps=0, seed=0, report_to="none", dynamic_sampling=True,
                  dynamic_sampling_max_rounds=6)
    return RLOOConfig(**{**values, **overrides})


def _half_constant(completions, answer, **kwargs):
    """Rows with an even index get 1.0 for every completion (zero spread: the group is dropped); the others 0, 1 in
    each group of K=2 (always informative)."""
    return [1.0 if int(a) % 2 == 0 else float(j % K) for j, a in enumerate(answer)]


def _index(prompt) -> int:
    """The dataset row of a prompt of `standin_vlms.image_dataset` ("How many squares? <i>")."""
    return int(prompt[0]["content"].split()[-1])


def _whole_row_logprobs(model, rollout, vision, temperature):
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    with torch.no_grad():
        logps, _ = completion_logprobs(model, ids, torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1),
                                       rollout.completion_ids.shape[1], temperature,
                                       model_inputs=vision.model_kwargs(ids))
    return logps


def _other_pixels(vision: VisionInputs) -> VisionInputs:
    """The same rows with every prompt's pixel values replaced by random ones of the same shape (another image)."""
    fresh = [{**tensors, "pixel_values": torch.rand_like(tensors["pixel_values"], generator=torch.Generator().manual_seed(3))}
             for tensors in vision.per_prompt]
    return dataclasses.replace(vision, per_prompt=fresh)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_kept_rows_of_several_rounds_carry_their_own_prompts_images(tmp_path, family):
    """Round 0 holds rows 0, 1, 2 (0 and 2 zero-spread, dropped); the refill rounds add odd rows. Every kept row's
    prompt ids and vision tensors are those of its prompt encoded alone; its pi_old (a no-grad pass, num_iterations=2)
    and pi_ref (kl_penalty="loss" keeps them) equal the log-probs recomputed from the row's own images within 1e-5,
    and differ with other images."""
    args = _config(tmp_path, num_iterations=2, beta=0.1, kl_penalty="loss", kl_estimator="k3", seed=3,  # refills: 5, 3
                   log_completions=True, log_multimodal=True, num_completions_to_print=2)
    dataset = standin_vlms.image_dataset(10)
    trainer = RLOOTrainer(standin_vlms.model(family), _half_constant, args=args, train_dataset=dataset,
                          processing_class=standin_vlms.processor(family))
    rows = [dataset[i] for i in range(3)]
    rollout, samples, stats = trainer.rollouts.collect(rows, rollout_index=0, global_step=0, episode=0)

    kept = [_index(prompt) for prompt in samples.prompts]
    assert stats["dynamic_sampling/rounds"] >= 2 and stats["dynamic_sampling/zero_spread_kept"] == 0, stats
    assert kept[:K] == [1] * K and all(i % 2 == 1 for i in kept), kept  # round 0's informative group first
    assert len(set(kept)) == len(kept) // K, kept  # distinct prompts, so a misplaced image shows
    vision = rollout.vision
    assert len(vision.rows) == rollout.prompt_ids.shape[0] == len(kept) == 6
    assert len(vision.per_prompt) == 3  # the dropped groups' tensors are not kept
    for row, index in enumerate(kept):
        ids, alone = trainer.collector.prompt_stage.encoder.encode([dataset[index]])
        assert rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist() == ids[0]
        prompt = vision.rows[row]
        assert alone.per_prompt[0].keys() == vision.per_prompt[prompt].keys()
        for name, tensor in alone.per_prompt[0].items():
            assert torch.equal(tensor, vision.per_prompt[prompt][name]), (row, index, name)
        assert vision.num_images[prompt] == 1 and vision.template_ids[prompt] == alone.template_ids[0]

    # log_multimodal: each kept row's images, and the shown rows' files (round 0 wrote files for its first two rows
    # only, row 0's: the kept group of row 1 gets its own here)
    assert samples.images == [[dataset[index]["image"]] for index in kept]
    files = save_images([dataset[1]["image"]], tmp_path / "images")
    assert samples.extra["image"] == [files, files, None, None, None, None]

    model, mask = trainer.accelerator.unwrap_model(trainer.model), rollout.completion_mask.bool()
    assert rollout.old_logps is not None and rollout.ref_logps is not None and mask.any()
    for logps, reference in [(rollout.old_logps, model), (rollout.ref_logps, trainer.collector.reference)]:
        own = _whole_row_logprobs(reference, rollout, vision, args.temperature)
        other = _whole_row_logprobs(reference, rollout, _other_pixels(vision), args.temperature)
        assert (logps - own).abs()[mask].max() < 1e-5
        assert (logps - other).abs()[mask].max() > 1e-3


@pytest.mark.parametrize(("family", "shared_prefix_forward"), [("llava", False), ("qwen2_vl", True)])
def test_a_step_with_dynamic_sampling_on_images_trains_on_the_kept_rows_own_images(tmp_path, family,
                                                                                   shared_prefix_forward):
    """A 1-step train() (num_iterations=2, so pi_old is kept): the rollout needed refill rounds, the training pass's
    log-probs of the kept rows equal their pi_old within 1e-5 (the weights have not moved yet, so a row given another
    prompt's images would not), the weights move, dynamic_sampling/* are logged, and the completions log shows each
    row with its own prompt's image."""
    args = _config(tmp_path, num_iterations=2, shared_prefix_forward=shared_prefix_forward, log_completions=True,
                   log_multimodal=True, num_completions_to_print=6)
    dataset = standin_vlms.image_dataset(8)
    model = standin_vlms.model(family)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RLOOTrainer(model, _half_constant, args=args, train_dataset=dataset,
                          processing_class=standin_vlms.processor(family))
    seen = []
    policy_loss = trainer.learner.policy_loss

    def recording(logps, old_logps, micro, mask):
        assert micro.old_logps is not None  # pi_old from the rollout, not this pass's own log-probs
        seen.append((logps.detach(), old_logps, micro.completion_mask.bool()))
        return policy_loss(logps, old_logps, micro, mask)

    trainer.learner.policy_loss = recording
    trainer.train()

    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    for name in ("dropped_frac", "extra_prompts", "rounds", "zero_spread_kept"):
        assert f"dynamic_sampling/{name}" in line
    assert line["dynamic_sampling/rounds"] >= 2 and line["dynamic_sampling/dropped_frac"] > 0, line
    assert seen
    for logps, old_logps, mask in seen:
        assert (logps - old_logps).abs()[mask].max() < 1e-5
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())

    logged = [json.loads(row) for row in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 6 and all(_index(row["prompt"]) % 2 == 1 for row in logged)
    for row in logged:
        assert row["image"] == save_images([dataset[_index(row["prompt"])]["image"]], tmp_path / "images"), row
    assert trainer._logs["images"] == [[dataset[_index(p)]["image"]] for p in trainer._logs["prompt"]]


def test_dynamic_sampling_with_images_resumes_exactly(tmp_path):
    """Dynamic sampling keeps no state: the refill prompts are a function of (seed, rollout, round, process), so a run
    resumed from step 1 ends on the same weights as one that was not stopped."""
    dataset = standin_vlms.image_dataset(8)

    def trainer(folder, **overrides):
        torch.manual_seed(0)  # the same starting weights (the stand-in leaves some to torch's default init)
        return RLOOTrainer(standin_vlms.model("llava"), _half_constant,
                           args=_config(tmp_path / folder, max_steps=2, **overrides), train_dataset=dataset,
                           processing_class=standin_vlms.processor("llava"))

    straight = trainer("a", save_steps=1)
    straight.train()
    resumed = trainer("b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "run" / "checkpoint-1"))
    assert resumed.global_step == 2
    rounds = [e["dynamic_sampling/rounds"] for e in straight.state.log_history if "dynamic_sampling/rounds" in e]
    assert rounds[1] >= 2, rounds  # the resumed step itself refilled
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
