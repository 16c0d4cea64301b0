"""TRL's DataLoader-facing Trainer API: its rules for a streamed train set, get_train_dataloader(),
get_eval_dataloader() and the `_logs` buffer that TRL scripts and callbacks read."""

import logging

import pytest
from datasets import Dataset, IterableDataset

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, learning_rate=3e-3, beta=0.0, max_steps=2, logging_steps=1,
                  save_steps=0, seed=0)
    return RLOOConfig(**{**values, **overrides})


def _streamed(dataset):
    return IterableDataset.from_generator(lambda: iter(dataset))


def test_a_streamed_train_set_reads_dispatch_batches_false_and_refuses_true(tmp_path, make_model, tokenizer,
                                                                               digit_dataset, caplog):
    args = _config(tmp_path, dataloader_num_workers=4)
    assert args.accelerator_config.dispatch_batches is None  # unset, as in transformers
    with caplog.at_level(logging.WARNING, logger="rloo.data.dataset_rows"):
        RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=_streamed(digit_dataset),
                    processing_class=tokenizer)
    assert args.accelerator_config.dispatch_batches is False and args.dataloader_num_workers == 0
    assert "dataloader_num_workers=4 is set to 0 for a streamed train_dataset" in caplog.text

    refused = _config(tmp_path, accelerator_config={"dispatch_batches": True})
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`.*set it to False"):
        RLOOTrainer(make_model(), digit_fraction, args=refused, train_dataset=_streamed(digit_dataset),
                    processing_class=tokenizer)

    mapped = _config(tmp_path, dataloader_num_workers=4, accelerator_config={"dispatch_batches": True})
    RLOOTrainer(make_model(), digit_fraction, args=mapped, train_dataset=digit_dataset, processing_class=tokenizer)
    assert mapped.accelerator_config.dispatch_batches is True and mapped.dataloader_num_workers == 4  # untouched


def test_the_train_loader_yields_the_prompts_of_each_rollout_in_training_order(tmp_path, make_model, tokenizer,
                                                                               digit_dataset):
    seen = []

    def recording(prompts, completions, **kwargs):
        seen.append(list(dict.fromkeys(prompts)))  # each prompt once, in sampling order
        return digit_fraction(completions)

    trainer = RLOOTrainer(make_model(), recording, args=_config(tmp_path, dataloader_num_workers=2),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    loader = trainer.get_train_dataloader()
    assert loader.num_workers == 2 and len(loader) == 2  # max_steps=2 rollouts of 2 prompts
    batches = [[row["prompt"] for row in batch] for batch in trainer.get_train_dataloader()]
    trainer.train()
    assert batches == seen and batches[0] != batches[1]


def test_the_eval_loader_batches_like_evaluate_and_reads_a_stream_in_the_main_process(tmp_path, make_model,
                                                                                      tokenizer, digit_dataset):
    eval_sets = {"stream": _streamed(digit_dataset.select(range(5))), "kept": digit_dataset.select(range(6))}
    trainer = RLOOTrainer(make_model(), digit_fraction,
                          args=_config(tmp_path, dataloader_num_workers=3, per_device_eval_batch_size=8),
                          train_dataset=digit_dataset, eval_dataset=eval_sets, processing_class=tokenizer)
    stream, kept = trainer.get_eval_dataloader("stream"), trainer.get_eval_dataloader("kept")
    assert (stream.num_workers, kept.num_workers) == (0, 3) and trainer.args.dataloader_num_workers == 3
    # 8 completions per batch, 4 per prompt: 2 prompts a batch.
    assert [len(batch) for batch in stream] == [2, 2, 1] and [len(batch) for batch in kept] == [2, 2, 2]
    assert [row["prompt"] for batch in stream for row in batch] == digit_dataset.select(range(5))["prompt"]
    with pytest.raises(ValueError, match="needs one eval set"):
        trainer.get_eval_dataloader()


def test_logs_holds_the_last_logged_rollout_with_log_extra_columns(tmp_path, make_model, tokenizer):
    dataset = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])

    def with_extra(prompts, completions, log_extra=None, **kwargs):
        log_extra("head", [completion[:2] for completion in completions])
        return [float(len(completion)) for completion in completions]

    trainer = RLOOTrainer(make_model(), with_extra, args=_config(tmp_path, max_steps=1),
                          train_dataset=dataset, processing_class=tokenizer)
    assert trainer._logs["completion"] == [] and trainer._logs["extra"] == {}
    trainer.train()
    logs = trainer._logs
    assert len(logs["prompt"]) == len(logs["completion"]) == len(logs["advantages"]) == 8
    assert logs["extra"]["head"] == [completion[:2] for completion in logs["completion"]]
    assert logs["rewards"]["with_extra"] == [float(len(completion)) for completion in logs["completion"]]
    # RLOO's leave-one-out advantages sum to zero within each group of 4.
    assert all(abs(sum(logs["advantages"][i:i + 4])) < 1e-5 for i in range(0, 8, 4))
