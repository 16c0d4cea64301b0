"""TRL's run-control fields that rloo honours under their own names: eval_on_start, logging_first_step,
disable_tqdm, save_only_model (and resuming from such a checkpoint), torch_empty_cache_steps."""

import json

import pytest

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.run import allocator
from rloo.run.checkpoint import CheckpointError


def _config(path, **overrides):
    values = dict(output_dir=str(path), per_device_train_batch_size=8, num_generations=4, max_completion_length=3,
                  learning_rate=1e-3, beta=0.0, max_steps=3, logging_steps=10, save_steps=0, seed=0)
    return RLOOConfig(**{**values, **overrides})


def _trainer(make_model, tokenizer, dataset, args, **kwargs):
    return RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer,
                       **kwargs)


def _history(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_eval_on_start_evaluates_before_the_first_step(tmp_path, make_model, tokenizer, digit_dataset):
    eval_prompts = digit_dataset.select(range(4))
    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, eval_on_start=True),
                       eval_dataset=eval_prompts)
    steps_at_eval = []
    evaluate = trainer.evaluate
    trainer.evaluate = lambda *a, **k: (steps_at_eval.append(trainer.global_step), evaluate(*a, **k))[1]
    trainer.train()
    assert steps_at_eval == [0, 3]  # before the first step, and the closing one
    assert "eval/reward" in _history(tmp_path)[0] and _history(tmp_path)[0]["step"] == 0


def test_eval_on_start_without_an_eval_dataset_is_refused(tmp_path, make_model, tokenizer, digit_dataset):
    with pytest.raises(ConfigError, match="eval_on_start.*eval_dataset"):
        _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, eval_on_start=True))


def test_logging_first_step_logs_step_one(tmp_path, make_model, tokenizer, digit_dataset):
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "a", logging_first_step=True)).train()
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "b")).train()
    logged = lambda path: [row["step"] for row in _history(path) if "loss" in row]  # noqa: E731
    assert logged(tmp_path / "a") == [1, 3]  # logging_steps=10: step 1, then the last step
    assert logged(tmp_path / "b") == [3]


@pytest.mark.parametrize("disable", [True, False])
def test_disable_tqdm_hides_the_progress_bar(disable, tmp_path, make_model, tokenizer, digit_dataset, capfd):
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, disable_tqdm=disable, max_steps=1)).train()
    assert ("RLOO:" in capfd.readouterr().err) is not disable


def test_save_only_model_writes_weights_alone_and_resuming_refuses_by_name(tmp_path, make_model, tokenizer,
                                                                            digit_dataset):
    from transformers import AutoModelForCausalLM

    trainer = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, save_steps=2, save_only_model=True))
    trainer.train()
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "accelerate_state").exists()
    AutoModelForCausalLM.from_pretrained(checkpoint)  # loads as a model
    again = _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, save_steps=2, save_only_model=True))
    for target in (str(checkpoint), "latest"):
        with pytest.raises(CheckpointError, match="save_only_model=True.*optimizer"):
            again.train(resume_from_checkpoint=target)


def test_a_full_checkpoint_keeps_the_optimizer_state(tmp_path, make_model, tokenizer, digit_dataset):
    """The counterpart: without save_only_model the same run writes accelerate's state and resumes."""
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, save_steps=2)).train()
    assert (tmp_path / "checkpoint-2" / "accelerate_state").is_dir()
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path, save_steps=2)).train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_torch_empty_cache_steps_empties_the_cache_every_n_steps(tmp_path, make_model, tokenizer, digit_dataset,
                                                                  monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "clear_device_cache", lambda: calls.append(1))
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "a", max_steps=5, torch_empty_cache_steps=2)).train()
    assert len(calls) == 2  # after steps 2 and 4
    _trainer(make_model, tokenizer, digit_dataset, _config(tmp_path / "b", max_steps=5)).train()
    assert len(calls) == 2


@pytest.mark.parametrize("kwargs, words", [
    ({"torch_empty_cache_steps": 0}, ["torch_empty_cache_steps", "positive integer"]),
    ({"transformers_continuous_batching_config": {"page_size": 16}}, ["sampler='paged'"]),
    ({"sampler": "paged", "transformers_continuous_batching_config": {"pages": 16}}, ["pages", "ContinuousBatchingConfig"]),
    ({"sampler": "paged", "transformers_continuous_batching_config": {"return_logprobs": True}}, ["return_logprobs"]),
    ({"sampler": "paged", "transformers_continuous_batching_config": '{"page_size": 16}'}, ["mapping"]),
])
def test_bad_values_are_refused_by_name(kwargs, words):
    with pytest.raises(ConfigError) as error:
        RLOOConfig(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_trl_continuous_batching_fields_configure_the_paged_sampler(make_model, tokenizer):
    from rloo.builders import default_sampler
    from rloo.generation.paged import PagedSampler

    args = RLOOConfig(use_transformers_continuous_batching=True,
                      transformers_continuous_batching_config={"page_size": 16, "max_batch_tokens": 512})
    assert args.sampler == "paged"
    sampler = default_sampler(args, tokenizer, make_model())
    assert isinstance(sampler, PagedSampler) and sampler.cache_config == {"page_size": 16, "max_batch_tokens": 512}
