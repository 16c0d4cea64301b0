"""Values computed by hand, so that a wrong sign, a dropped temperature, ignored position ids or a
miscounted denominator make a test fail (each was checked by breaking the code on purpose)."""


import pytest
import torch
from datasets import Dataset

from conftest import digit_fraction, gpt2_model
from rloo import RLOOConfig, RLOOTrainer
from rloo.builders import run_length
from rloo.data.schedule import PromptSchedule
from rloo.generation import FastSampler
from rloo.passes.logprobs import completion_logprobs

ROWS = [{"prompt": "1+1="}, {"prompt": "12+34+5="}]  # different lengths: the short one is left-padded


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  num_generations=4, max_completion_length=5, beta=0.0, max_steps=1, logging_steps=1, save_steps=0,
                  seed=0, max_grad_norm=0.0)
    return RLOOConfig(**{**values, **overrides})


def hand_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """(len(completion),) log-probs of one unpadded sequence, with the model's default positions."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


def hand_entropy(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def real_rows(rollout):
    """Each row's unpadded prompt and completion token lists."""
    for b in range(rollout.prompt_ids.shape[0]):
        prompt = rollout.prompt_ids[b][rollout.prompt_mask[b].bool()].tolist()
        completion = rollout.completion_ids[b][rollout.completion_mask[b].bool()].tolist()
        yield b, prompt, completion


@pytest.mark.parametrize("architecture", ["gpt2", "qwen2"])
def test_sampler_and_logprob_pass_position_padded_prompts_like_unpadded_ones(make_model, tokenizer, architecture):
    model = gpt2_model(tokenizer) if architecture == "gpt2" else make_model(seed=2).eval()
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in ROWS]
    greedy = FastSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                         max_new_tokens=6, do_sample=False)
    batch = greedy.sample(model, prompts, 1)
    for row, prompt in enumerate(prompts):
        alone = greedy.sample(model, [prompt], 1)
        width = alone.completion_ids.shape[1]
        assert batch.completion_ids[row, :width].tolist() == alone.completion_ids[0].tolist()
        reference = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        assert alone.completion_ids[0].tolist()[: reference.shape[1] - len(prompt)] == reference[0, len(prompt):].tolist()
    # The training pass over the left-padded batch, at temperature 0.7, against each row alone.
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    with torch.no_grad():
        logps, _ = completion_logprobs(model, input_ids, mask, batch.completion_ids.shape[1], temperature=0.7)
    for row, prompt, completion in real_rows(batch):
        torch.testing.assert_close(logps[row, : len(completion)].double(), hand_logprobs(model, prompt, completion, 0.7),
                                   rtol=1e-4, atol=1e-5)


def test_rollout_log_probs_and_kl_by_hand_at_temperature(tmp_path, make_model, tokenizer):
    args = _config(tmp_path, temperature=0.7, beta=0.1, kl_estimator="k1", num_iterations=2)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(ROWS),
                          processing_class=tokenizer)
    reference = make_model(seed=1)
    trainer.collector.reference = reference  # unlike the policy, so that the KL is not zero
    rollout, _ = trainer.collector.collect(ROWS, trainer.global_step, trainer.episode)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    for row, prompt, completion in real_rows(rollout):
        old = hand_logprobs(policy, prompt, completion, 0.7)
        ref = hand_logprobs(reference, prompt, completion, 0.7)
        torch.testing.assert_close(rollout.old_logps[row, : len(completion)].double(), old, rtol=1e-4, atol=1e-5)
        # k1: sum over the completion of log pi - log pi_ref (a penalty where the policy is more likely).
        assert rollout.seq_kl[row].item() == pytest.approx((old - ref).sum().item(), rel=1e-4, abs=1e-5)
    torch.testing.assert_close(rollout.rewards, rollout.scores - 0.1 * rollout.seq_kl)
    # The training pass at the same temperature: the first step's ratio pi / pi_old is exactly 1.
    stats = trainer.learner.step(rollout.micro_batch(0, args.completions_per_step))
    assert stats["val/ratio"] == pytest.approx(1.0, abs=1e-5) and stats["policy/clipfrac_avg"] == 0.0


def test_kl_loss_and_entropy_bonus_by_hand(tmp_path, make_model, tokenizer):
    args = _config(tmp_path, temperature=0.7, beta=0.2, kl_penalty="loss", kl_estimator="k3", entropy_coef=0.05,
                   loss_agg_mode="token-mean")
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(ROWS),
                          processing_class=tokenizer)
    reference = make_model(seed=1)
    trainer.collector.reference = reference
    rollout, _ = trainer.collector.collect(ROWS, trainer.global_step, trainer.episode)
    rollout.advantages = torch.zeros_like(rollout.advantages)  # only the KL and entropy terms remain
    numerators, _ = trainer.learner.micro_batch_loss(rollout)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    expected = 0.0
    for row, prompt, completion in real_rows(rollout):
        log_ratio = hand_logprobs(policy, prompt, completion, 0.7) - hand_logprobs(reference, prompt, completion, 0.7)
        k3 = torch.exp(-log_ratio) - 1 + log_ratio  # >= 0: a penalty
        expected += (0.2 * k3 - 0.05 * hand_entropy(policy, prompt, completion, 0.7)).sum().item()
    assert numerators.sum().item() == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_untrained_completions_leave_the_denominator_and_micro_batches_keep_the_last_token(tmp_path, make_model,
                                                                                           tokenizer):
    for mode in ("token-mean", "seq-mean-token-sum"):
        trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, loss_agg_mode=mode),
                              train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer)
        rollout, _ = trainer.collector.collect(ROWS, trainer.global_step, trainer.episode)
        rollout.trained = torch.tensor([True, False, True, True, False, True, True, True])
        lengths = rollout.completion_mask.sum(dim=1)
        expected = lengths[rollout.trained].sum().item() if mode == "token-mean" else 6
        assert trainer.learner.loss_denominator(rollout).item() == expected
    # Column trimming keeps every real completion token (the longest row's last one included).
    for start in (0, 4):
        micro = rollout.micro_batch(start, 4)
        assert micro.completion_mask.sum(dim=1).tolist() == lengths[start : start + 4].tolist()
        width = micro.completion_ids.shape[1]
        assert micro.completion_ids.tolist() == rollout.completion_ids[start : start + 4, :width].tolist()
        assert (rollout.completion_mask[start : start + 4, width:] == 0).all()


def test_run_lengths_for_epochs_and_episodes(tmp_path):
    schedule = PromptSchedule(num_rows=10, prompts_per_process=2, num_processes=2, seed=0)  # 2 rollouts per epoch
    args = _config(tmp_path, max_steps=-1, num_train_epochs=3, num_mini_batches=2, per_device_train_batch_size=4,
                   gradient_accumulation_steps=1)  # 8 completions = 2 prompts per process, 2 steps per rollout
    assert run_length(args, schedule, num_processes=2) == (6, 12)  # 3 epochs x 2 rollouts, 2 steps each
    args = _config(tmp_path, max_steps=-1, num_train_epochs=1.5, per_device_train_batch_size=4)
    assert run_length(args, schedule, num_processes=2) == (3, 3)
    # total_episodes counts completions over every process: ceil(50 / (8 x 2)) = 4 rollouts.
    args = _config(tmp_path, max_steps=-1, total_episodes=50, per_device_train_batch_size=4)
    assert run_length(args, schedule, num_processes=2) == (4, 4)
    assert run_length(_config(tmp_path, max_steps=5, num_mini_batches=2, per_device_train_batch_size=4,
                              gradient_accumulation_steps=1), schedule, 2) == (3, 5)  # ceil(5 / 2) rollouts


def test_prompt_schedule_epoch_boundaries():
    schedule = PromptSchedule(num_rows=10, prompts_per_process=2, num_processes=2, seed=3)
    assert schedule.batches_per_epoch == 2  # 10 // 4: the incomplete last batch of 2 is dropped
    epoch0 = [schedule.rows(r, p) for r in range(2) for p in range(2)]
    epoch1 = [schedule.rows(r, p) for r in range(2, 4) for p in range(2)]
    order0 = torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    order1 = torch.randperm(10, generator=torch.Generator().manual_seed(4)).tolist()
    assert sum(epoch0, []) == order0[:8] and sum(epoch1, []) == order1[:8]  # a new permutation each epoch
    assert len(set(sum(epoch0, []))) == 8  # no row twice within an epoch
    unshuffled = PromptSchedule(num_rows=10, prompts_per_process=2, num_processes=2, seed=3, shuffle=False)
    assert [unshuffled.rows(r, 1) for r in range(4)] == [[2, 3], [6, 7], [2, 3], [6, 7]]


def test_evaluate_averages_the_raw_score_of_every_eval_prompt(tmp_path, make_model, tokenizer):
    def prompt_length(prompts, completions, **kwargs):
        return [float(len(p)) for p in prompts]

    eval_rows = [{"prompt": "1" * n} for n in (1, 2, 3, 4, 5)]  # 5 rows: the last batch holds one prompt
    trainer = RLOOTrainer(make_model(), prompt_length, args=_config(tmp_path, normalize_rewards=True),
                          train_dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(eval_rows),
                          processing_class=tokenizer)
    assert trainer.evaluate()["eval/reward"] == pytest.approx(3.0)  # raw scores, before normalisation
