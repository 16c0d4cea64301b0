"""The trainer end to end on tiny models: learning, accumulation invariance, KL, resume, saving."""

import dataclasses
import json

import pytest
import torch

import rloo.rollout as rollout_module
import rloo.update as update_module
from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.rewards.scoring import RewardError
from rloo.run.checkpoint import CheckpointError


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=6, learning_rate=3e-3, beta=0.0, max_steps=4, logging_steps=1,
                  save_steps=0, seed=0, overwrite_output_dir=True)  # several tests train twice into one directory
    return RLOOConfig(**{**values, **overrides})


def _params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_reward_rises_end_to_end(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, per_device_train_batch_size=32, max_steps=40, learning_rate=1e-2, logging_steps=5)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [line["reward"] for line in lines]
    assert len(lines) == 8 and lines[-1]["step"] == 40 and lines[-1]["episode"] == 40 * 32
    assert rewards[-1] > rewards[0] + 0.3, rewards


@pytest.mark.parametrize(
    "options",
    [
        dict(loss_agg_mode="seq-mean-token-sum"),
        dict(loss_agg_mode="token-mean"),
        dict(loss_agg_mode="seq-mean-token-mean"),
        dict(loss_agg_mode="seq-mean-token-sum-norm"),
        # per-token advantages, a KL term and an entropy term in the loss
        dict(loss_agg_mode="token-mean", kl_penalty="token", entropy_coef=0.01),
        dict(loss_agg_mode="seq-mean-token-mean", kl_penalty="loss", kl_estimator="k3", entropy_coef=0.01),
    ],
    ids=lambda options: "-".join(str(v) for v in options.values()),
)
def test_gradient_accumulation_matches_one_large_batch(tmp_path, make_model, tokenizer, digit_dataset, options):
    common = dict(beta=0.05, max_grad_norm=0.0, **options)
    large = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, per_device_train_batch_size=8,
                        gradient_accumulation_steps=1, **common), train_dataset=digit_dataset, processing_class=tokenizer)
    large.collector.reference = make_model(seed=1)  # a reference unlike the policy, so that the KL is not zero
    rollout, _ = large.collector.collect([digit_dataset[i] for i in range(2)], large.global_step, large.episode)
    assert rollout.advantages.abs().sum() > 0 and rollout.seq_kl.abs().sum() > 0
    rollout.trained = torch.tensor([True, False, True, True, True, True, False, True])  # as masked truncations
    lengths = rollout.loss_mask().sum(dim=1)
    # the two micro-batches hold different numbers of tokens, so a per-micro-batch token mean would differ
    assert lengths[:4].sum() != lengths[4:].sum() or options["loss_agg_mode"] != "token-mean"
    large.learner.accumulate_gradients(rollout)
    small = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, per_device_train_batch_size=4,
                        gradient_accumulation_steps=2, **common), train_dataset=digit_dataset, processing_class=tokenizer)
    small.learner.accumulate_gradients(rollout)
    for (name, p_large), p_small in zip(large.model.named_parameters(), small.model.parameters()):
        torch.testing.assert_close(p_small.grad, p_large.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_config_with_reward_model_keyword_and_narrow_signature(tmp_path, make_model, tokenizer, digit_dataset):
    seen = {}

    def length_reward(completions, prompts=None):  # seed 000's shape: no **kwargs
        seen["n"] = len(completions)
        seen["prompts"] = prompts
        return [float(len(c)) for c in completions]

    args = _config(tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=4, num_generations=4, max_steps=2)
    trainer = RLOOTrainer(model=make_model(), args=args, train_dataset=digit_dataset, processing_class=tokenizer,
                          reward_model=length_reward)
    trainer.train()
    assert seen["n"] == 4  # one prompt's whole group is scored together
    assert len(set(seen["prompts"])) == 1


def test_one_iteration_without_kl_runs_no_extra_forward(tmp_path, make_model, tokenizer, digit_dataset, monkeypatch):
    calls = []

    def counted(real):
        def counting(model, *args, **kwargs):
            calls.append(torch.is_grad_enabled())
            return real(model, *args, **kwargs)
        return counting

    # Every log-prob pass goes through one of these: a rollout's no-grad passes (one call per pass,
    # each prompt once per group), the training pass (one call per micro-batch).
    monkeypatch.setattr(rollout_module, "completion_logprobs", counted(rollout_module.completion_logprobs))
    monkeypatch.setattr(rollout_module, "grouped_completion_logprobs", counted(rollout_module.grouped_completion_logprobs))
    monkeypatch.setattr(update_module, "completion_logprobs", counted(update_module.completion_logprobs))
    args = _config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert trainer.reference is None  # beta == 0 loads no reference model
    trainer.train()
    assert calls == [True, True]  # two micro-batches with grad, no no-grad pass

    calls.clear()
    args = _config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1, beta=0.1)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert trainer.reference is not None
    trainer.train()
    # fp32, one iteration: the sampler's log-probs stand in for the policy's no-grad pass, so only the
    # reference's no-grad pass runs before training.
    assert calls == [False, True, True]

    calls.clear()
    args = _config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=2, beta=0.1,
                   num_iterations=2)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    assert calls == [False, False, True, True, True, True]  # policy and reference no-grad, then training


def test_kl_starts_at_zero_and_is_folded_into_rewards(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, beta=0.5)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    torch.testing.assert_close(rollout.seq_kl, torch.zeros(8), atol=1e-5, rtol=0)  # policy == reference
    trainer.train()  # the policy moves away from the reference
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    assert rollout.seq_kl.abs().max() > 1e-3
    torch.testing.assert_close(rollout.rewards, rollout.scores - 0.5 * rollout.seq_kl)
    grouped = rollout.rewards.view(2, 4)
    expected = grouped - (grouped.sum(1, keepdim=True) - grouped) / 3
    torch.testing.assert_close(rollout.advantages, expected.view(-1))


def test_num_iterations_reuses_the_batch_with_clipping(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, num_iterations=3, max_steps=6, learning_rate=3e-2, epsilon=0.05, logging_steps=1)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["episode"] for line in lines] == [8, 8, 8, 16, 16, 16]  # one rollout per 3 steps
    assert lines[0]["val/ratio"] == pytest.approx(1.0, abs=1e-5)  # first pass: pi == pi_old
    assert any(line["val/ratio_var"] > 0 for line in lines[1:3])  # later passes move the ratio
    assert max(line["policy/clipfrac_avg"] for line in lines) > 0


def test_resume_continues_exactly(tmp_path, make_model, tokenizer, digit_dataset):
    straight = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path / "a", max_steps=4, save_steps=2),
                           train_dataset=digit_dataset, processing_class=tokenizer)
    straight.train()
    resumed = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path / "b", max_steps=4),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "run" / "checkpoint-2"))
    assert resumed.global_step == 4 and resumed.episode == straight.episode == 32
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)


def test_checkpoints_rotate_and_resume_latest(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, max_steps=6, save_steps=2, save_total_limit=2)
    RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer).train()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    state = json.loads((run / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and state["episode"] == 48
    later = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=8, save_steps=2),
                        train_dataset=digit_dataset, processing_class=tokenizer)
    later.train(resume_from_checkpoint=True)
    assert later.global_step == 8


def test_resume_errors(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    with pytest.raises(CheckpointError, match="not an rloo checkpoint"):
        trainer.train(resume_from_checkpoint=str(tmp_path))
    with pytest.raises(CheckpointError, match="is not a directory"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "missing"))


def test_saved_model_loads_by_path_and_trains_from_an_id(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=1),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    saved = tmp_path / "run"
    assert (saved / "config.json").exists() and (saved / "tokenizer_config.json").exists()
    # A model id or path goes through from_pretrained, the tokenizer too.
    again = RLOOTrainer(str(saved), digit_fraction, args=_config(tmp_path / "again", max_steps=1), train_dataset=digit_dataset)
    for (name, a), b in zip(trainer.model.named_parameters(), again.model.parameters()):
        torch.testing.assert_close(b, a, msg=name)
    again.train()
    trainer.save_model(str(tmp_path / "explicit"))
    assert (tmp_path / "explicit" / "model.safetensors").exists()


def test_trl_v1_script_shape_with_eval_and_table(tmp_path, make_model, tokenizer, digit_dataset, capsys):
    # What a TRL v1 script passes, by keyword, with only the import changed.
    args = RLOOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, num_generations=2,
                      max_completion_length=4, max_steps=2, logging_steps=1, log_completions=True,
                      num_completions_to_print=2, save_steps=0, eval_steps=1)
    trainer = RLOOTrainer(model=make_model(), reward_funcs=[digit_fraction], args=args,
                          train_dataset=digit_dataset, eval_dataset=digit_dataset.select(range(8)),
                          processing_class=tokenizer)
    metrics = trainer.train()
    assert "eval/reward" in metrics
    out = capsys.readouterr().out
    assert "Sample completions at step 2" in out and "eval/reward" in out
    rows = (tmp_path / "trl" / "completions.jsonl").read_text().splitlines()
    assert len(rows) == 4 and {"prompt", "completion", "score", "advantage"} <= json.loads(rows[0]).keys()
    logged = json.loads((tmp_path / "trl" / "metrics.jsonl").read_text().splitlines()[0])
    for name in ["eps", "objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
                 "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg",
                 "policy/entropy_avg", "val/ratio", "val/ratio_var", "val/num_eos_tokens", "lr", "episode",
                 "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio"]:
        assert name in logged, name
    assert not any(key.startswith("val/clipfrac") or "value" in key for key in logged)  # no critic


def test_reward_function_errors(tmp_path, make_model, tokenizer, digit_dataset):
    def needs_tests(completions, tests):
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match="requires \\['tests'\\]"):
        RLOOTrainer(make_model(), needs_tests, args=_config(tmp_path), train_dataset=digit_dataset, processing_class=tokenizer)

    def one_value(completions, **kwargs):
        return [1.0]

    trainer = RLOOTrainer(make_model(), one_value, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    with pytest.raises(RewardError, match="returned 1 values for 8 completions"):
        trainer.train()
    with pytest.raises(ValueError, match="same argument"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                    processing_class=tokenizer, reward_model=digit_fraction)


def test_dataset_errors(tmp_path, make_model, tokenizer, digit_dataset):
    with pytest.raises(ValueError, match="no 'prompt' column"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), processing_class=tokenizer,
                    train_dataset=digit_dataset.rename_column("prompt", "question"))
    with pytest.raises(ValueError, match="one rollout needs"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, per_device_train_batch_size=4 * 100),
                    train_dataset=digit_dataset, processing_class=tokenizer)


def _rollout_with_kl(tmp_path, make_model, tokenizer, digit_dataset, **options):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, beta=0.5, max_grad_norm=0.0, **options),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.collector.reference = make_model(seed=1)  # a reference unlike the policy, so that the KL is not zero
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    return trainer, rollout


def _grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def test_token_kl_gives_a_different_gradient_than_sequence_kl(tmp_path, make_model, tokenizer, digit_dataset):
    token_trainer, rollout = _rollout_with_kl(tmp_path, make_model, tokenizer, digit_dataset, kl_penalty="token")
    assert rollout.token_advantages is not None
    # the first token's advantage is the sequence one; later ones add back the KL before them
    torch.testing.assert_close(rollout.token_advantages[:, 0], rollout.advantages)
    torch.testing.assert_close(rollout.rewards, rollout.scores - 0.5 * rollout.seq_kl)
    token_trainer.learner.accumulate_gradients(rollout)
    sequence_trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, beta=0.5, max_grad_norm=0.0),
                                   train_dataset=digit_dataset, processing_class=tokenizer)
    rollout.token_advantages = None  # the same samples, rewards and advantages, sequence KL
    sequence_trainer.learner.accumulate_gradients(rollout)
    token_grad, sequence_grad = _grads(token_trainer.model), _grads(sequence_trainer.model)
    assert (token_grad - sequence_grad).norm() > 1e-3 * sequence_grad.norm()


def test_kl_in_the_loss_leaves_the_reward_alone(tmp_path, make_model, tokenizer, digit_dataset):
    trainer, rollout = _rollout_with_kl(tmp_path, make_model, tokenizer, digit_dataset, kl_penalty="loss",
                                        kl_estimator="k3")
    torch.testing.assert_close(rollout.rewards, rollout.scores)  # not penalised
    assert rollout.ref_logps is not None and (rollout.seq_kl > 0).all()  # k3 >= 0, measured for the logs
    stats = trainer.learner.accumulate_gradients(rollout)
    assert stats["loss/kl_avg"] > 0
    no_reference = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, kl_penalty="loss", beta=0.0),
                               train_dataset=digit_dataset, processing_class=tokenizer)
    assert no_reference.reference is None


def test_mini_batches_split_each_rollout_into_optimizer_steps(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, per_device_train_batch_size=4, num_mini_batches=2, num_iterations=2, max_steps=8,
                   learning_rate=3e-2, epsilon=0.05, epsilon_high=0.1, save_steps=4)
    assert (args.completions_per_rollout, args.prompts_per_rollout, args.steps_per_rollout) == (8, 2, 4)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert (trainer.num_rollouts, trainer.total_steps) == (2, 8)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["episode"] for line in lines] == [8] * 4 + [16] * 4  # one rollout of 8 per 4 steps
    assert lines[0]["val/ratio"] == pytest.approx(1.0, abs=1e-5)  # first mini-batch: pi == pi_old
    assert lines[1]["val/ratio_var"] > 0  # the second mini-batch is already off-policy
    for line in lines:
        assert line["policy/clipfrac_avg"] == pytest.approx(line["clip_ratio/low_mean"] + line["clip_ratio/high_mean"])
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]


def test_stop_strings_stop_tokens_and_truncation_shaping(tmp_path, make_model, tokenizer, digit_dataset):
    stop_token = tokenizer.convert_tokens_to_ids("7")
    args = _config(tmp_path, stop_strings=["3"], stop_token_ids=[stop_token], missing_eos_penalty=0.5,
                   mask_truncated_completions=True, per_device_train_batch_size=32)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert trainer.sampler.eos_token_ids == [tokenizer.eos_token_id, stop_token]
    rollout, samples = trainer.collector.collect([digit_dataset[i] for i in range(8)], trainer.global_step, trainer.episode)
    raw = torch.tensor(digit_fraction(samples.completions))
    lengths = rollout.completion_mask.sum(dim=1)
    for row, (text, ended) in enumerate(zip(samples.completions, rollout.has_eos.tolist())):
        assert "3" not in text[:-1] and "7" not in text[:-1]  # nothing follows a stop
        last = rollout.completion_ids[row, lengths[row] - 1].item()
        assert ended == (text.endswith("3") or last in (stop_token, tokenizer.eos_token_id))
    assert not rollout.has_eos.all() and rollout.has_eos.any()
    torch.testing.assert_close(rollout.scores, raw - 0.5 * (~rollout.has_eos).float())
    assert rollout.trained.tolist() == rollout.has_eos.tolist()


def test_reinforce_with_one_completion_per_prompt_and_normalised_rewards(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, advantage_estimator="reinforce", num_generations=1, normalize_rewards=True,
                   normalize_advantages=True, max_steps=2)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    metrics = trainer.train()
    assert metrics["reward"] > 0 and metrics["reward_std"] == 0  # the raw score is logged, not the z-score
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(8)], trainer.global_step, trainer.episode)
    torch.testing.assert_close(rollout.scores.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(rollout.advantages.std(unbiased=False), torch.tensor(1.0), atol=1e-4, rtol=0)


@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-sum", "token-mean"])
def test_masked_completions_contribute_no_gradient(tmp_path, make_model, tokenizer, digit_dataset, loss_agg_mode):
    def gradient(advantages):
        trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, loss_agg_mode=loss_agg_mode),
                              train_dataset=digit_dataset, processing_class=tokenizer)
        trainer.learner.accumulate_gradients(dataclasses.replace(rollout, advantages=advantages))
        return _grads(trainer.model)

    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    rollout.trained = torch.tensor([True, False, True, True, False, True, True, True])
    rollout.advantages = torch.tensor([1.0, 0.0, -1.0, 0.5, 0.0, 2.0, -0.5, -2.0])
    changed = rollout.advantages.clone()
    changed[[1, 4]] = torch.tensor([50.0, -50.0])  # only the masked completions change
    torch.testing.assert_close(gradient(changed), gradient(rollout.advantages))
    changed[0] = 50.0  # a trained one: the gradient must move
    assert not torch.allclose(gradient(changed), gradient(rollout.advantages))


def test_tensorboard_tracker_receives_the_metrics(tmp_path, make_model, tokenizer, digit_dataset):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = _config(tmp_path, max_steps=2, report_to="tensorboard", run_name="tb")
    RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer).train()
    event_dirs = {path.parent for path in (tmp_path / "run").rglob("events.out.tfevents.*")}
    assert event_dirs
    tags = set()
    for directory in event_dirs:
        tags |= set(EventAccumulator(str(directory)).Reload().Tags()["scalars"])
    assert {"train/reward", "train/kl", "train/loss", "train/episode"} <= tags


def test_gradients_left_on_the_model_do_not_leak_into_the_first_step(tmp_path, make_model, tokenizer, digit_dataset):
    clean = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path / "clean", max_steps=1),
                        train_dataset=digit_dataset, processing_class=tokenizer)
    clean.train()
    stale_model = make_model()
    for param in stale_model.parameters():  # as a supervised loop leaves them after its last backward
        param.grad = torch.ones_like(param)
    stale = RLOOTrainer(stale_model, digit_fraction, args=_config(tmp_path / "stale", max_steps=1),
                        train_dataset=digit_dataset, processing_class=tokenizer)
    stale.train()
    for (name, a), b in zip(clean.model.named_parameters(), stale.model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
