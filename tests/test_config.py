"""RLOOConfig: derived sizes, every validation error, aliases, documentation."""

import dataclasses
import logging

import pytest

from rloo import ConfigError, RLOOConfig
from rloo.config import field_docs


def test_batch_config_is_one_prompt_per_step():
    config = RLOOConfig(per_device_train_batch_size=1, gradient_accumulation_steps=4, num_generations=4)
    assert config.completions_per_step == 4
    assert config.prompts_per_step == 1


def test_batch_sizes_count_completions_like_trl():
    config = RLOOConfig(per_device_train_batch_size=32, num_generations=4)
    assert config.prompts_per_step == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_generations=1), "num_generations"),
        (dict(per_device_train_batch_size=6, num_generations=4), "multiple of num_generations"),
        (dict(per_device_train_batch_size=0), "per_device_train_batch_size"),
        (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(lr_scheduler_type="warp"), "lr_scheduler_type"),
        (dict(warmup_ratio=1.5), "warmup_ratio"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(warmup_ratio=0.1, warmup_steps=10), "set only one"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(adam_beta1=1.0), "adam_beta1"),
        (dict(adam_epsilon=0.0), "adam_epsilon"),
        (dict(max_grad_norm=-1.0), "max_grad_norm"),
        (dict(optim="sgd"), "optim"),
        (dict(bf16=True, fp16=True), "bf16 and fp16"),
        (dict(temperature=0.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(beta=-0.1), "beta"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(num_iterations=0), "num_iterations"),
        (dict(max_steps=0), "max_steps"),
        (dict(num_train_epochs=0), "num_train_epochs"),
        (dict(total_episodes=0), "total_episodes"),
        (dict(max_steps=10, total_episodes=100), "both set"),
        (dict(save_steps=-1), "save_steps"),
        (dict(save_steps=3, num_iterations=2), "multiple of num_iterations"),
        (dict(save_total_limit=0), "save_total_limit"),
        (dict(eval_steps=-1), "eval_steps"),
        (dict(reward_weights=[]), "reward_weights"),
        (dict(report_to="neptune"), "report_to"),
        (dict(max_prompt_length=0), "max_prompt_length"),
        (dict(max_completion_length=0), "max_completion_length"),
        (dict(logging_steps=0), "logging_steps"),
        (dict(num_completions_to_print=0), "num_completions_to_print"),
        (dict(advantage_estimator="ppo"), "advantage_estimator must be one of .*'rloo'.*'reinforce_pp'"),
        (dict(kl_penalty="reward"), "kl_penalty must be one of .*'sequence', 'token', 'loss'"),
        (dict(kl_estimator="k4"), "kl_estimator must be one of .*'k1', 'k2', 'k3'"),
        (dict(loss_agg_mode="mean"), "loss_agg_mode must be one of .*'token-mean'"),
        (dict(epsilon=0.2, epsilon_high=0.1), "epsilon_high=0.1 is below epsilon=0.2"),
        (dict(num_mini_batches=0), "num_mini_batches"),
        (dict(save_steps=2, num_mini_batches=2, num_iterations=2),
         "multiple of num_iterations \\* num_mini_batches = 2 \\* 2 = 4"),
        (dict(advantage_estimator="grpo", num_generations=1), "num_generations .*advantage_estimator='grpo'"),
        (dict(advantage_estimator="reinforce_pp", num_generations=1), "num_generations .*'reinforce'"),
        (dict(advantage_estimator="reinforce", num_generations=1, per_device_train_batch_size=1,
              normalize_advantages=True), "normalize_rewards / normalize_advantages .* 1 completion"),
        (dict(kl_penalty="token", advantage_estimator="grpo"), "kl_penalty='token'.*rescale"),
        (dict(kl_penalty="token", normalize_advantages=True), "kl_penalty='token'.*normalize_advantages=True"),
        (dict(entropy_coef=-0.01), "entropy_coef"),
        (dict(missing_eos_penalty=-1.0), "missing_eos_penalty"),
        (dict(reward_clip_range=0.0), "reward_clip_range"),
        (dict(stop_strings=[""]), "stop_strings"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
    ],
)
def test_validation_errors_name_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RLOOConfig(**kwargs)


def test_divisibility_error_names_the_fields_to_change():
    with pytest.raises(ConfigError) as error:
        RLOOConfig(per_device_train_batch_size=6, gradient_accumulation_steps=1, num_generations=4)
    text = str(error.value)
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"):
        assert name in text


def test_adamw_8bit_without_bitsandbytes_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ConfigError, match="bitsandbytes"):
        RLOOConfig(optim="adamw_8bit")


@pytest.mark.parametrize(
    "old, new, value",
    [("kl_coef", "beta", 0.1), ("rloo_k", "num_generations", 4), ("cliprange", "epsilon", 0.1),
     ("num_ppo_epochs", "num_iterations", 2), ("response_length", "max_completion_length", 53)],
)
def test_trl_v0_aliases(old, new, value, caplog):
    with caplog.at_level(logging.WARNING):
        config = RLOOConfig(**{old: value, "per_device_train_batch_size": 8, "save_steps": 0})
    assert getattr(config, new) == value
    assert getattr(config, old) == value
    assert f"`{new}`" in caplog.text
    assert old not in {f.name for f in dataclasses.fields(RLOOConfig)}
    RLOOConfig(**{old: value, new: value, "per_device_train_batch_size": 8, "save_steps": 0})  # same value: fine
    with pytest.raises(ConfigError, match=f"`{old}` is an alias of `{new}`"):
        RLOOConfig(**{old: value, new: value * 3, "per_device_train_batch_size": 8, "save_steps": 0})


def test_values_are_never_rewritten():
    config = RLOOConfig(learning_rate=3e-5, per_device_train_batch_size=12, num_generations=3, top_k=7)
    assert (config.learning_rate, config.per_device_train_batch_size, config.num_generations, config.top_k) == (3e-5, 12, 3, 7)


def test_every_field_has_a_docstring():
    docs = field_docs(RLOOConfig)
    missing = [f.name for f in dataclasses.fields(RLOOConfig) if not docs.get(f.name)]
    assert missing == []


def test_allowed_combinations_are_not_errors():
    RLOOConfig(beta=0.0, kl_estimator="k3")  # an estimator with no KL is harmless
    RLOOConfig(beta=0.0, kl_penalty="loss")  # loads no reference, see the trainer tests
    RLOOConfig(advantage_estimator="reinforce", num_generations=1, per_device_train_batch_size=1)  # no baseline
    RLOOConfig(kl_penalty="token", advantage_estimator="drgrpo")


def test_mini_batch_sizes():
    config = RLOOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2, num_generations=4,
                        num_mini_batches=3, num_iterations=2, save_steps=6)
    # one mini-batch = one optimizer step = 16 completions; a rollout = 3 of them, spent twice
    assert (config.completions_per_step, config.prompts_per_step) == (16, 4)
    assert (config.completions_per_rollout, config.prompts_per_rollout, config.steps_per_rollout) == (48, 12, 6)


def test_the_algorithms_choices_are_declared_once():
    from rloo import config_checks
    from rloo.algo import advantages, choices, kl, loss, off_policy

    # The checks and the math modules read the same tuples (identity, not equal copies).
    assert config_checks.algo is choices  # the checks read algo/choices.py's tuples by module
    assert advantages.ADVANTAGE_ESTIMATORS is choices.ADVANTAGE_ESTIMATORS
    assert kl.KL_PENALTIES is choices.KL_PENALTIES and kl.KL_ESTIMATORS is choices.KL_ESTIMATORS
    assert loss.LOSS_AGG_MODES is choices.LOSS_AGG_MODES
    assert off_policy.IMPORTANCE_SAMPLING_LEVELS is choices.IMPORTANCE_SAMPLING_LEVELS
    assert off_policy.SAMPLER_CORRECTION_MODES is choices.SAMPLER_CORRECTION_MODES
