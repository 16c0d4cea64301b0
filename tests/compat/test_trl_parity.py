"""What TRL's own RLOOTrainer tests rely on (benchmarks/trl_suite/trl_suite.py runs them): the closing log entry,
TRL's attributes, the eval sets TRL takes, and the TRL options that rloo accepts."""

import logging

import pytest
from datasets import Dataset, DatasetDict, IterableDatasetDict

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, learning_rate=3e-3, beta=0.0, max_steps=2, logging_steps=1,
                  save_steps=0, seed=0, report_to="none")
    return RLOOConfig(**{**values, **overrides})


def _eval_split(digit_dataset, iterable):
    split = digit_dataset.select(range(6))
    return split.to_iterable_dataset() if iterable else split


def test_missing_train_dataset_keeps_trl_wording(tmp_path, make_model):
    with pytest.raises(ValueError, match="`train_dataset` is required") as error:
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path))
    assert "'prompt' column" in str(error.value)


def test_trl_attributes(tmp_path, make_model, tokenizer, digit_dataset):
    def plain(completions, **kwargs):
        return [0.0] * len(completions)

    trainer = RLOOTrainer(make_model(), [plain, digit_fraction], args=_config(tmp_path, beta=0.1),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    assert trainer.reward_funcs == [plain, digit_fraction]
    assert trainer.reward_processing_classes == [None, None]
    assert trainer.ref_model is trainer.reference and trainer.ref_model is not None
    assert trainer.aux_loss_enabled is False
    no_ref = RLOOTrainer(make_model(), plain, args=_config(tmp_path, beta=0.0), train_dataset=digit_dataset,
                         processing_class=tokenizer)
    assert no_ref.ref_model is None


@pytest.mark.parametrize("kind", ["dataset", "iterable", "dataset_dict", "iterable_dict", "dict_of_iterable"])
def test_eval_sets_trl_takes(tmp_path, make_model, tokenizer, digit_dataset, kind):
    split = _eval_split(digit_dataset, "iterable" in kind)
    eval_dataset = {"dataset": split, "iterable": split,
                    "dataset_dict": DatasetDict({"a": split, "b": split}),
                    "iterable_dict": IterableDatasetDict({"a": split, "b": split}),
                    "dict_of_iterable": {"a": split, "b": split}}[kind]
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer, eval_dataset=eval_dataset)
    assert trainer.eval_dataset is eval_dataset  # kept as given
    metrics = trainer.evaluate()
    if kind in ("dataset", "iterable"):
        assert "eval/reward" in metrics
    else:
        assert "eval_a/reward" in metrics and "eval_b/reward" in metrics
    # an iterable passed to evaluate() directly works too (no len() on it)
    assert "eval/reward" in trainer.evaluate(_eval_split(digit_dataset, True))


def test_per_device_eval_batch_size_sets_the_eval_chunk(tmp_path, make_model, tokenizer, digit_dataset):
    calls = []
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, per_device_eval_batch_size=8),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    sample_ids = trainer.collector.sample_ids
    trainer.collector.sample_ids = lambda prompt_ids, k: calls.append(len(prompt_ids)) or sample_ids(prompt_ids, k)
    trainer.evaluate(digit_dataset.select(range(6)))
    assert calls == [2, 2, 2]  # 8 completions = 2 prompts of 4 at a time
    calls.clear()
    trainer.args = _config(tmp_path, per_device_eval_batch_size=1)  # fewer than a group: one group at a time
    trainer.evaluate(digit_dataset.select(range(3)))
    assert calls == [1, 1, 1]


def test_dataloader_options_are_accepted(tmp_path):
    args = _config(tmp_path, dataloader_num_workers=4, accelerator_config={"dispatch_batches": False})
    assert args.dataloader_num_workers == 4 and args.accelerator_config.dispatch_batches is False  # transformers' object
    with pytest.raises(ValueError, match="split_batches"):
        _config(tmp_path, accelerator_config={"split_batches": True})
    with pytest.raises(ValueError, match="dataloader_num_workers"):
        _config(tmp_path, dataloader_num_workers=-1)


def test_all_none_rewards_warn_in_trl_words(tmp_path, make_model, tokenizer, digit_dataset, caplog):
    def never(completions, **kwargs):
        return [None] * len(completions)

    trainer = RLOOTrainer(make_model(), never, args=_config(tmp_path, max_steps=1), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert "returned None for every one" in caplog.text


def test_closing_entry_has_trl_keys(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=Dataset.from_list(
        list(digit_dataset)), processing_class=tokenizer)
    out = trainer.train()
    closing = trainer.state.log_history[-1]
    assert closing["train_loss"] == out.training_loss and closing["step"] == 2
    assert closing["epoch"] == pytest.approx(trainer.epoch) and closing["train_runtime"] > 0


def test_reference_mix_by_hand():
    import torch

    from rloo.passes.reference_sync import mixed, sync_reference

    ref, pol = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([3.0, 2.0, 0.0])
    # (1 - 0.25) * ref + 0.25 * pol, element by element: 0.75 + 0.75, -1.5 + 0.5, 3 + 0
    assert mixed(ref, pol, 0.25).tolist() == [1.5, -1.0, 3.0]
    assert mixed(ref, pol, 0.0).tolist() == ref.tolist() and mixed(ref, pol, 1.0).tolist() == pol.tolist()
    reference, policy = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    expected = {n: [(1 - 0.6) * r + 0.6 * p for r, p in zip(rp.flatten().tolist(), pp.flatten().tolist())]
                for (n, rp), (_, pp) in zip(reference.named_parameters(), policy.named_parameters())}
    assert sync_reference(reference, policy, 0.6) == 2
    for name, param in reference.named_parameters():
        assert param.flatten().tolist() == pytest.approx(expected[name])


def test_sync_ref_model_moves_the_reference_on_its_steps(tmp_path, make_model, tokenizer, digit_dataset):
    import torch

    args = _config(tmp_path, beta=0.1, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.5,
                   max_steps=3, learning_rate=0.05)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    seen = []

    class Watch:
        def on_step_end(self, args, state, control, **kwargs):
            seen.append({n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()})

    before = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    policy_at = {}
    original = trainer._sync_reference

    def record():
        policy_at[trainer.global_step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        original()

    trainer._sync_reference = record
    trainer.callback_handler.add_callback(Watch())
    trainer.train()
    # step 1: untouched; step 2: half way to the policy of step 2; step 3: untouched since step 2
    assert all(torch.equal(seen[0][n], before[n]) for n in before)
    for n in before:
        expected = (0.5 * before[n].float() + 0.5 * policy_at[2][n].float()).to(before[n].dtype)
        assert torch.allclose(seen[1][n], expected) and torch.equal(seen[2][n], seen[1][n])


def test_sync_ref_model_needs_a_reference(tmp_path, make_model, tokenizer, digit_dataset):
    with pytest.raises(ValueError, match="needs a reference model"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, beta=0.0, sync_ref_model=True),
                    train_dataset=digit_dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match="ref_model_mixup_alpha"):
        _config(tmp_path, ref_model_mixup_alpha=1.5)


def test_min_p_by_hand_and_against_transformers():
    import torch
    from transformers.generation.logits_process import MinPLogitsWarper

    from rloo.generation.fast import filter_logits

    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    # threshold 0.2 * 0.5 = 0.1: only the 0.05 token goes
    assert torch.isinf(filter_logits(logits, min_p=0.2)).tolist() == [[False, False, False, True]]
    # threshold 0.5 * 0.5 = 0.25: the 0.15 token goes too
    assert torch.isinf(filter_logits(logits, min_p=0.5)).tolist() == [[False, False, True, True]]
    assert not torch.isinf(filter_logits(logits, min_p=0.0)).any()
    torch.manual_seed(0)
    random = torch.randn(4, 50)
    for min_p in (0.05, 0.3):
        ours = torch.isinf(filter_logits(random, temperature=0.7, min_p=min_p))
        theirs = torch.isinf(MinPLogitsWarper(min_p)(None, random / 0.7))
        assert torch.equal(ours, theirs)


def test_min_p_reaches_the_samplers(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, min_p=0.05), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    assert trainer.sampler.min_p == 0.05 and type(trainer.sampler).__name__ == "FastSampler"
    trainer.train()


def test_generation_kwargs_go_to_generate(tmp_path, make_model, tokenizer, digit_dataset):
    kwargs = {"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}
    args = _config(tmp_path, generation_kwargs=kwargs, repetition_penalty=1.1)
    assert args.sampler == "generate" and args.top_k == 50
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    assert trainer.sampler.generation_kwargs == {"num_beams": 2, "length_penalty": -0.1, "repetition_penalty": 1.1}
    seen = []
    model = trainer.accelerator.unwrap_model(trainer.model)
    generate = model.generate
    model.generate = lambda **kw: seen.append(kw) or generate(**kw)
    trainer.train()
    assert seen and seen[0]["num_beams"] == 2 and seen[0]["repetition_penalty"] == 1.1


def test_engine_options_on_the_fast_sampler_name_the_one_that_can(tmp_path, make_model, tokenizer, digit_dataset):
    args = _config(tmp_path, sampler="fast", generation_kwargs={"num_beams": 2})
    with pytest.raises(ValueError, match="sampler='generate'"):
        RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match="do_sample=False"):
        _config(tmp_path, generation_kwargs={"do_sample": False})


def test_padded_span_by_hand():
    from rloo.rollout import padded_span

    # prompt columns [3:10] (7) + completion [:5] (5) = 12; to 8 needs 4 more: 3 from the prompt, 1 from completions
    assert padded_span(3, 5, 10, 9, 8) == (0, 6)
    # already a multiple
    assert padded_span(2, 4, 6, 9, 8) == (2, 4)
    # not enough room: the whole width (10 + 9 = 19), never more
    assert padded_span(1, 5, 10, 9, 32) == (0, 9)


def test_pad_to_multiple_of_pads_micro_batches_and_keeps_the_loss(tmp_path, make_model, tokenizer, digit_dataset):
    import torch

    losses, widths = [], []
    for multiple in (None, 8):
        extra = {} if multiple is None else {"pad_to_multiple_of": multiple}
        trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=1, **extra),
                              train_dataset=digit_dataset, processing_class=tokenizer)
        rows = [digit_dataset[i] for i in range(2)]
        rollout, _ = trainer.collector.collect(rows, trainer.global_step, trainer.episode)
        size = trainer.args.per_device_train_batch_size
        micro = rollout.micro_batch(0, size, trainer.learner.pad_to_multiple_of)
        widths.append(micro.prompt_ids.shape[1] + micro.completion_ids.shape[1])
        torch.manual_seed(0)
        numerators, _ = trainer.learner.micro_batch_loss(micro)
        losses.append(numerators.detach())
    assert widths[1] % 8 == 0 or widths[1] == rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)


def test_fast_sampler_on_a_hybrid_cache_matches_generate():
    """NemotronH's mamba layers cannot copy cache rows: each sample gets its own prefill, same tokens."""
    import torch
    import transformers

    from rloo.generation.fast import FastSampler, can_repeat_rows
    from rloo.generation.kv_cache import append_in_place_cache

    config = transformers.NemotronHConfig(
        vocab_size=64, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
        layers_block_type=["mamba", "attention", "moe"], mamba_num_heads=8, mamba_head_dim=4, mamba_n_groups=1,
        ssm_state_size=16, mamba_d_conv=4, mamba_expand=2, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.NemotronHForCausalLM(config).eval()
    assert not can_repeat_rows(append_in_place_cache(model.config, 4))
    sampler = FastSampler(pad_token_id=0, eos_token_ids=[1], max_new_tokens=5, do_sample=False)
    prompts = [[5, 6, 7], [8, 9]]
    out = sampler.sample(model, prompts, 3)
    for index, prompt in enumerate(prompts):
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, eos_token_id=[1],
                                  pad_token_id=0)[0, len(prompt):]
        for row in range(3 * index, 3 * index + 3):
            got = out.completion_ids[row][out.completion_mask[row].bool()]
            assert got.tolist() == expected[: len(got)].tolist()


def test_trl_1_16_names_alongside_v0_names(tmp_path, make_model, tokenizer, digit_dataset):
    from rloo.run.metrics import tracker_metrics

    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, beta=0.1), train_dataset=digit_dataset,
                          processing_class=tokenizer, eval_dataset=digit_dataset.select(range(4)))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "objective/kl" in h][0]
    for new, old in (("kl", "objective/kl"), ("entropy", "policy/entropy_avg"), ("learning_rate", "lr"),
                     ("loss", "loss/policy_avg")):
        assert logged[new] == logged[old]
    assert "rewards/digit_fraction/mean" in logged and "clip_ratio/low_mean" in logged
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == metrics["eval/reward"]
    charted = tracker_metrics({**logged, **metrics})
    assert charted["train/kl"] == logged["kl"] and charted["train/rewards/digit_fraction/mean"] == \
        logged["rewards/digit_fraction/mean"] and charted["train/completions/mean_length"] == logged[
            "completions/mean_length"]
    assert "eval/reward" in charted and "eval_reward" not in charted
    # Each value once: not under its v0 name (objective/kl, lr, ...) nor unprefixed.
    assert not {"objective/kl", "train/objective/kl", "train/lr", "train/objective/entropy", "reward"} & set(charted)


def test_closing_entry_takes_the_last_steps_figures(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_steps=3),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    history = trainer.state.log_history
    assert [h["step"] for h in history] == [1, 2, 3]  # step 3's log is the closing entry, not repeated
    closing = history[-1]
    assert "rewards/digit_fraction/mean" in closing and "reward" in closing and "train_loss" in closing
    import json

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["reward"] == closing["reward"]


def test_one_tokenizer_for_two_reward_models_is_refused(tmp_path, make_model, tokenizer, digit_dataset):
    import transformers

    reward_model = transformers.Qwen2ForSequenceClassification(transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, num_labels=1, pad_token_id=tokenizer.pad_token_id))
    with pytest.raises(ValueError, match="must match"):
        RLOOTrainer(make_model(), [reward_model, reward_model], args=_config(tmp_path), train_dataset=digit_dataset,
                    processing_class=tokenizer, reward_processing_classes=tokenizer)
    trainer = RLOOTrainer(make_model(), [reward_model, digit_fraction], args=_config(tmp_path),
                          train_dataset=digit_dataset, processing_class=tokenizer, reward_processing_classes=tokenizer)
    assert trainer.reward_processing_classes[1] is None and trainer.reward_funcs[0] is reward_model

