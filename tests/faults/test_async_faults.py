"""The async sampler's process dies (issue #48): the learner ends at once with the sampler's exit code, not after
async_rollout_timeout; a sampler that raises ends the run with the sampler's error."""

import multiprocessing
import os
import time

import pytest

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=6, learning_rate=3e-3, beta=0.0, max_steps=4, logging_steps=1,
                  save_steps=0, seed=0, async_rollouts=True, async_rollout_timeout=120, use_cpu=True)
    return RLOOConfig(**{**values, **overrides})


def dies_in_the_sampler(completions, **kwargs):
    if multiprocessing.current_process().name == "rloo-sampler":
        os._exit(3)  # as if the out-of-memory killer took it
    return digit_fraction(completions)


def raises_in_the_sampler(completions, **kwargs):
    if multiprocessing.current_process().name == "rloo-sampler":
        raise RuntimeError("the sampler's reward server is down")
    return digit_fraction(completions)


def test_a_dead_sampler_process_ends_the_run_at_once_with_its_exit_code(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), dies_in_the_sampler, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the sampler process \(pid \d+\) died with exit code 3"):
        trainer.train()
    assert time.monotonic() - start < 60  # not the 120 s of async_rollout_timeout


def test_a_sampler_that_raises_ends_the_run_with_its_error(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), raises_in_the_sampler, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    with pytest.raises(RuntimeError, match=r"(?s)sampler process failed.*the sampler's reward server is down"):
        trainer.train()
