"""Every field of TRL 1.16's RLOOConfig has an answer in rloo's RLOOConfig: honoured, mapped, or refused by name.

The field list and defaults below were read from trl 1.16.0 (`dataclasses.fields(trl.RLOOConfig)`), so the
test does not need trl installed. When trl is importable the test also checks against the installed version.
"""

import dataclasses

import pytest
from transformers.trainer_pt_utils import AcceleratorConfig

from rloo import ConfigError, RLOOConfig
from rloo.compat.config_fields import TRL_FIELDS

TRL_1_16_DEFAULTS = {
    'output_dir': None,
    'per_device_train_batch_size': 8,
    'num_train_epochs': 3.0,
    'max_steps': -1,
    'learning_rate': 1e-06,
    'lr_scheduler_type': 'linear',
    'lr_scheduler_kwargs': None,
    'warmup_steps': 0,
    'optim': 'adamw_torch_fused',
    'optim_args': None,
    'weight_decay': 0.0,
    'adam_beta1': 0.9,
    'adam_beta2': 0.999,
    'adam_epsilon': 1e-08,
    'optim_target_modules': None,
    'gradient_accumulation_steps': 1,
    'average_tokens_across_devices': True,
    'max_grad_norm': 1.0,
    'label_smoothing_factor': 0.0,
    'bf16': None,
    'fp16': False,
    'bf16_full_eval': False,
    'fp16_full_eval': False,
    'tf32': None,
    'activation_checkpointing': None,
    'activation_checkpointing_kwargs': None,
    'gradient_checkpointing': True,
    'gradient_checkpointing_kwargs': None,
    'torch_compile': False,
    'torch_compile_backend': None,
    'torch_compile_mode': None,
    'use_liger_kernel': False,
    'liger_kernel_config': None,
    'use_cache': False,
    'neftune_noise_alpha': None,
    'torch_empty_cache_steps': None,
    'auto_find_batch_size': False,
    'logging_strategy': 'steps',
    'logging_steps': 10,
    'logging_first_step': False,
    'log_on_each_node': True,
    'logging_nan_inf_filter': True,
    'include_num_input_tokens_seen': 'no',
    'log_level': 'passive',
    'log_level_replica': 'warning',
    'disable_tqdm': None,
    'report_to': 'none',
    'run_name': None,
    'project': 'huggingface',
    'trackio_space_id': None,
    'trackio_bucket_id': None,
    'trackio_static_space_id': None,
    'eval_strategy': 'no',
    'eval_steps': None,
    'eval_delay': 0,
    'per_device_eval_batch_size': 8,
    'prediction_loss_only': False,
    'eval_on_start': False,
    'eval_do_concat_batches': True,
    'eval_use_gather_object': False,
    'eval_accumulation_steps': None,
    'include_for_metrics': [],
    'batch_eval_metrics': False,
    'save_only_model': False,
    'save_strategy': 'steps',
    'save_steps': 500,
    'save_on_each_node': False,
    'save_total_limit': None,
    'enable_jit_checkpoint': False,
    'push_to_hub': False,
    'hub_token': None,
    'hub_private_repo': None,
    'hub_model_id': None,
    'hub_strategy': 'every_save',
    'hub_always_push': False,
    'hub_revision': None,
    'load_best_model_at_end': False,
    'metric_for_best_model': None,
    'greater_is_better': None,
    'ignore_data_skip': False,
    'restore_callback_states_from_checkpoint': False,
    'full_determinism': False,
    'seed': 42,
    'data_seed': None,
    'use_cpu': False,
    'accelerator_config': None,
    'parallelism_config': None,
    'dataloader_drop_last': False,
    'dataloader_num_workers': 0,
    'dataloader_pin_memory': True,
    'dataloader_persistent_workers': False,
    'dataloader_prefetch_factor': None,
    'dataloader_multiprocessing_context': None,
    'dataloader_in_order': True,
    'remove_unused_columns': False,
    'label_names': None,
    'train_sampling_strategy': 'random',
    'length_column_name': 'length',
    'ddp_find_unused_parameters': None,
    'ddp_bucket_cap_mb': None,
    'ddp_broadcast_buffers': None,
    'ddp_static_graph': None,
    'ddp_backend': None,
    'ddp_timeout': 1800,
    'fsdp': None,
    'fsdp_config': None,
    'deepspeed': None,
    'debug': '',
    'skip_memory_metrics': True,
    'do_train': False,
    'do_eval': False,
    'do_predict': False,
    'resume_from_checkpoint': None,
    'local_rank': -1,
    'model_init_kwargs': None,
    'trust_remote_code': False,
    'router_aux_loss_coef': None,
    'disable_dropout': False,
    'num_generations': 2,
    'num_generations_eval': None,
    'max_completion_length': 512,
    'ds3_gather_for_generation': True,
    'shuffle_dataset': True,
    'pad_to_multiple_of': 'auto',
    'generation_batch_size': None,
    'steps_per_generation': None,
    'temperature': 1.0,
    'top_p': 1.0,
    'top_k': 0,
    'min_p': None,
    'generation_kwargs': None,
    'chat_template_kwargs': None,
    'repetition_penalty': 1.0,
    'cache_implementation': None,
    'use_vllm': False,
    'vllm_mode': 'colocate',
    'vllm_model_impl': 'vllm',
    'vllm_enable_sleep_mode': False,
    'vllm_structured_outputs_regex': None,
    'vllm_server_base_url': None,
    'vllm_server_host': '0.0.0.0',
    'vllm_server_port': 8000,
    'vllm_server_timeout': 240.0,
    'vllm_group_port': 51216,
    'vllm_gpu_memory_utilization': 0.3,
    'vllm_max_model_length': None,
    'vllm_tensor_parallel_size': 1,
    'beta': 0.05,
    'num_iterations': 1,
    'epsilon': 0.2,
    'epsilon_high': None,
    'reward_weights': None,
    'normalize_advantages': False,
    'reward_clip_range': None,
    'mask_truncated_completions': False,
    'sync_ref_model': False,
    'ref_model_mixup_alpha': 0.6,
    'ref_model_sync_steps': 512,
    'log_completions': False,
    'log_multimodal': True,
    'num_completions_to_print': None,
    'log_unique_prompts': False,
    'use_transformers_continuous_batching': False,
    'transformers_continuous_batching_config': None,
    'use_transformers_paged': False,
}

OWN_FIELDS = {f.name for f in dataclasses.fields(RLOOConfig)}


def trl_fields() -> dict:
    try:
        import trl
    except ImportError:
        return TRL_1_16_DEFAULTS
    fields = {}
    for f in dataclasses.fields(trl.RLOOConfig):
        if f.init:
            fields[f.name] = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    return fields


def test_every_trl_field_has_an_answer():
    missing = [name for name in trl_fields() if name not in OWN_FIELDS and name not in TRL_FIELDS]
    assert missing == []


@pytest.mark.parametrize("name", sorted(TRL_1_16_DEFAULTS))
def test_trl_default_value_is_accepted(name):
    """A script passing TRL's default of any field gets a config, never an error."""
    config = RLOOConfig(**{name: TRL_1_16_DEFAULTS[name]})
    if name == "accelerator_config":  # TRL (transformers) reads None back as a default AcceleratorConfig
        assert config.accelerator_config == AcceleratorConfig()
    elif name not in OWN_FIELDS:
        assert getattr(config, name) == TRL_1_16_DEFAULTS[name]


def _other_value(default):
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 3
    if isinstance(default, str):
        return default + "_other"
    if isinstance(default, list):
        return ["x"]
    return "something"


# Our own fields with a None default take typed values (validated in config.py); the rest get a changed value.
CHANGEABLE = sorted(n for n, d in TRL_1_16_DEFAULTS.items() if not (n in OWN_FIELDS and d is None))


@pytest.mark.parametrize("name", CHANGEABLE)
def test_other_value_is_honoured_or_refused_by_name(name):
    """Any other value either builds a config or raises ConfigError naming the field: never a raw TypeError."""
    try:
        RLOOConfig(**{name: _other_value(TRL_1_16_DEFAULTS[name])})
    except ConfigError as error:
        assert name in str(error)


@pytest.mark.parametrize("kwargs, expected", [
    ({"steps_per_generation": 4, "gradient_accumulation_steps": 2}, {"num_mini_batches": 2}),
    ({"generation_batch_size": 16, "per_device_train_batch_size": 8}, {"num_mini_batches": 2}),
    ({"optim": "adamw_torch_fused"}, {"optim": "adamw_torch"}),
    ({"eval_strategy": "steps", "logging_steps": 5}, {"eval_steps": 5}),
    ({"eval_strategy": "steps", "eval_steps": 7}, {"eval_steps": 7}),
    ({"save_strategy": "no"}, {"save_steps": 0}),
    ({"report_to": ["wandb", "tensorboard"]}, {"report_to": ["wandb", "tensorboard"]}),
    ({"report_to": []}, {"report_to": "none"}),
    ({"generation_kwargs": {"top_k": 5, "max_new_tokens": 12}}, {"top_k": 5, "max_completion_length": 12}),
    ({"train_sampling_strategy": "sequential"}, {"shuffle_dataset": False}),
    ({"output_dir": None}, {"output_dir": "outputs/rloo"}),
    ({"bf16": None}, {"bf16": None}),  # auto, as in TRL: bf16 where CUDA supports it
    ({"normalize_reward": True}, {"normalize_rewards": True}),
    ({"token_level_kl": True}, {"kl_penalty": "token"}),
    ({"stop_token_id": 7}, {"stop_token_ids": [7]}),
])
def test_mapped_fields(kwargs, expected):
    config = RLOOConfig(**kwargs)
    assert {k: getattr(config, k) for k in expected} == expected


@pytest.mark.parametrize("kwargs, words", [
    ({"use_vllm": True}, ["sampler='vllm'", "vLLM"]),
    ({"vllm_model_impl": "transformers"}, ["vllm_model_impl", "vLLM"]),
    ({"min_p": 1.5}, ["min_p"]),
    ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, ["steps_per_generation", "num_mini_batches"]),
    ({"steps_per_generation": 4, "gradient_accumulation_steps": 3},
     ["steps_per_generation=3 or 6", "gradient_accumulation_steps in (1, 2, 4)", "never mixes two generations"]),
    ({"eval_strategy": "epoch"}, ["eval_strategy", "eval_steps"]),
    ({"deepspeed": "ds.json"}, ["deepspeed", "accelerate launch"]),
    ({"generation_kwargs": {"do_sample": False}}, ["do_sample", "identical"]),
    ({"generation_kwargs": {"eos_token_id": 3}}, ["eos_token_id", "stop_token_ids"]),
    ({"report_to": ["wandb", "neptune"]}, ["report_to", "neptune"]),
    ({"learnin_rate": 1e-5}, ["learnin_rate", "learning_rate"]),
    ({"generation_batch_size": 16, "steps_per_generation": 2}, ["generation_batch_size", "steps_per_generation"]),
    ({"save_strategy": "no", "save_steps": 10}, ["save_strategy", "save_steps"]),
])
def test_refusals_name_field_and_fix(kwargs, words):
    with pytest.raises(ConfigError) as error:
        RLOOConfig(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_kept_trl_values_are_readable_and_settable():
    config = RLOOConfig(push_to_hub=True, hub_model_id="me/model", model_init_kwargs={"dtype": "float32"})
    assert (config.push_to_hub, config.hub_model_id, config.model_init_kwargs) == (True, "me/model", {"dtype": "float32"})
    assert config.eval_strategy == "no" and config.resume_from_checkpoint is None  # TRL defaults
    config.model_init_kwargs = {"dtype": "bfloat16"}  # TRL's script assigns it after parsing
    assert config.model_init_kwargs == {"dtype": "bfloat16"}
    with pytest.raises(AttributeError):
        config.not_a_field  # noqa: B018


def test_migration_doc_names_every_field():
    from pathlib import Path

    from rloo.cli.parser import TRLScriptFlags as TRLScriptArguments

    doc = (Path(__file__).resolve().parents[2] / "docs" / "trl_migration.md").read_text()
    names = set(TRL_1_16_DEFAULTS) | set(TRL_FIELDS) | {f.name for f in dataclasses.fields(TRLScriptArguments)}
    assert sorted(n for n in names if f"`{n}`" not in doc and f"`--{n}`" not in doc) == []


def test_cosine_with_min_lr_takes_lr_scheduler_kwargs(tmp_path, make_model, tokenizer, digit_dataset):
    from conftest import digit_fraction
    from rloo import RLOOTrainer

    with pytest.raises(ConfigError, match="lr_scheduler_kwargs"):
        RLOOConfig(lr_scheduler_type="cosine_with_min_lr")
    args = RLOOConfig(output_dir=str(tmp_path), lr_scheduler_type="cosine_with_min_lr", learning_rate=1e-3,
                      lr_scheduler_kwargs={"min_lr_rate": 0.1}, max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=2, save_steps=0, logging_steps=1)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(1e-4)  # the floor at the end of the cosine


def test_model_init_kwargs_are_resolved_for_from_pretrained(tmp_path, make_model, tokenizer, digit_dataset):
    import torch

    from conftest import digit_fraction
    from rloo import RLOOTrainer
    from rloo.model_loading import given_init_kwargs as model_init_kwargs

    args = RLOOConfig(model_init_kwargs={"torch_dtype": "bfloat16", "revision": "main"}, trust_remote_code=True)
    assert model_init_kwargs(args, model_is_loaded=False) == {"dtype": torch.bfloat16, "revision": "main",
                                                              "trust_remote_code": True}
    with pytest.raises(ConfigError, match="loaded model"):
        model_init_kwargs(args, model_is_loaded=True)
    with pytest.raises(ConfigError, match="not a torch dtype"):
        model_init_kwargs(RLOOConfig(model_init_kwargs={"torch_dtype": "bf16"}), model_is_loaded=False)
    with pytest.raises(ConfigError, match=r"model_init_kwargs\['dtype'\]"):  # refused at construction
        RLOOConfig(model_init_kwargs={"dtype": "bf16"})
    model_dir = tmp_path / "model"
    make_model().save_pretrained(model_dir)
    args = RLOOConfig(output_dir=str(tmp_path / "run"), model_init_kwargs={"dtype": "bfloat16"}, max_steps=1,
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=2, save_steps=0)
    trainer = RLOOTrainer(str(model_dir), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert next(trainer.model.parameters()).dtype == torch.bfloat16


def test_the_trl_named_config_adds_no_field_and_serialises_like_the_core_one(tmp_path):
    """rloo.RLOOConfig is rloo.config.RLOOConfig plus TRL's names: the same fields, the same to_dict() at the
    defaults (its default AcceleratorConfig, TRL's form, writes as None: `rloo report` shows no change), and the
    Hub token never written."""
    import rloo.config

    assert dataclasses.fields(RLOOConfig) == dataclasses.fields(rloo.config.RLOOConfig)
    assert RLOOConfig(output_dir=str(tmp_path)).to_dict() == rloo.config.RLOOConfig(output_dir=str(tmp_path)).to_dict()
    config = RLOOConfig(output_dir=str(tmp_path), hub_token="hf_secret", accelerator_config={"even_batches": False})
    assert config.to_dict()["hub_token"] == "<HUB_TOKEN>" and "hf_secret" not in repr(config)
    assert config.to_dict()["accelerator_config"] == {"even_batches": False}
